"""The `specchat` command line. User errors print one line and exit with code 2."""

import sys
from dataclasses import asdict, replace
from pathlib import Path

import typer

from specchat.bench.datasets import DATASETS
from specchat.bench.results import RESULTS_FILE
from specchat.cli_options import (ContextOpt, DraftOpt, DtypeOpt, OffloadOpt, PenaltyOptions, RamBudgetOpt,
                                  SamplingOptions, TargetOpt, TopPOpt, VramBudgetOpt, WeightsOpt, check_seed,
                                  checked_sampling, parse_slots, with_engine_options, with_penalty_options,
                                  with_sampling_options)
from specchat.engine_options import ENGINES, EngineOptions, list_models, table_lines
from specchat.errors import SpecchatError
from specchat.limits import (DEFAULT_DTYPE, DEFAULT_MAX_DEPTH, DEFAULT_POOLING, DEFAULT_SEED, DEFAULT_TEMPERATURE,
                             DEFAULT_TOP_P, MAX_TOKENS, check_text)
from specchat.paths import output_path
from specchat.schema_file import read_schema_file, read_user_file
from specchat.simulate.app import simulate_app
from specchat.version import version_line

# torch, transformers and the engines load inside the commands that run models (~4 s here), so
# --help, `models` and a mistyped option answer at once.

BENCH_ENGINES = [name for name in ENGINES if name != "dsi"]  # bench's default: dsi's budget is a lookahead

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def print_version(value: bool) -> None:
    """--version's callback: the line, then exit before any command runs."""
    if value:
        print(version_line())
        raise typer.Exit()


@app.callback()
def root(version: bool = typer.Option(False, "--version", callback=print_version, is_eager=True,
                                      help="Print specchat's version and its libraries' (torch, transformers), "
                                      "then exit.")) -> None:
    """Chat with large language models on consumer hardware, fast, by speculative execution."""


