"""The embedded pair behind `specchat serve`: at temperature 0 the server's text is exactly what
`specchat generate --temperature 0` prints for the same message, streamed or not. Float32 and a
fixed budget: in bf16, or with `--budget auto` (which sizes trees from measured times), two runs
score different trees, and bf16 tree passes round differently (see docs/exactness.md)."""

import signal
import subprocess
import sys

import openai
import pytest

PROMPT = "Write a Python function that checks whether a number is prime."
NEW_TOKENS = 16
DECODING = ("--temperature", "0", "--dtype", "float32", "--budget", "16")
STOP_S = 120


def specchat(*args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "specchat", *args], text=True, **popen)


@pytest.mark.real
def test_served_text_equals_generate_at_temperature_0(tmp_path):
    generate = subprocess.run([sys.executable, "-m", "specchat", "generate", PROMPT, *DECODING,
                               "--max-new-tokens", str(NEW_TOKENS)], capture_output=True, text=True, check=True)
    expected = generate.stdout.removesuffix("\n")  # generate ends its reply with a newline
    log = tmp_path / "serve.log"  # a file, not a pipe: loading bars must never block on a full pipe
    with log.open("w") as err:
        server = specchat("serve", "--port", "0", *DECODING, stdout=subprocess.PIPE, stderr=err)
    try:
        line = server.stdout.readline()
        assert " at http://127.0.0.1:" in line, line
        chat = openai.OpenAI(base_url=line.split(" at ")[1].split(" ;")[0], api_key="unused", max_retries=0,
                             timeout=600)
        model = chat.models.list().data[0].id
        messages = [{"role": "user", "content": PROMPT}]
        whole = chat.chat.completions.create(model=model, messages=messages, max_tokens=NEW_TOKENS)
        streamed = chat.chat.completions.create(model=model, messages=messages, max_tokens=NEW_TOKENS, stream=True)
        streamed_text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    finally:
        server.send_signal(signal.SIGINT)
        server.communicate(timeout=STOP_S)
    assert whole.choices[0].message.content == streamed_text == expected
    assert whole.usage.completion_tokens == NEW_TOKENS or whole.choices[0].finish_reason == "stop"
    assert server.returncode == 0 and "Traceback" not in log.read_text()
