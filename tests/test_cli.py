"""The command line: JSON contract, streaming, and one-line errors with exit code 2."""

import json
import os
import sqlite3
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
import torch
from helpers.cli import CORPUS, assert_one_line_error, run_cli, save_tiny_model, tiny_dirs
from transformers import AutoTokenizer, Qwen2ForCausalLM

from specchat.tui.store import ConversationStore, default_path


def test_generate_json_contract(monkeypatch, capsys, tiny_dirs):
    target, draft, _ = tiny_dirs
    code, out, _ = run_cli(
        monkeypatch, capsys, "generate", "hello world", "--target", str(target), "--draft", str(draft),
        "--raw", "--json", "--max-new-tokens", "12", "--budget", "4", "--dtype", "float32",
        "--temperature", "0",
    )
    assert code == 0
    record = json.loads(out)
    assert set(record) == {"text", "token_ids", "iterations", "summary", "plan", "interrupted"}
    assert record["interrupted"] is False
    # the tiny target's 2 layers all on the device (no offload); the draft as stored or int8 (CPU auto)
    plan = record["plan"]
    assert {key: plan[key] for key in ("resident_layers", "ram_layers", "disk_layers", "pass_bytes")} == \
        {"resident_layers": 2, "ram_layers": 0, "disk_layers": 0, "pass_bytes": 0}
    assert plan["draft_quant"] in ("none", "int8") and plan["context"] >= 12 and isinstance(plan["notes"], list)
    summary = record["summary"]
    assert summary["new_tokens"] == len(record["token_ids"]) == sum(len(e["token_ids"]) for e in record["iterations"])
    assert summary["iterations"] == len(record["iterations"])
    assert summary["gen_rate"] == pytest.approx(summary["new_tokens"] / summary["iterations"])
    assert {"tokens_per_s", "draft_s", "target_s"} <= set(summary)
    prompt_pass, event = record["iterations"][:2]
    assert {"token_ids", "accepted", "tree_size", "depth", "draft_s", "target_s", "transfer_s", "transfer_bytes"} <= set(event)
    assert prompt_pass["tree_size"] == 0 and len(prompt_pass["token_ids"]) == 1 and 0 < event["tree_size"] <= 4


def test_generate_engines_agree_and_stream(monkeypatch, capsys, tiny_dirs):
    target, draft, _ = tiny_dirs
    common = ["hello world", "--target", str(target), "--raw", "--max-new-tokens", "10", "--seed", "3", "--dtype", "float32"]
    outputs = {}
    for engine in ("autoregressive", "specexec"):
        code, out, err = run_cli(monkeypatch, capsys, "generate", *common, "--draft", str(draft), "--engine", engine, "--json")
        assert code == 0
        outputs[engine] = json.loads(out)["token_ids"]
    assert outputs["autoregressive"] == outputs["specexec"]
    code, out, err = run_cli(monkeypatch, capsys, "generate", *common, "--draft", str(draft))
    assert code == 0 and "tokens" in err and "gen rate" in err


def test_generate_top_k_1_samples_the_greedy_tokens_in_both_engines(monkeypatch, capsys, tiny_dirs):
    """--top-k reaches the sampler: keeping one token, a hot seeded reply is the greedy one."""
    target, draft, _ = tiny_dirs
    common = ["hello world", "--target", str(target), "--draft", str(draft), "--raw", "--max-new-tokens", "12",
              "--dtype", "float32", "--json"]
    replies = {}
    for name, engine, sampling in [("greedy", "autoregressive", ["--temperature", "0"]),
                                   ("hot", "autoregressive", ["--temperature", "2", "--seed", "5"]),
                                   ("cut", "autoregressive", ["--temperature", "2", "--seed", "5", "--top-k", "1"]),
                                   ("cut tree", "specexec", ["--temperature", "2", "--seed", "5", "--top-k", "1",
                                                             "--min-p", "0.5"])]:
        code, out, _ = run_cli(monkeypatch, capsys, "generate", *common, "--engine", engine, *sampling)
        assert code == 0
        replies[name] = json.loads(out)["token_ids"]
    assert replies["hot"] != replies["greedy"]  # else the cut is not what made them equal
    assert replies["cut"] == replies["cut tree"] == replies["greedy"]


