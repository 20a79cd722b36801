"""The `specchat` command line. User errors print one line and exit with code 2."""

import json
import sys
from pathlib import Path
from time import perf_counter

import typer

from specchat.bench.command import check_bench, parse_list, run_bench
from specchat.bench.datasets import DATASETS
from specchat.bench.report import configurations, render_table
from specchat.bench.results import RESULTS_FILE
from specchat.bench.runner import Setup, plan_points
from specchat.decoding.events import Engine, SamplingParams
from specchat.dsi.build import default_workers
from specchat.errors import SpecchatError
from specchat.models.listing import list_models
from specchat.offload.doctor import advise, default_offload_dir, gather, render
from specchat.runtime import (ENGINES, EngineOptions, Models, encode_prompt, live_settings_of, load_models, pick_device,
                              validate)
from specchat.simulate.command import build_grid, run_dsi
from specchat.summary import Summary, event_record, summarize
from specchat.textstream import TextStream

OFFLOAD_HELP = "Where the target's decoder layers live: none (on the device), ram, or disk (streamed per pass)."
OFFLOAD_DIR_HELP = "Directory of the disk tier's layer file (default: the user cache dir)."
RESIDENT_HELP = "Decoder layers kept on the device when offloading (default: as many as free memory allows)."
DRAFT_QUANT_HELP = "none | nf4 (the draft in 4-bit through bitsandbytes; CUDA only)."
LOOKAHEAD_HELP = "dsi: drafts k per verification job."
WORKERS_HELP = "dsi: the target workers' devices, e.g. cpu,cpu or cuda:0,cuda:1 (default: two on this machine's device)."
BENCH_ENGINES = [name for name in ENGINES if name != "dsi"]  # bench's default: dsi's budget is a lookahead
RAY_HELP = "dsi: run the target workers as actors of this Ray cluster (auto or HOST:PORT; needs specchat[ray])."

