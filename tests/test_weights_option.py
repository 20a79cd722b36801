"""--weights: which form of the target a run loads (its stored 4-bit weights, packed, or their
dense conversion), decided before anything loads, and carried to every place that loads a target."""

import pytest

import specchat.loader as loader
from specchat.engine_options import EngineOptions
from specchat.errors import SpecchatError
from specchat.models.registry import DEFAULT_TARGET
from specchat.plan import quantized_weights, resolve_weights
from specchat.runtime import validate


class Recorded(Exception):
    """Stops a load once the call under test has been seen."""


@pytest.mark.parametrize("weights,dtype,packed", [("auto", "bfloat16", True), ("auto", "float32", False),
                                                  ("quantized", "float32", True), ("dense", "bfloat16", False)])
def test_the_embedded_target_is_packed_as_weights_and_dtype_say(weights, dtype, packed):
    resolved = resolve_weights(EngineOptions(target=DEFAULT_TARGET, weights=weights, dtype=dtype))
    assert resolved.weights == ("quantized" if packed else "dense") and quantized_weights(resolved) is packed


def test_a_directory_target_has_no_stored_4bit_form(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    assert resolve_weights(EngineOptions(target=str(tmp_path))).weights == "dense"  # auto: dense
    with pytest.raises(SpecchatError, match="--weights quantized runs a target from the 4-bit weights it stores"):
        validate(EngineOptions(target=str(tmp_path), weights="quantized"))


@pytest.mark.parametrize("weights,packed", [("auto", True), ("dense", False)])
def test_ray_actors_are_told_the_form(monkeypatch, weights, packed):
    seen = {}

    def record(target, dtype, workers, address, reporter, weights):
        seen["weights"] = weights
        raise Recorded

    monkeypatch.setattr(loader, "build_ray_workers", record)
    options = EngineOptions(target=DEFAULT_TARGET, engine="dsi", weights=weights, ray_address="auto", draft_quant="none")
    with pytest.raises(Recorded):
        loader.load_models(options, progress=False)  # --weights decided once, then carried to the actors
    assert seen == {"weights": "quantized" if packed else "dense"}


def test_an_undecided_weights_choice_is_never_read():
    with pytest.raises(ValueError, match="decided once"):
        quantized_weights(EngineOptions(weights="auto"))