def test_generate_typical_p_mirostat_and_llamas_cuts_change_the_reply_and_both_engines_keep_them(monkeypatch, capsys,
                                                                                             tiny_dirs):
    target, draft, _ = tiny_dirs
    common = ["hello world", "--target", str(target), "--draft", str(draft), "--raw", "--max-new-tokens", "12",
              "--dtype", "float32", "--json", "--temperature", "2", "--seed", "5"]
    replies = {}
    mirostat = ["--mirostat", "1", "--mirostat-tau", "2", "--mirostat-eta", "0.3"]
    llamas = ["--top-n-sigma", "1", "--xtc-probability", "0.7", "--xtc-threshold", "0.02", "--dynatemp-range", "1.5"]
    for name, engine, cut in [("hot", "autoregressive", []), ("typical", "autoregressive", ["--typical-p", "0.05"]),
                              ("typical tree", "specexec", ["--typical-p", "0.05"]),
                              ("mirostat", "autoregressive", mirostat), ("mirostat tree", "specexec", mirostat),
                              ("llamas", "autoregressive", llamas), ("llamas tree", "specexec", llamas)]:
        code, out, _ = run_cli(monkeypatch, capsys, "generate", *common, "--engine", engine, *cut)
        assert code == 0
        replies[name] = json.loads(out)["token_ids"]
    assert replies["typical"] == replies["typical tree"] != replies["hot"]
    assert replies["mirostat"] == replies["mirostat tree"] != replies["hot"]
    assert replies["llamas"] == replies["llamas tree"] != replies["hot"]


def test_generate_penalties_change_the_reply_and_both_engines_keep_them(monkeypatch, capsys, tiny_dirs):
    target, draft, _ = tiny_dirs
    common = ["hello world", "--target", str(target), "--draft", str(draft), "--raw", "--max-new-tokens", "16",
              "--dtype", "float32", "--json", "--temperature", "0"]
    replies = {}
    for name, engine, penalty in [("plain", "autoregressive", []),
                                  ("penalized", "autoregressive", ["--repeat-penalty", "1.8", "--repeat-last-n", "8"]),
                                  ("tree", "specexec", ["--repeat-penalty", "1.8", "--repeat-last-n", "8"]),
                                  ("counted", "autoregressive", ["--presence-penalty", "1.5", "--frequency-penalty",
                                                                 "1", "--repeat-last-n", "8"]),
                                  ("counted tree", "specexec", ["--presence-penalty", "1.5", "--frequency-penalty",
                                                                "1", "--repeat-last-n", "8"]),
                                  ("dry", "autoregressive", ["--dry-multiplier", "3", "--dry-allowed-length", "1"]),
                                  ("dry tree", "specexec", ["--dry-multiplier", "3", "--dry-allowed-length", "1"])]:
        code, out, _ = run_cli(monkeypatch, capsys, "generate", *common, "--engine", engine, *penalty)
        assert code == 0
        replies[name] = json.loads(out)["token_ids"]
    assert replies["penalized"] == replies["tree"] != replies["plain"]
    assert replies["counted"] == replies["counted tree"] != replies["plain"]
    assert replies["dry"] == replies["dry tree"] != replies["plain"]


