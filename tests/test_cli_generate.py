"""`specchat generate`'s two outputs agree: the text streamed to stdout is the `--json` record's
`text`, and that text is what the record's `token_ids` decode to; its prompt may be piped in
(`-`) and follow a system prompt (`--system`)."""

import io
import json
import sys
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from helpers.cli import (  # noqa: F401  (tiny_dirs: model directories)
    CORPUS,
    assert_one_line_error,
    run_cli,
    tiny_dirs,
    train_tokenizer,
)
from helpers.engines import GREEDY
from helpers.serve_helpers import CharTokenizer
from transformers import AutoTokenizer

from specchat.cli_generate import run_generation
from specchat.errors import SpecchatError
from specchat.runtime import encode_prompt
from specchat.trace_summary import read_trace, summarize_trace
from specchat.tracing import SKIPPED_ITERATIONS, TRACED_ITERATIONS
from specchat.tui.fake import fixed_event


def test_streamed_text_is_the_json_text_and_decodes_from_its_token_ids(monkeypatch, capsys, tiny_dirs):  # noqa: F811
    target, draft, _ = tiny_dirs
    common = ["generate", "hello world", "--target", str(target), "--draft", str(draft), "--raw", "--budget", "4",
              "--max-new-tokens", "16", "--seed", "5", "--temperature", "0.9", "--dtype", "float32"]
    code, streamed, err = run_cli(monkeypatch, capsys, *common)
    assert code == 0, err
    code, out, err = run_cli(monkeypatch, capsys, *common, "--json")
    assert code == 0, err
    record = json.loads(out)
    assert 0 < len(record["token_ids"]) <= 16 and record["text"].strip()
    assert streamed == record["text"] + "\n"  # the stream ends its reply with one newline
    tokenizer = AutoTokenizer.from_pretrained(target)
    assert tokenizer.decode(record["token_ids"], skip_special_tokens=True) == record["text"]


@dataclass
class ScriptedEngine:
    """Emits the given token ids, one iteration each, whatever the prompt."""

    chunks: list[list[int]]
    name: str = "specexec"

    def generate(self, prompt_ids, max_new_tokens, sampling):
        for number, chunk in enumerate(self.chunks):
            yield fixed_event(chunk, number == len(self.chunks) - 1, tree_size=1, depth=1)


def test_a_character_cut_by_the_limit_is_printed_as_the_json_text_holds_it(capsys):
    """A reply that ends inside a multi-byte character (the limit cut "é" after its first byte):
    the stream holds that byte back while it may still complete, then prints what the reply's ids
    decode to at its end, as the --json text does."""
    tokenizer = train_tokenizer(CORPUS)
    # "é" is C3 A9 in UTF-8; byte-level BPE writes a byte from A1 to FF (but AD) as that code point
    first_byte = tokenizer.convert_tokens_to_ids(chr(0xC3))
    chunks = [tokenizer.encode("hello", add_special_tokens=False), [first_byte]]
    models = SimpleNamespace(tokenizer=tokenizer, context=256, memory=None)  # no plan: an empty plan record
    outputs = []
    for as_json in (False, True):
        run_generation(models, ScriptedEngine(chunks), "hi", True, 16, GREEDY, as_json)
        outputs.append(capsys.readouterr().out)
    streamed, record = outputs[0], json.loads(outputs[1])
    assert record["text"] == tokenizer.decode(chunks[0] + chunks[1]) == "hello\ufffd"
    assert streamed == record["text"] + "\n"


@dataclass
class RecordingEngine(ScriptedEngine):
    """Emits its chunks and keeps the sampling each reply was given."""

    given: list = None

    def generate(self, prompt_ids, max_new_tokens, sampling):
        self.given.append(sampling)
        yield from super().generate(prompt_ids, max_new_tokens, sampling)


def test_the_code_a_prompt_quotes_is_the_replys_prediction(capsys):
    """SpecExec scores the quoted code as a chain once the reply reaches it (decoding/prediction.py);
    a prompt quoting none gives none."""
    tokenizer = train_tokenizer(CORPUS)
    models = SimpleNamespace(tokenizer=tokenizer, context=256, memory=None)
    engine = RecordingEngine([tokenizer.encode("ok", add_special_tokens=False)], given=[])
    for prompt in ("Rename x:\n```python\nx = 1\n```", "hello world"):
        run_generation(models, engine, prompt, True, 16, GREEDY, True)
    quoted, plain = engine.given
    assert quoted.prediction.tokens == tuple(tokenizer.encode("```python\nx = 1\n```", add_special_tokens=False))
    assert plain.prediction is None


