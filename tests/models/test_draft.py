"""How the draft's weights are stored (models/draft.py's resolve_draft_quant): an explicit form is
kept; `auto` is int8 on a CPU for the widths where it pays, measured once per machine; the form as
doctor and the loading step name it."""

import pytest
import torch

from specchat.models.draft import DraftQuant, describe, resolve_draft_quant
from specchat.quant import widths
from specchat.quant.widths import INT8_ROWS


@pytest.mark.parametrize("kind", ["none", "int8", "int4", "nf4"])
def test_an_explicit_draft_quant_is_kept(kind):
    assert resolve_draft_quant(kind, torch.device("cpu"), torch.bfloat16) == DraftQuant(kind)


@pytest.mark.parametrize("rows, expected", [(0, DraftQuant("none")), (4, DraftQuant("int8", 4)),
                                            (INT8_ROWS[-1], DraftQuant("int8"))])
def test_auto_draft_quant_is_int8_on_a_cpu_for_the_widths_where_it_pays(monkeypatch, tmp_path, rows, expected):
    monkeypatch.setenv("SPECCHAT_PROBE_DIR", str(tmp_path))  # a machine that has measured nothing yet
    monkeypatch.setitem(widths.MEASURES, "int8 rows", lambda dtype: rows)
    assert resolve_draft_quant("auto", torch.device("cpu"), torch.bfloat16) == expected
    assert resolve_draft_quant("auto", torch.device("cuda"), torch.bfloat16) == DraftQuant("none")


def test_auto_draft_quant_is_measured_once_per_machine(monkeypatch, tmp_path):
    """Measured at every startup, the crossover flipped between runs (quant/widths.py): the
    second startup keeps the first's choice, whatever a new measurement would say."""
    monkeypatch.setenv("SPECCHAT_PROBE_DIR", str(tmp_path))
    measurements = iter([32, INT8_ROWS[-1]])
    monkeypatch.setitem(widths.MEASURES, "int8 rows", lambda dtype: next(measurements))
    first = resolve_draft_quant("auto", torch.device("cpu"), torch.bfloat16)
    assert first == DraftQuant("int8", 32)
    assert resolve_draft_quant("auto", torch.device("cpu"), torch.bfloat16) == first
    assert next(measurements) == INT8_ROWS[-1]  # the second was never measured


@pytest.mark.parametrize(("quant", "vocab_size", "form", "loading"), [
    (DraftQuant("none"), None, "none", "full weights, whole vocabulary"),
    (DraftQuant("dense"), 0, "dense", "4-bit weights expanded, whole vocabulary"),  # 0: every token
    (DraftQuant("int8", 32), 4096, "int8 up to 32 rows", "int8 weights up to 32 rows, 4096-token head"),
    (DraftQuant("int4", host_embedding=True), 32768, "int4, its input embedding on the host",
     "int4 weights, its input embedding on the host, 32768-token head"),
])
def test_the_drafts_form_is_named_in_words(quant, vocab_size, form, loading):
    assert str(quant) == form and describe(quant, vocab_size) == loading