@app.command()
@with_engine_options()
@with_penalty_options
@with_sampling_options
def generate(
    prompt: str = typer.Argument(..., help="The user message (or raw text with --raw); - reads it from standard "
                                 "input."),
    system: str | None = typer.Option(None, help="A system prompt before the message (the chat template's)."),
    sampling: SamplingOptions = SamplingOptions(),
    seed: int = typer.Option(DEFAULT_SEED,
                             help="Sampling seed: specexec and autoregressive emit the same tokens for the same seed."),
    max_new_tokens: int = typer.Option(256, help="Stop after this many new tokens."),
    raw: bool = typer.Option(False, "--raw", help="Do not apply the chat template."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of streaming text."),
    json_schema: Path | None = typer.Option(None, "--json-schema", help="Reply with a JSON document valid under "
                                            "the JSON schema in this file (specexec and autoregressive)."),
    grammar: Path | None = typer.Option(None, "--grammar", help="Reply in the language of the grammar in this file: "
                                        "GBNF (llama.cpp's) or Lark (llguidance's dialect; specexec and "
                                        "autoregressive)."),
    trace: Path | None = typer.Option(None, "--trace", help="Record iterations 4-6 of the reply (host and "
                                      "device) in this Chrome trace file (.json or .json.gz), for Perfetto or "
                                      "scripts/trace_summary.py."),
    *,
    penalties: PenaltyOptions,
    options: EngineOptions,
) -> None:
    """Generate one reply, streamed to stdout."""
    params = sampling.params(seed)
    MAX_TOKENS.check("--max-new-tokens", max_new_tokens)
    prompt = read_stdin() if prompt == "-" else prompt
    check_text("the prompt", prompt)
    check_text("--system", system or "")
    if not prompt.strip():
        raise SpecchatError("the prompt is empty: give some text")
    if system is not None and raw:
        raise SpecchatError("--system goes into the chat template, which --raw leaves out: drop one")
    if json_schema is not None and grammar is not None:
        raise SpecchatError("give --json-schema or --grammar, not both")
    schema = read_schema_file(json_schema, "--json-schema") if json_schema is not None else None
    rules = read_user_file(grammar, "--grammar") if grammar is not None else None
    if trace is not None:
        from specchat.tracing import check_trace_path
        check_trace_path(trace)
    from specchat.cli_generate import run_generation
    from specchat.loader import load_models
    from specchat.runtime import DEFAULT_BREAKERS, live_settings_of, restart_sequences, settings_penalties

    models = load_models(options)
    try:
        if schema is not None:
            params = replace(params, guide=models.grammars().json_schema(schema).start())
        if rules is not None:
            params = replace(params, guide=models.grammars().grammar(rules).start())
        run_generation(models, models.engine(options.engine, live_settings_of(options)), prompt, raw, max_new_tokens,
                       params, as_json, system, trace, settings_penalties(
                           asdict(penalties), lambda: restart_sequences(models.tokenizer, DEFAULT_BREAKERS)))
    finally:
        models.close()


def read_stdin() -> str:
    """`generate -`: the prompt piped in, as `specchat generate - < notes.txt`."""
    try:
        return sys.stdin.read()
    except UnicodeDecodeError as error:
        raise SpecchatError(f"standard input is not text in {error.encoding}: pipe in a text file") from None


# The chat sets a tree's depth with /depth: its command line has no --max-depth.
@app.command()
@with_engine_options(engine_help=" | ".join(ENGINES) + " (/engine switches among those over the same models)",
                     leave_out=("max_depth",))
@with_penalty_options
@with_sampling_options
def run(
    sampling: SamplingOptions = SamplingOptions(),
    seed: int = typer.Option(DEFAULT_SEED, help="Sampling seed (/seed off in the chat for a fresh one per reply)."),
    resume: bool = typer.Option(False, "--continue", help="Reopen the last conversation."),
    system: str | None = typer.Option(None, help="The system prompt of new conversations (/system changes it)."),
    *,
    penalties: PenaltyOptions,
    options: EngineOptions,
) -> None:
    """Chat in a full-screen terminal app with live decoding panels."""
    check_text("--system", system or "")
    if system is not None and resume:
        raise SpecchatError("--continue reopens a conversation with its own system prompt: drop --system, or set "
                            "it with /system once the conversation is open")
    from specchat.tui.app import SpecchatApp
    from specchat.tui.runtime_backend import runtime_loader
    from specchat.tui.settings import DecodingSettings
    from specchat.tui.store import ConversationStore

    check_seed(seed)
    settings = DecodingSettings(**asdict(sampling), seed=seed, system_prompt=system or "", **asdict(penalties))
    store = ConversationStore()
    conversation = store.last_conversation_id() if resume else None
    SpecchatApp(None, store, conversation, loader=runtime_loader(options, settings)).run()


@app.command()
@with_engine_options()
@with_penalty_options
@with_sampling_options
def serve(
    host: str = typer.Option("127.0.0.1", help="Address to listen on (loopback by default)."),
    port: int = typer.Option(8000, help="Port to listen on (0: any free port)."),
    api_key: str = typer.Option(None, envvar="SPECCHAT_API_KEY", show_envvar=True,
                                help="Require the key on every route but /health: 'Authorization: Bearer KEY', or "
                                "'x-api-key: KEY' as Anthropic's clients send it."),
    max_queue: int = typer.Option(16, help="Requests that may wait for the engine; past them the server answers 429."),
    slots: str = typer.Option("auto", help="Conversations kept at once, each by an engine over the loaded models "
                              "with its own KV caches, which the memory plan counts; one request decodes at a time. "
                              "auto: 4 where their caches displace no layer and shrink nothing, else 1."),
    log_prompts: bool = typer.Option(False, "--log-prompts", help="Add each request's messages to its log line."),
    pooling: str = typer.Option(DEFAULT_POOLING, help="How an embedding (/v1/embeddings, /api/embed) pools the target's "
                                "last hidden states: mean (every token's) or last (the last token's)."),
    sampling: SamplingOptions = SamplingOptions(),
    seed: int = typer.Option(None, help="Sampling seed of requests that give none (left out: each draws its own)."),
    *,
    penalties: PenaltyOptions,
    options: EngineOptions,
) -> None:
    """Serve OpenAI's API (/v1/chat/completions, /v1/responses, /v1/completions, /v1/embeddings), Anthropic's
    (/v1/messages), llama.cpp's and Ollama's. The sampling and penalty options are what a request
    leaves out."""
    from specchat.serve.command import Serving, run_server  # starlette and uvicorn: only serve needs them
    from specchat.serve.schema import Defaults

    if seed is not None:
        check_seed(seed)
    defaults = Defaults(**asdict(sampling), seed=seed, **asdict(penalties))
    run_server(options, Serving(host, port, api_key, max_queue, parse_slots(slots), log_prompts, pooling), defaults)


@app.command()
def models() -> None:
    """List model aliases and what is available locally."""
    print("\n".join(table_lines(list_models())))


@app.command()
def doctor(
    target: TargetOpt = EngineOptions.target,
    draft: str = typer.Option(EngineOptions.draft, help="Draft model to plan beside the target ('none': no draft)."),
    context: ContextOpt = None,
    vram_gb: float = typer.Option(None, help="Plan for a described GPU machine with this much GPU memory (GB = 1e9 "
                                  "bytes; a 24 GiB card is 25.8 GB); nothing is measured."),
    ram_gb: float = typer.Option(None, help="Plan for a described machine with this much RAM (GB); alone: a CPU one."),
    disk_gbps: float = typer.Option(None, help="The described machine's disk read speed (GB/s)."),
    pcie_gbps: float = typer.Option(None, help="The described machine's pinned host-to-GPU speed (GB/s)."),
    offload_dir: Path = typer.Option(None, help="Where offloaded weights go (default: <cache>/offload)."),
    probe_gb: float = typer.Option(1.0, help="Size in GB of the probe file for the disk read bandwidth."),
    ram_budget: RamBudgetOpt = None,
    vram_budget: VramBudgetOpt = None,
    measure_again: bool = typer.Option(False, "--measure-again", help="Measure this machine's kept choices (which "
                                       "product serves which width) again now, whatever the load."),
    slots: str = typer.Option("1", help="Plan for `serve --slots N` (or auto): N conversations' KV caches kept at "
                              "once (1: as `run` and `generate` keep them)."),
) -> None:
    """Report devices, memory and bandwidths (or describe a machine), and plan a target and its
    draft on it: every byte per tier, the bytes streamed per pass and the expected speed; list the
    choices this machine keeps. Reads only the models' configs (the aliases' ship with specchat):
    works offline."""
    from specchat.doctor.command import run_doctor
    from specchat.runtime import Machine

    machine = Machine(vram_gb, ram_gb, disk_gbps, pcie_gbps)
    print(run_doctor(target, None if draft == "none" else draft, context, machine, offload_dir, probe_gb, ram_budget,
                     vram_budget, measure_again, parse_slots(slots)))


@app.command()
def bench(
    out: str = typer.Option(..., help=f"Directory of {RESULTS_FILE} and the plots; a rerun skips the rows it holds."),
    engines: str = typer.Option(",".join(BENCH_ENGINES), help=f"Comma list among: {', '.join(ENGINES)}."),
    budgets: str = typer.Option("auto,16,64,256", help="Comma list of draft tree sizes K, or auto (specexec sizes "
                                "each tree; the other engines skip it); engines with no draft run once."),
    temperature: str = typer.Option(f"{DEFAULT_TEMPERATURE:g},0", help="Comma list; 0 = greedy."),
    top_p: TopPOpt = DEFAULT_TOP_P,
    seed: int = typer.Option(DEFAULT_SEED,
                             help="Sampling seed: the same seed gives the same tokens, so the same gen rate."),
    dataset: str = typer.Option("mtbench", help=f"Prompt set: {' | '.join(DATASETS)} (first user turns)."),
    n_prompts: int = typer.Option(20, help="The first N prompts of the set."),
    max_new_tokens: int = typer.Option(64, help="New tokens per reply (fewer if the reply ends)."),
    offload: OffloadOpt = "none",
    context: ContextOpt = None,
    target: TargetOpt = EngineOptions.target,
    draft: DraftOpt = EngineOptions.draft,
    dtype: DtypeOpt = DEFAULT_DTYPE,
    weights: WeightsOpt = EngineOptions.weights,
    workers: str = typer.Option(None, help="dsi: the target workers' devices (default: two on this machine's "
                                "device); dsi takes --budgets as its lookahead."),
    compare_hf: bool = typer.Option(
        False, "--compare-hf", help="Also time transformers' assisted generation (engine hf-assisted) on the same "
        "prompts. It exposes only its tokens and wall time: its gen rate, draft / target times and tree are null.",
    ),
) -> None:
    """Sweep engines x budgets x temperatures over a prompt set: a results row per prompt, a table, plots."""
    from specchat.bench.command import check_bench, parse_budget_item, parse_list, report_bench, run_bench
    from specchat.bench.runner import Setup, plan_points
    from specchat.runtime import default_workers, pick_device

    temperatures = parse_list(temperature, "--temperature", float)
    for value in temperatures:
        checked_sampling(SamplingOptions(value, top_p))
    check_seed(seed)
    MAX_TOKENS.check("--max-new-tokens", max_new_tokens)
    names, sizes = parse_list(engines, "--engines", str), parse_list(budgets, "--budgets", parse_budget_item)
    setup = Setup(dataset=dataset, max_new_tokens=max_new_tokens, top_p=top_p, seed=seed, target=target, draft=draft,
                  dtype=dtype, weights=weights, offload=offload, max_depth=DEFAULT_MAX_DEPTH, context=context,
                  workers=workers or default_workers(pick_device()))
    out_dir = output_path("--out", out)
    check_bench(setup, names, sizes, n_prompts, compare_hf, out_dir)
    report_bench(run_bench(setup, plan_points(names, sizes, temperatures, compare_hf), n_prompts, out_dir), out_dir)


app.add_typer(simulate_app, name="simulate")


def main() -> None:
    """Entry point: run the app, turning user errors into one line and exit code 2."""
    command = typer.main.get_command(app)
    args = sys.argv[1:] or ["--help"]  # a bare `specchat` shows what it can do, as ollama's does
    try:
        code = command.main(args=args, prog_name="specchat", standalone_mode=False)
    except SpecchatError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except typer.Abort:
        print("error: aborted", file=sys.stderr)
        sys.exit(130)
    except typer.TyperException as error:  # typer's (vendored click) usage errors
        print(f"error: {error.format_message()}", file=sys.stderr)
        sys.exit(2)
    sys.exit(code if isinstance(code, int) else 0)