@dataclass
class InterruptedEngine(ScriptedEngine):
    """Emits its chunks, then the user presses Ctrl+C while the next iteration runs."""

    def generate(self, prompt_ids, max_new_tokens, sampling):
        yield from super().generate(prompt_ids, max_new_tokens, sampling)
        raise KeyboardInterrupt


@pytest.mark.parametrize("as_json", [False, True], ids=["streamed", "json"])
def test_ctrl_c_keeps_the_text_so_far_and_its_figures_then_exits_130(monkeypatch, capsys, as_json):
    """Nothing generated is lost to Ctrl+C: the stream ends its line and says it was interrupted,
    --json prints the record of what was generated (interrupted: true); the exit code is 130."""
    tokenizer = CharTokenizer()
    chunks = [tokenizer.encode("hel", add_special_tokens=False), tokenizer.encode("lo", add_special_tokens=False)]
    models = SimpleNamespace(tokenizer=tokenizer, context=4096, memory=None, close=lambda: None,
                             engine=lambda name, settings: InterruptedEngine(chunks))
    monkeypatch.setattr("specchat.loader.load_models", lambda options: models)
    code, out, err = run_cli(monkeypatch, capsys, "generate", "hi", *(["--json"] if as_json else []))
    assert code == 130
    if as_json:
        record = json.loads(out)
        assert (record["text"], record["interrupted"], record["summary"]["new_tokens"]) == ("hello", True, 5)
    else:
        assert out == "hello\n" and err.startswith("[interrupted: 5 tokens, 2 iterations")


@pytest.mark.parametrize(("name", "rules"), [("g.lark", 'start: "hello world"\n'),
                                             ("g.gbnf", 'root ::= "hello" " " world\nworld ::= "world"\n')])
def test_a_reply_keeps_to_the_lark_or_gbnf_grammar_in_a_file(monkeypatch, capsys, tmp_path, tiny_dirs,  # noqa: F811
                                                            name, rules):
    """The tiny random target would write anything; under `--grammar` its only reply is the one
    the grammar allows, at temperature 0.9 (the grammar masks the target before sampling); a
    grammar in llama.cpp's GBNF is taken as one in Lark."""
    target, draft, _ = tiny_dirs
    grammar = tmp_path / name
    grammar.write_text(rules)
    code, out, err = run_cli(monkeypatch, capsys, "generate", "hi", "--target", str(target), "--draft", str(draft),
                             "--raw", "--budget", "4", "--max-new-tokens", "24", "--temperature", "0.9",
                             "--dtype", "float32", "--grammar", str(grammar))
    assert code == 0, err
    assert out == "hello world\n"


def test_a_grammar_that_does_not_compile_is_one_line(monkeypatch, capsys, tmp_path, tiny_dirs):  # noqa: F811
    target, draft, _ = tiny_dirs
    grammar = tmp_path / "g.lark"
    grammar.write_text("start: nowhere\n")
    code, _, err = run_cli(monkeypatch, capsys, "generate", "hi", "--target", str(target), "--draft", str(draft),
                           "--raw", "--dtype", "float32", "--grammar", str(grammar))
    assert_one_line_error(code, err, "the grammar cannot be compiled")


def test_a_schema_and_a_grammar_together_are_one_line(monkeypatch, capsys, tmp_path):
    code, _, err = run_cli(monkeypatch, capsys, "generate", "hi", "--json-schema", str(tmp_path / "s.json"),
                           "--grammar", str(tmp_path / "g.lark"))
    assert_one_line_error(code, err, "give --json-schema or --grammar, not both")