app = typer.Typer(
    help="Chat with large language models on consumer hardware, fast, by speculative execution.",
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def check_sampling(temperature: float, top_p: float, seed: int, max_new_tokens: int) -> SamplingParams:
    if not 0.0 <= temperature <= 5.0:
        raise SpecchatError(f"--temperature must be between 0 and 5 (got {temperature})")
    if not 0.0 < top_p <= 1.0:
        raise SpecchatError(f"--top-p must be in (0, 1] (got {top_p})")
    if seed < 0:
        raise SpecchatError(f"--seed must be >= 0 (got {seed})")
    if not 1 <= max_new_tokens <= 32768:
        raise SpecchatError(f"--max-new-tokens must be between 1 and 32768 (got {max_new_tokens})")
    return SamplingParams(temperature=temperature, top_p=top_p, seed=seed)


@app.command()
def generate(
    prompt: str = typer.Argument(..., help="The user message (or raw text with --raw)."),
    target: str = typer.Option(EngineOptions.target, help="Target model: alias, hub id, directory or .gguf."),
    draft: str = typer.Option(EngineOptions.draft, help="Draft model: alias, hub id, directory or .gguf."),
    engine: str = typer.Option("specexec", help=" | ".join(ENGINES)),
    budget: int = typer.Option(None, help="Draft tree size K (default: suited to the device)."),
    max_depth: int = typer.Option(EngineOptions.max_depth, help="Deepest draft tree node D."),
    temperature: float = typer.Option(0.6, help="0 = greedy."),
    top_p: float = typer.Option(0.9, help="Nucleus sampling mass, as HF's top_p."),
    seed: int = typer.Option(0, help="Sampling seed: specexec and autoregressive emit the same tokens for the same seed."),
    max_new_tokens: int = typer.Option(256, help="Stop after this many new tokens."),
    dtype: str = typer.Option("bfloat16", help="float32 | bfloat16"),
    offload: str = typer.Option("none", help=OFFLOAD_HELP),
    offload_dir: str = typer.Option(None, help=OFFLOAD_DIR_HELP),
    resident_layers: int = typer.Option(None, help=RESIDENT_HELP),
    draft_quant: str = typer.Option("none", help=DRAFT_QUANT_HELP),
    lookahead: int = typer.Option(EngineOptions.lookahead, help=LOOKAHEAD_HELP),
    workers: str = typer.Option(None, help=WORKERS_HELP),
    ray_address: str = typer.Option(None, help=RAY_HELP),
    raw: bool = typer.Option(False, "--raw", help="Do not apply the chat template."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of streaming text."),
) -> None:
    """Generate one reply, streamed to stdout."""
    sampling = check_sampling(temperature, top_p, seed, max_new_tokens)
    if not prompt.strip():
        raise SpecchatError("the prompt is empty: give some text")
    options = EngineOptions(
        target=target, draft=draft, engine=engine, budget=budget, max_depth=max_depth, dtype=dtype,
        offload=offload, offload_dir=offload_dir, resident_layers=resident_layers, draft_quant=draft_quant,
        lookahead=lookahead, workers=workers, ray_address=ray_address,
    )
    models = load_models(options)
    try:
        run_generation(models, models.engine(engine, live_settings_of(options)), prompt, raw, max_new_tokens,
                       sampling, as_json)
    finally:
        models.close()


def run_generation(models: Models, engine: Engine, prompt: str, raw: bool, max_new_tokens: int,
                   sampling: SamplingParams, as_json: bool) -> None:
    prompt_ids = encode_prompt(models.tokenizer, prompt, raw)
    text = TextStream(models.tokenizer)
    events = []
    start = perf_counter()
    for event in engine.generate(prompt_ids, max_new_tokens, sampling):
        events.append(event)
        if event.notice:
            print(f"notice: {event.notice}", file=sys.stderr)
        delta = text.push(event.token_ids)
        if not as_json:
            sys.stdout.write(delta)
            sys.stdout.flush()
    summary = summarize(events, perf_counter() - start)
    if as_json:
        record = {
            "text": text.text,
            "token_ids": text.token_ids,
            "iterations": [event_record(e) for e in events],
            "summary": {**vars(summary), "transfer_gbps": summary.transfer_gbps},
        }
        print(json.dumps(record))
    else:
        sys.stdout.write(text.finish() + "\n")
        print(
            f"[{summary.new_tokens} tokens, {summary.iterations} iterations, gen rate {summary.gen_rate:.2f}, "
            f"{summary.tokens_per_s:.2f} tok/s{streaming_note(summary)}]",
            file=sys.stderr,
        )


def streaming_note(summary: Summary) -> str:
    """Weight streaming figures, when the target was offloaded."""
    if summary.transfer_bytes == 0:
        return ""
    return (f", streamed {summary.transfer_bytes / 1e9:.1f} GB at {summary.transfer_gbps:.2f} GB/s, "
            f"stalled {summary.stall_s:.1f} s")


@app.command()
def run(
    target: str = typer.Option(EngineOptions.target, help="Target model: alias, hub id, directory or .gguf."),
    draft: str = typer.Option(EngineOptions.draft, help="Draft model: alias, hub id, directory or .gguf."),
    offload: str = typer.Option("none", help=OFFLOAD_HELP),
    offload_dir: str = typer.Option(None, help=OFFLOAD_DIR_HELP),
    resident_layers: int = typer.Option(None, help=RESIDENT_HELP),
    draft_quant: str = typer.Option("none", help=DRAFT_QUANT_HELP),
    engine: str = typer.Option("specexec", help=" | ".join(ENGINES) + " (/engine switches among those over the same models)"),
    budget: int = typer.Option(None, help="Draft tree size K (default: suited to the device)."),
    lookahead: int = typer.Option(EngineOptions.lookahead, help=LOOKAHEAD_HELP),
    workers: str = typer.Option(None, help=WORKERS_HELP),
    ray_address: str = typer.Option(None, help=RAY_HELP),
    temperature: float = typer.Option(0.6, help="0 = greedy."),
    top_p: float = typer.Option(0.9, help="Nucleus sampling mass, as HF's top_p."),
    seed: int = typer.Option(0, help="Sampling seed (/seed off in the chat for a fresh one per reply)."),
    resume: bool = typer.Option(False, "--continue", help="Reopen the last conversation."),
    dtype: str = typer.Option("bfloat16", help="float32 | bfloat16"),
) -> None:
    """Chat in a full-screen terminal app with live decoding panels."""
    from specchat.tui.app import SpecchatApp
    from specchat.tui.runtime_backend import runtime_loader
    from specchat.tui.settings import DecodingSettings
    from specchat.tui.store import ConversationStore

    sampling = check_sampling(temperature, top_p, seed, 1)
    options = EngineOptions(
        target=target, draft=draft, engine=engine, budget=budget, dtype=dtype,
        offload=offload, offload_dir=offload_dir, resident_layers=resident_layers, draft_quant=draft_quant,
        lookahead=lookahead, workers=workers, ray_address=ray_address,
    )
    validate(options)
    settings = DecodingSettings(temperature=sampling.temperature, top_p=sampling.top_p, seed=sampling.seed)
    store = ConversationStore()
    conversation = store.last_conversation_id() if resume else None
    SpecchatApp(None, store, conversation, loader=runtime_loader(options, settings)).run()


@app.command()
def models() -> None:
    """List model aliases and what is available locally."""
    rows = list_models()
    width = max(len(r.alias) for r in rows)
    for r in rows:
        mark = "yes" if r.available else "no"
        print(f"{r.alias:<{width}}  {r.source:<42}  {r.role:<28}  local: {mark:<3}  {r.where}")


@app.command()
def doctor(
    offload_dir: Path = typer.Option(None, help="Where offloaded weights go (default: <cache>/offload)."),
    probe_gb: float = typer.Option(1.0, help="Size in GB of the probe file for the disk read bandwidth."),
) -> None:
    """Report devices, memory and bandwidths; recommend an offload tier and a draft budget."""
    print(f"measuring (writes, reads and deletes a {probe_gb:g} GB probe file)...", file=sys.stderr)
    facts = gather(offload_dir or default_offload_dir(), probe_gb)
    print(render(facts, advise(facts)))


@app.command()
def bench(
    out: Path = typer.Option(..., help=f"Directory of {RESULTS_FILE} and the plots; a rerun skips the rows it holds."),
    engines: str = typer.Option(",".join(BENCH_ENGINES), help=f"Comma list among: {', '.join(ENGINES)}."),
    budgets: str = typer.Option("16,64,256,1024", help="Comma list of draft tree sizes K (engines with no draft run once)."),
    temperature: str = typer.Option("0.6,0", help="Comma list; 0 = greedy."),
    top_p: float = typer.Option(0.9, help="Nucleus sampling mass, as HF's top_p."),
    seed: int = typer.Option(0, help="Sampling seed: the same seed gives the same tokens, so the same gen rate."),
    dataset: str = typer.Option("mtbench", help=f"Prompt set: {' | '.join(DATASETS)} (first user turns)."),
    n_prompts: int = typer.Option(20, help="The first N prompts of the set."),
    max_new_tokens: int = typer.Option(64, help="New tokens per reply (fewer if the reply ends)."),
    offload: str = typer.Option("none", help=OFFLOAD_HELP),
    target: str = typer.Option(EngineOptions.target, help="Target model: alias, hub id, directory or .gguf."),
    draft: str = typer.Option(EngineOptions.draft, help="Draft model: alias, hub id, directory or .gguf."),
    dtype: str = typer.Option("bfloat16", help="float32 | bfloat16"),
    workers: str = typer.Option(None, help="dsi: the target workers' devices (default: two on this machine's "
                                "device); dsi takes --budgets as its lookahead."),
    compare_hf: bool = typer.Option(
        False, "--compare-hf", help="Also time transformers' assisted generation (engine hf-assisted) on the same "
        "prompts. It exposes only its tokens and wall time: its gen rate, draft / target times and tree are null.",
    ),
) -> None:
    """Sweep engines x budgets x temperatures over a prompt set: a results row per prompt, a table, plots."""
    temperatures = parse_list(temperature, "--temperature", float)
    for value in temperatures:
        check_sampling(value, top_p, seed, max_new_tokens)
    names, sizes = parse_list(engines, "--engines", str), parse_list(budgets, "--budgets", int)
    setup = Setup(dataset=dataset, max_new_tokens=max_new_tokens, top_p=top_p, seed=seed, target=target, draft=draft,
                  dtype=dtype, offload=offload, max_depth=EngineOptions.max_depth,
                  workers=workers or default_workers(pick_device()))
    check_bench(setup, names, sizes, n_prompts, compare_hf, out)
    rows = run_bench(setup, plan_points(names, sizes, temperatures, compare_hf), n_prompts, out)
    from specchat.bench.plots import write_plots  # matplotlib takes ~0.4 s to import: only bench needs it

    print(render_table(configurations(rows)))
    for path in [out / RESULTS_FILE, *write_plots(rows, out)]:
        print(f"wrote {path}", file=sys.stderr)


simulate_app = typer.Typer(
    help="Offline simulations of speculative inference (no models): latencies in target forwards.",
    add_completion=False,
    rich_markup_mode=None,
)
app.add_typer(simulate_app, name="simulate")


@simulate_app.command("dsi")
def simulate_dsi(
    out: Path = typer.Option(..., help="Directory of the heatmaps (PNG), dsi_grid.csv and dsi_summary.md."),
    drafter_latency: str = typer.Option("0.01..1", help="LO..HI or one number in (0, 1]: target forwards per draft."),
    acceptance: str = typer.Option("0..1", help="LO..HI or one number in [0, 1]: each draft's acceptance probability."),
    lookahead: int = typer.Option(5, help="Drafts k per verification (SI's and DSI's)."),
    servers: int = typer.Option(None, help="Target servers N of DSI (default: enough that no verification waits, "
                                "max(ceil(1 / (k c_min)), 2))."),
    steps: int = typer.Option(20, help="Values per LO..HI range."),
    tokens: int = typer.Option(100, help="Tokens T generated per simulated run."),
    seeds: int = typer.Option(5, help="Acceptance sequences (seeds 0..S-1) averaged per cell."),
    from_bench: Path = typer.Option(None, help="A specchat bench results.jsonl: mark the drafter latency and "
                                    "acceptance rate its sd rows measured, and simulate there."),
) -> None:
    """Latency of non-SI, SI and DSI over drafter latency x acceptance rate (the DSI paper's Figure 1)."""
    grid = build_grid(drafter_latency, acceptance, lookahead, servers, steps, tokens, seeds)
    summary, paths = run_dsi(grid, from_bench, out)
    print(summary)
    for path in paths:
        print(f"wrote {path}", file=sys.stderr)


def main() -> None:
    """Entry point: run the app, turning user errors into one line and exit code 2."""
    command = typer.main.get_command(app)
    try:
        code = command.main(args=sys.argv[1:], prog_name="specchat", standalone_mode=False)
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
