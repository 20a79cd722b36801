"""scripts/trace_summary.py on a written trace: its spans' table and busiest kernels; a missing
file and a trace without specchat's spans each answer in one line with a non-zero exit."""

import gzip
import json

from helpers.scripts import load_script


def write(path, events: list[dict]) -> None:
    with gzip.open(path, "wt") as file:
        json.dump({"traceEvents": events}, file)


def run(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr("sys.argv", ["trace_summary.py", *args])
    code = load_script("trace_summary").main()
    out, err = capsys.readouterr()
    return code, out, err


def test_the_summary_lists_each_span_and_the_busiest_kernels(monkeypatch, capsys, tmp_path):
    path = tmp_path / "reply.json.gz"
    write(path, [{"ph": "X", "name": "ProfilerStep#3", "cat": "user_annotation", "ts": 0, "dur": 900},
                 {"ph": "X", "name": "specchat.pass", "cat": "user_annotation", "ts": 0, "dur": 900},
                 {"ph": "X", "name": "int4_gemm", "cat": "kernel", "ts": 100, "dur": 600, "args": {}}])
    code, out, _ = run(monkeypatch, capsys, str(path))
    assert code == 0
    assert "| 3 | pass | 0.9 | 0.6 | 0.0 | 0.00 | 0.3 |" in out
    assert "| int4_gemm | 1 | 0.60 |" in out


def test_a_missing_file_or_one_without_spans_is_one_line(monkeypatch, capsys, tmp_path):
    code, _, err = run(monkeypatch, capsys, str(tmp_path / "none.json"))
    assert code == 2 and err.strip() == f"no trace at {tmp_path / 'none.json'}"
    path = tmp_path / "plain.json.gz"
    write(path, [{"ph": "X", "name": "ProfilerStep#3", "cat": "user_annotation", "ts": 0, "dur": 900}])
    code, _, err = run(monkeypatch, capsys, str(path))
    assert code == 1 and len(err.strip().splitlines()) == 1 and "holds no specchat spans" in err