def test_run_hands_the_cuts_and_the_repeat_penalty_to_the_chat(monkeypatch, capsys):
    from specchat.tui import app, runtime_backend
    handed = []

    def loader(options, settings):
        handed.append(settings)
        return lambda: None  # never called: the app does not run

    monkeypatch.setattr(runtime_backend, "runtime_loader", loader)
    monkeypatch.setattr(app.SpecchatApp, "run", lambda self: None)
    code, _, _ = run_cli(monkeypatch, capsys, "run", "--top-k", "40", "--min-p", "0.05", "--repeat-penalty", "1.1",
                         "--repeat-last-n", "128", "--presence-penalty", "0.2", "--frequency-penalty", "0.1",
                         "--typical-p", "0.9", "--temperature", "0.3", "--top-p", "0.7", "--seed", "4",
                         "--mirostat", "2", "--mirostat-tau", "3", "--mirostat-eta", "0.2")
    settings = handed[0]
    assert code == 0 and (settings.top_k, settings.min_p, settings.repeat_penalty, settings.repeat_last_n) == (
        40, 0.05, 1.1, 128)
    assert (settings.typical_p, settings.temperature, settings.top_p, settings.seed) == (0.9, 0.3, 0.7, 4)
    assert (settings.mirostat, settings.mirostat_tau, settings.mirostat_eta) == (2, 3.0, 0.2)
    assert (settings.presence_penalty, settings.frequency_penalty) == (0.2, 0.1)


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--budget", "-5"], "--budget"),
        (["--budget", "abc"], "--budget"),
        (["--temperature", "7"], "--temperature"),
        (["--top-p", "0"], "--top-p"),
        (["--top-p", "1.5"], "--top-p"),
        (["--top-k", "-2"], "--top-k must be between -1 and 2147483647 (got -2)"),
        (["--top-k", "2.5"], "--top-k"),
        (["--min-p", "1.5"], "--min-p must be between 0 and 1 (got 1.5)"),
        (["--min-p", "nan"], "--min-p must be between 0 and 1 (got nan)"),
        (["--typical-p", "0"], "--typical-p must be in (0, 1] (got 0.0)"),
        (["--typical-p", "1.5"], "--typical-p must be in (0, 1] (got 1.5)"),
        (["--top-n-sigma", "-2"], "--top-n-sigma must be between -1 and 100 (got -2.0)"),
        (["--dry-base", "0.5"], "--dry-base must be between 1 and 100 (got 0.5)"),
        (["--xtc-probability", "1.5"], "--xtc-probability must be between 0 and 1 (got 1.5)"),
        (["--dynatemp-range", "-0.5"], "--dynatemp-range must be between 0 and 5 (got -0.5)"),
        (["--dynatemp-exponent", "-1"], "--dynatemp-exponent must be between 0 and 100 (got -1.0)"),
        (["--mirostat", "3"], "--mirostat must be between 0 and 2 (got 3)"),
        (["--mirostat-tau", "-1"], "--mirostat-tau must be between 0 and 100 (got -1.0)"),
        (["--mirostat-eta", "20"], "--mirostat-eta must be between 0 and 10 (got 20.0)"),
        (["--repeat-penalty", "0"], "--repeat-penalty must be in (0, 100] (got 0.0)"),
        (["--repeat-last-n", "-2"], "--repeat-last-n must be between -1"),
        (["--presence-penalty", "2.5"], "--presence-penalty must be between -2 and 2 (got 2.5)"),
        (["--frequency-penalty", "-3"], "--frequency-penalty must be between -2 and 2 (got -3.0)"),
        (["--max-new-tokens", "0"], "--max-new-tokens"),
        (["--max-depth", "0"], "--max-depth"),
        (["--seed", "-1"], "--seed"),
        (["--engine", "magic"], "engine"),
        (["--dtype", "int3"], "dtype"),
        (["--target", "no-such-model"], "unknown model 'no-such-model'"),
        (["--draft", "/nonexistent/model.gguf"], "not found"),
        (["--no-such-flag"], "no-such-flag"),
    ],
)
def test_bad_input_is_one_line_exit_2(monkeypatch, capsys, args, fragment):
    code, _, err = run_cli(monkeypatch, capsys, "generate", "hi", *args)
    assert_one_line_error(code, err, fragment)


def test_empty_prompt_is_one_line_exit_2(monkeypatch, capsys, tiny_dirs):
    target, draft, _ = tiny_dirs
    code, _, err = run_cli(monkeypatch, capsys, "generate", "", "--raw", "--target", str(target), "--draft", str(draft))
    assert_one_line_error(code, err, "empty")


@pytest.fixture(scope="module")
def short_context(tmp_path_factory) -> Path:
    """A tiny target whose context is 24 tokens."""
    return save_tiny_model(tmp_path_factory.mktemp("short") / "target", CORPUS, seed=0, context=24)


def test_a_prompt_longer_than_the_context_is_one_line_exit_2(monkeypatch, capsys, short_context):
    code, _, err = run_cli(monkeypatch, capsys, "generate", "hello world " * 20, "--raw", "--target",
                           str(short_context), "--engine", "autoregressive")
    assert_one_line_error(code, err, "leaves no room for a reply in the 24-token context")


def test_a_reply_is_capped_where_the_context_ends_and_says_so(monkeypatch, capsys, short_context):
    code, out, err = run_cli(monkeypatch, capsys, "generate", "hello world", "--raw", "--json", "--target",
                             str(short_context), "--engine", "autoregressive", "--max-new-tokens", "100")
    record = json.loads(out)
    prompt = len(AutoTokenizer.from_pretrained(short_context)("hello world")["input_ids"])
    assert code == 0 and len(record["token_ids"]) <= 24 - prompt
    assert f"notice: at most {24 - prompt} new tokens: the {prompt}-token prompt fills" in err
    assert record["summary"]["prefill_tokens"] == prompt and record["summary"]["prefill_s"] > 0


