"""`specchat serve` as a user runs it: tiny local models with a chat template, a free 127.0.0.1
port, the URL printed once loaded, one log line per request, and Ctrl+C stopping it cleanly."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import openai
import pytest
from helpers.cli import assert_one_line_error, run_cli, save_tiny_model
from transformers import AutoTokenizer

CORPUS = ["hello world", "def add(x, y): return x + y", "for item in items: print(item)"] * 20
TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}<eos>{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
STOP_S = 60


def save_chat_model(directory: Path, seed: int) -> Path:
    save_tiny_model(directory, CORPUS, seed)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def chat_dirs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("chat-models")
    return save_chat_model(root / "target", seed=0), save_chat_model(root / "draft", seed=1)


def test_serve_loads_prints_the_url_serves_and_stops_on_ctrl_c(chat_dirs, tmp_path):
    target, draft = chat_dirs
    log = tmp_path / "serve.log"  # a file, not a pipe: loading bars must never block on a full pipe
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "specchat", "serve", "--target", str(target), "--draft", str(draft), "--port", "0",
             "--dtype", "float32", "--budget", "4", "--temperature", "0"],
            stdout=subprocess.PIPE, stderr=stderr, text=True, env={**os.environ, "SPECCHAT_API_KEY": "k"},
        )
    try:
        line = process.stdout.readline()
        assert line.startswith(f"serving {target} (specexec) at http://127.0.0.1:") and line.rstrip().endswith("Ctrl+C stops")
        url = line.split(" at ")[1].split(" ;")[0]
        chat = openai.OpenAI(base_url=url, api_key="k", max_retries=0, timeout=60)
        reply = chat.chat.completions.create(model=str(target), messages=[{"role": "user", "content": "hello"}],
                                             max_tokens=8)
        assert reply.usage.completion_tokens >= 1 and reply.choices[0].finish_reason in ("stop", "length")
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=STOP_S)
    err = log.read_text()
    assert process.returncode == 0, err
    assert "POST /v1/chat/completions 200 tokens" in err and "Traceback" not in err
    assert "hello" not in err  # prompts are logged only with --log-prompts


@pytest.mark.parametrize(("args", "fragment"), [(["--port", "99999"], "--port must be between 0 and 65535"),
                                                (["--slots", "0"], "--slots must be >= 1"),
                                                (["--temperature", "9"], "--temperature"),
                                                (["--engine", "magic"], "unknown engine 'magic'")])
def test_serve_bad_options_are_one_line(monkeypatch, capsys, args, fragment):
    code, _, err = run_cli(monkeypatch, capsys, "serve", *args)
    assert_one_line_error(code, err, fragment)

