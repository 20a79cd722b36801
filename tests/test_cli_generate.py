"""`specchat generate`'s two outputs agree: the text streamed to stdout is the `--json` record's
`text`, and that text is what the record's `token_ids` decode to."""

import json

from test_cli import run_cli, tiny_dirs  # noqa: F401  (tiny_dirs: model directories)
from transformers import AutoTokenizer


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