def test_tokenizer_mismatch_is_one_line_exit_2(monkeypatch, capsys, tiny_dirs):
    target, _, other = tiny_dirs
    code, _, err = run_cli(monkeypatch, capsys, "generate", "hi", "--target", str(target), "--draft", str(other))
    assert_one_line_error(code, err, "tokenizers differ")


def test_offline_uncached_hub_id_is_one_line_exit_2(tmp_path):
    """In a fresh process, as a user would run it (the hub reads its env at import)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    result = subprocess.run(
        [sys.executable, "-m", "specchat", "generate", "hi", "--target", "someone/not-cached-model"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert_one_line_error(result.returncode, result.stderr, "someone/not-cached-model", "qwen2.5-coder-1.5b")


def test_models_lists_aliases(monkeypatch, capsys):
    code, out, _ = run_cli(monkeypatch, capsys, "models")
    assert code == 0
    for alias in ("llama-2-70b-gptq", "llama-2-7b", "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "mistral-7b"):
        assert alias in out
    assert "TheBloke/Llama-2-70B-Chat-GPTQ" in out
    assert out.splitlines()[0].split() == ["ALIAS", "SOURCE", "ROLE", "LOCAL", "WHERE"]


@pytest.mark.parametrize("args", [["--version"], []], ids=["version", "bare"])
def test_version_and_a_bare_command_answer_at_once(monkeypatch, capsys, args):
    """--version names specchat's version and its libraries' as installed; `specchat` alone shows the help."""
    code, out, _ = run_cli(monkeypatch, capsys, *args)
    assert code == 0
    if args:
        assert out.strip() == (f"specchat {version('specchat')} (torch {version('torch')}, "
                               f"transformers {version('transformers')})")
    else:
        assert out.startswith("Usage: specchat") and "--version" in out and "generate" in out


@pytest.mark.real
def test_generate_real_pair_json(monkeypatch, capsys):
    code, out, _ = run_cli(
        monkeypatch, capsys, "generate", "Write a Python function that adds two numbers.",
        "--json", "--max-new-tokens", "16", "--budget", "16",
    )
    assert code == 0
    record = json.loads(out)
    assert record["summary"]["new_tokens"] == 16 and record["text"].strip()
    assert record["summary"]["gen_rate"] > 1.0


def test_generate_draft_nf4_without_cuda_is_one_line_exit_2(monkeypatch, capsys):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    code, _, err = run_cli(monkeypatch, capsys, "generate", "hi", "--draft-quant", "nf4")
    assert_one_line_error(code, err, "--draft-quant nf4 needs a CUDA device")


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--budget", "big"], "--budget takes a tree size or 'auto' (got 'big')"),
        (["--budget", "auto", "--engine", "sd"], "--budget auto is for the specexec engine, not sd"),
        (["--draft-vocab", "-1"], "--draft-vocab must be >= 0"),
    ],
)
def test_generate_budget_and_draft_bad_input_is_one_line_exit_2(monkeypatch, capsys, args, fragment):
    code, _, err = run_cli(monkeypatch, capsys, "generate", "hi", *args)
    assert_one_line_error(code, err, fragment)


def test_generate_offload_dir_that_is_a_file_is_one_line_exit_2(monkeypatch, capsys, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, _, err = run_cli(monkeypatch, capsys, "generate", "hi", "--offload", "disk", "--offload-dir", str(afile))
    assert_one_line_error(code, err, "is a file, not a directory")


@pytest.mark.real
def test_generate_offloaded_json_reports_streaming(monkeypatch, capsys, offload_dir):
    code, out, _ = run_cli(
        monkeypatch, capsys, "generate", "Say hello.", "--json", "--max-new-tokens", "4", "--budget", "8",
        "--offload", "disk", "--resident-layers", "20", "--offload-dir", str(offload_dir),
    )
    assert code == 0
    record = json.loads(out)
    assert all(i["transfer_bytes"] > 0 and i["transfer_s"] > 0 for i in record["iterations"])
    summary = record["summary"]
    assert summary["transfer_bytes"] > 0 and summary["transfer_gbps"] > 0 and summary["stall_s"] >= 0
    # the 8 streamed layers fit in the ring, so a whole pass is staged and the link never idles
    assert summary["link_idle"] == 0.0 and all(i["link_idle"] == 0.0 for i in record["iterations"])
    plan = record["plan"]  # the 1.5B target's 28 layers: 20 resident, 8 streamed from the layer file
    assert (plan["resident_layers"], plan["ram_layers"], plan["disk_layers"]) == (20, 0, 8)
    # every pass streams the 8 layers; the ring may have staged the next pass's first ones inside
    # the previous event (the bytes count where they moved), and a reply's last prefetch is nobody's
    passes = len(record["iterations"])
    assert (passes - 1) * plan["pass_bytes"] < summary["transfer_bytes"] <= passes * plan["pass_bytes"]


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--temperature", "9"], "--temperature"),
        (["--top-k", "-3"], "--top-k"),
        (["--min-p", "-0.1"], "--min-p"),
        (["--typical-p", "-0.1"], "--typical-p"),
        (["--repeat-penalty", "-1"], "--repeat-penalty"),
        (["--offload", "ssd"], "unknown offload tier 'ssd'"),
        (["--ram-budget", "0"], "--ram-budget must be in (0, 1e+06] (got 0.0)"),
        (["--vram-budget", "-2"], "--vram-budget must be in (0, 1e+06] (got -2.0)"),
        (["--offload", "none", "--ram-budget", "4"], "--ram-budget caps where offloaded layers go"),
        (["--offload", "disk", "--resident-layers", "-1"], "--resident-layers must be >= 0"),
        (["--offload", "none", "--resident-layers", "3"], "--resident-layers counts the layers an offloaded target"),
        (["--system", "\udcffbrief"], "--system is not UTF-8 text"),  # an argument's bytes that are not UTF-8
        (["--draft-quant", "int3"], "unknown draft quantization 'int3'"),
        (["--target", "no-such-model"], "unknown model"),
        (["--budget", "0"], "--budget"),
    ],
)
def test_run_bad_input_is_one_line_exit_2(monkeypatch, capsys, args, fragment):
    code, _, err = run_cli(monkeypatch, capsys, "run", *args)
    assert_one_line_error(code, err, fragment)


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--engine", "dsi", "--lookahead", "0"], "--lookahead must be between 1 and 64 (got 0)"),
        (["--engine", "dsi", "--lookahead", "65"], "--lookahead must be between 1 and 64 (got 65)"),
        (["--engine", "dsi", "--workers", "tpu"], "--workers: 'tpu' is not a device"),
        (["--engine", "dsi", "--workers", "cuda:0"], "--workers: cuda:0 is not available on this machine"),
        (["--engine", "dsi", "--workers", "cpu,,cpu"], "--workers must be a comma list"),
        (["--engine", "dsi", "--offload", "disk"], "--engine dsi keeps a target on every worker: use --offload none"),
        (["--engine", "specexec", "--workers", "cpu,cpu"], "--workers and --ray-address are for --engine dsi"),
        (["--engine", "specexec", "--ray-address", "auto"], "--workers and --ray-address are for --engine dsi"),
        (["--workers", "cpu,cpu"], "--workers and --ray-address are for --engine dsi"),  # specexec by default
    ],
)
def test_generate_dsi_bad_input_is_one_line_exit_2(monkeypatch, capsys, args, fragment):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    code, _, err = run_cli(monkeypatch, capsys, "generate", "hi", *args)
    assert_one_line_error(code, err, fragment)


def test_generate_dsi_matches_autoregressive(monkeypatch, capsys, tiny_dirs):
    target, draft, _ = tiny_dirs
    common = ["hello world", "--target", str(target), "--raw", "--json", "--max-new-tokens", "12",
              "--temperature", "0", "--dtype", "float32"]
    code, out, _ = run_cli(monkeypatch, capsys, "generate", *common, "--engine", "autoregressive")
    assert code == 0
    reference = json.loads(out)["token_ids"]
    assert len(reference) == 12
    for drafter in (draft, target):  # a draft that mostly disagrees, and one that always agrees
        code, out, _ = run_cli(
            monkeypatch, capsys, "generate", *common, "--draft", str(drafter), "--engine", "dsi",
            "--workers", "cpu,cpu", "--lookahead", "3",
        )
        assert code == 0
        record = json.loads(out)
        assert record["token_ids"] == reference
        iterations = record["iterations"]
        assert sum(len(i["token_ids"]) for i in iterations) == 12
        assert {"jobs_submitted", "jobs_preempted", "jobs_in_flight", "notice"} <= set(iterations[0])
        assert iterations[0]["jobs_submitted"] >= 1  # the first event's job was sent before it
        assert sum(i["jobs_submitted"] for i in iterations) >= len(iterations)  # one job per event at least
        assert all(i["jobs_preempted"] >= 0 and i["jobs_in_flight"] >= 0 for i in iterations)
        assert iterations[-1]["finished"] and iterations[-1]["jobs_in_flight"] == 0
        for i in iterations:
            assert i["tree_size"] == i["depth"] <= 3 * (2 + 1)  # a job's drafts: within the window
            assert i["accepted"] == len(i["token_ids"]) - 1 <= i["tree_size"]


def test_run_with_a_history_of_a_newer_specchat_is_one_line_exit_2(monkeypatch, capsys):
    """The file is someone's history, valid for another version: refused, never moved aside."""
    path = default_path()
    ConversationStore(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE schema_version SET version = 99")
    db.commit()
    db.close()
    code, _, err = run_cli(monkeypatch, capsys, "run")
    assert_one_line_error(code, err, "schema version 99")
    assert list(path.parent.glob("*.corrupt-*")) == []


def pickled_copy(directory: Path, destination: Path) -> Path:
    """`directory`'s model with its weights saved as a pickle (pytorch_model.bin) instead."""
    model = Qwen2ForCausalLM.from_pretrained(directory)
    destination.mkdir()
    torch.save(model.state_dict(), destination / "pytorch_model.bin")
    model.config.save_pretrained(destination)
    AutoTokenizer.from_pretrained(directory).save_pretrained(destination)
    assert not list(destination.glob("*.safetensors")) and (destination / "pytorch_model.bin").exists()
    return destination


def test_pickled_weights_are_refused_unless_allowed(monkeypatch, capsys, tiny_dirs, tmp_path):
    target, draft, _ = tiny_dirs
    pickled = pickled_copy(target, tmp_path / "pickled")
    common = ["hello world", "--raw", "--max-new-tokens", "6", "--temperature", "0", "--dtype", "float32",
              "--draft", str(draft), "--json"]
    code, _, err = run_cli(monkeypatch, capsys, "generate", *common, "--target", str(pickled))
    assert_one_line_error(code, err, "holds pickled weights (pytorch_model.bin)", "--allow-pickle")
    code, out, _ = run_cli(monkeypatch, capsys, "generate", *common, "--target", str(pickled), "--allow-pickle")
    assert code == 0
    _, safe_out, _ = run_cli(monkeypatch, capsys, "generate", *common, "--target", str(target))
    assert json.loads(out)["token_ids"] == json.loads(safe_out)["token_ids"]


def test_a_vram_budget_without_a_gpu_is_one_line_not_ignored(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU's view, on a CUDA host too
    code, _, err = run_cli(monkeypatch, capsys, "run", "--vram-budget", "4")
    assert_one_line_error(code, err, "--vram-budget caps GPU memory, and torch sees no GPU here: use --ram-budget")


# The command line as a fresh process runs it, telling on exit whether torch or transformers loaded.
EXIT_REPORT = ("import sys\nfrom specchat.cli import main\nsys.argv = ['specchat', *sys.argv[1:]]\ntry:\n    main()\n"
               "except SystemExit as end:\n"
               "    print('loaded', 'torch' in sys.modules, 'transformers' in sys.modules, end.code, file=sys.stderr)")


@pytest.mark.parametrize(("args", "code"), [(["--help"], 0), (["--version"], 0), (["generate", "--help"], 0), (["models"], 0),
                                            (["generate", "hi", "--engine", "magic"], 2),
                                            (["serve", "--budget", "0"], 2), (["run", "--dtype", "half"], 2)])
def test_help_models_and_a_mistyped_value_answer_before_torch_loads(args, code):
    """--help, `models` and a bad value need none of the heavy modules (~4 s to import here)."""
    result = subprocess.run([sys.executable, "-c", EXIT_REPORT, *args], capture_output=True, text=True, timeout=120)
    assert result.stderr.splitlines()[-1] == f"loaded False False {code}", result.stderr