def test_a_dash_reads_the_prompt_from_standard_input(monkeypatch, capsys, tiny_dirs):  # noqa: F811
    target, draft, _ = tiny_dirs
    args = ("--target", str(target), "--draft", str(draft), "--raw", "--json", "--max-new-tokens", "8",
            "--temperature", "0", "--dtype", "float32", "--budget", "4")
    code, given, _ = run_cli(monkeypatch, capsys, "generate", "def add(x, y):", *args)
    monkeypatch.setattr(sys, "stdin", io.StringIO("def add(x, y):"))
    piped_code, piped, _ = run_cli(monkeypatch, capsys, "generate", "-", *args)
    assert code == piped_code == 0 and json.loads(piped)["token_ids"] == json.loads(given)["token_ids"]


@pytest.mark.parametrize(("stdin", "fragment"), [(io.StringIO("  \n"), "the prompt is empty"),
                                                 (io.TextIOWrapper(io.BytesIO(b"\xff\xfe"), encoding="utf-8"),
                                                  "standard input is not text in utf-8")])
def test_piped_input_that_is_no_prompt_is_one_line(monkeypatch, capsys, stdin, fragment):
    monkeypatch.setattr(sys, "stdin", stdin)
    code, _, err = run_cli(monkeypatch, capsys, "generate", "-")
    assert_one_line_error(code, err, fragment)


@pytest.mark.parametrize("args", [("hi\udcff",), ("hi", "--system", "\udcffbrief")])
def test_bytes_that_are_not_utf8_in_an_argument_are_one_line(monkeypatch, capsys, args):
    """Python keeps an argument's (or a C locale's stdin's) undecodable bytes as lone surrogates,
    which the tokenizer refused with a TypeError and a traceback."""
    code, _, err = run_cli(monkeypatch, capsys, "generate", *args)
    assert_one_line_error(code, err, "is not UTF-8 text")


def test_a_system_prompt_in_a_raw_prompt_is_one_line(monkeypatch, capsys):
    code, _, err = run_cli(monkeypatch, capsys, "generate", "hi", "--raw", "--system", "Be brief.")
    assert_one_line_error(code, err, "--system goes into the chat template, which --raw leaves out")


def test_a_system_prompt_goes_before_the_message_in_the_template():
    tokenizer = CharTokenizer()
    assert encode_prompt(tokenizer, "hi", raw=False, system="Be brief.") == \
        tokenizer.encode("<system>Be brief.</><user>hi</><assistant>")
    assert encode_prompt(tokenizer, "hi", raw=False) == tokenizer.encode("<user>hi</><assistant>")
    tokenizer.chat_template = None
    with pytest.raises(SpecchatError, match="--system goes into the chat template, which this prompt does not use"):
        encode_prompt(tokenizer, "hi", raw=False, system="Be brief.")


def test_trace_writes_the_iterations_past_the_first_three_each_with_its_spans(monkeypatch, capsys, tmp_path,
                                                                               tiny_dirs):  # noqa: F811
    target, draft, _ = tiny_dirs
    trace = tmp_path / "reply.json.gz"
    common = ["generate", "hello world", "--target", str(target), "--draft", str(draft), "--raw", "--budget", "4",
              "--temperature", "0", "--dtype", "float32", "--trace", str(trace)]
    code, out, err = run_cli(monkeypatch, capsys, *common, "--max-new-tokens", "12", "--engine", "specexec", "--json")
    assert code == 0, err
    assert len(json.loads(out)["iterations"]) > SKIPPED_ITERATIONS + TRACED_ITERATIONS
    spans = [(f.step, f.span) for f in summarize_trace(read_trace(trace))]
    assert spans == [(step, span) for step in range(3, 6) for span in ("draft", "pass", "verify")]
    code, _, err = run_cli(monkeypatch, capsys, *common, "--max-new-tokens", "2")
    assert code == 0 and "--trace records from the reply's iteration 4: this one ran 2" in err


def test_a_trace_file_that_cannot_be_written_is_refused_before_anything_loads(monkeypatch, capsys, tmp_path,
                                                                             tiny_dirs):  # noqa: F811
    target, draft, _ = tiny_dirs
    monkeypatch.setattr("specchat.loader.load_models", lambda options: pytest.fail("loaded"))
    code, _, err = run_cli(monkeypatch, capsys, "generate", "hi", "--target", str(target), "--draft", str(draft),
                           "--trace", str(tmp_path / "missing" / "reply.json"))
    assert_one_line_error(code, err, "--trace", "does not exist")
