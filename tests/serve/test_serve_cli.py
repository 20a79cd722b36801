"""`specchat serve` as a user runs it: tiny local models with a chat template, a free 127.0.0.1
port, the URL printed once loaded, one log line per request, and Ctrl+C stopping it cleanly."""

import os
from pathlib import Path

import pytest
from helpers.cli import assert_one_line_error, run_cli, save_tiny_model
from helpers.serve_process import serving
import torch
from torch.testing import assert_close
from transformers import AutoModelForCausalLM, AutoTokenizer

CORPUS = ["hello world", "def add(x, y): return x + y", "for item in items: print(item)"] * 20
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}<eos>{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")


def save_chat_model(directory: Path, seed: int) -> Path:
    save_tiny_model(directory, CORPUS, seed)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(directory)
    return directory


def last_row(directory: Path, text: str) -> torch.Tensor:
    """`--pooling last`'s vector, from transformers: the final-norm row of the text's last token, at unit length."""
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    with torch.inference_mode():
        row = model.model(torch.tensor([AutoTokenizer.from_pretrained(directory).encode(text)])).last_hidden_state[0, -1]
    return row / row.norm()


@pytest.fixture(scope="module")
def chat_dirs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("chat-models")
    return save_chat_model(root / "target", seed=0), save_chat_model(root / "draft", seed=1)


def test_serve_loads_prints_the_url_serves_and_stops_on_ctrl_c(chat_dirs, tmp_path):
    target, draft = chat_dirs
    with serving(tmp_path / "serve.log", "--target", str(target), "--draft", str(draft), "--dtype", "float32",
                 "--budget", "4", "--temperature", "0", "--pooling", "last",
                 env={**os.environ, "SPECCHAT_API_KEY": "k"}) as server:
        # --slots auto: the tiny pair's four conversations' caches fit beside its layers
        assert server.line.startswith(f"serving {target} (specexec, 4 slots) at http://127.0.0.1:")
        assert server.line.rstrip().endswith("Ctrl+C stops")
        reply = server.client(api_key="k").chat.completions.create(
            model=str(target), messages=[{"role": "user", "content": "hello"}], max_tokens=8)
        assert reply.usage.completion_tokens >= 1 and reply.choices[0].finish_reason in ("stop", "length")
        served = server.client(api_key="k").embeddings.create(model=str(target), input=CORPUS[1]).data[0].embedding
    # float32 rounding: the served path and transformers' forward differed by 7.5e-9 at most (AMD EPYC, 2026-12-02)
    assert_close(torch.tensor(served), last_row(target, CORPUS[1]), rtol=0, atol=1.5e-8)
    err = server.log.read_text()
    assert server.stopped_cleanly(), err
    assert "POST /v1/chat/completions 200 tokens" in err and "POST /v1/embeddings 200" in err
    assert "hello" not in err  # prompts are logged only with --log-prompts


@pytest.mark.parametrize(("args", "fragment"), [(["--port", "99999"], "--port must be between 0 and 65535"),
                                                (["--slots", "0"], "--slots must be between 1 and 256 (got 0)"),
                                                (["--slots", "many"], "--slots takes a number of conversations or "
                                                 "'auto' (got 'many')"),
                                                (["--temperature", "9"], "--temperature"),
                                                (["--top-k", "-2"], "--top-k must be between -1"),
                                                (["--min-p", "2"], "--min-p must be between 0 and 1"),
                                                (["--typical-p", "0"], "--typical-p must be in (0, 1]"),
                                                (["--xtc-threshold", "-1"], "--xtc-threshold must be between 0 and 1"),
                                                (["--repeat-penalty", "0"], "--repeat-penalty must be in (0, 100]"),
                                                (["--seed", "-1"], "--seed must be >= 0"),
                                                (["--pooling", "max"], "--pooling must be one of mean, last"),
                                                (["--engine", "magic"], "unknown engine 'magic'")])
def test_serve_bad_options_are_one_line(monkeypatch, capsys, args, fragment):
    code, _, err = run_cli(monkeypatch, capsys, "serve", *args)
    assert_one_line_error(code, err, fragment)



def test_serve_hands_its_sampling_options_on_as_what_requests_leave_out(monkeypatch, capsys):
    from specchat.serve import command
    from specchat.serve.schema import Defaults
    handed = []
    monkeypatch.setattr(command, "run_server", lambda options, serving, defaults: handed.append(defaults))
    code, _, _ = run_cli(monkeypatch, capsys, "serve", "--temperature", "0.3", "--top-k", "40", "--min-p", "0.05",
                         "--typical-p", "0.95", "--repeat-penalty", "1.1", "--repeat-last-n", "32",
                         "--presence-penalty", "0.5", "--frequency-penalty", "0.25", "--mirostat", "2",
                         "--mirostat-tau", "4", "--top-n-sigma", "1.5", "--xtc-probability", "0.5", "--xtc-threshold",
                         "0.2", "--dry-multiplier", "0.8", "--dry-penalty-last-n", "256", "--dynatemp-range", "0.5",
                         "--dynatemp-exponent", "1.5")
    assert code == 0 and handed == [Defaults(temperature=0.3, top_p=0.9, seed=None, top_k=40, min_p=0.05,
                                             typical_p=0.95, top_n_sigma=1.5, xtc_probability=0.5, xtc_threshold=0.2,
                                             dynatemp_range=0.5, dynatemp_exponent=1.5, mirostat=2, mirostat_tau=4.0,
                                             repeat_penalty=1.1,
                                             repeat_last_n=32, presence_penalty=0.5, frequency_penalty=0.25,
                                             dry_multiplier=0.8, dry_penalty_last_n=256)]


def test_serve_plans_room_for_the_kv_caches_of_the_slots_it_asks(monkeypatch):
    """The plan counts a KV cache for each slot (--slots N), or chooses how many (auto: None)."""
    from specchat.engine_options import EngineOptions
    from specchat.serve import command
    from specchat.serve.schema import Defaults

    class Loaded(Exception):
        pass

    asked = []

    def load_models(options, conversations):
        asked.append(conversations)
        raise Loaded

    monkeypatch.setattr(command, "load_models", load_models)
    for slots in (None, 2):
        with pytest.raises(Loaded):
            command.run_server(EngineOptions(), command.Serving("127.0.0.1", 0, None, 16, slots, False), Defaults())
    assert asked == [None, 2]


def test_serve_builds_an_engine_for_each_conversation_the_plan_kept_room_for():
    from types import SimpleNamespace

    from specchat.serve.command import slot_count

    assert slot_count(SimpleNamespace(memory=SimpleNamespace(conversations=3)), None) == 3
    assert slot_count(SimpleNamespace(memory=None), 2) == 2  # dsi's Ray actors: what was asked
    assert slot_count(SimpleNamespace(memory=None), None) == 4
