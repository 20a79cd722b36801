"""What `specchat generate` prints: the reply streamed to stdout with its figures on stderr, or
one JSON object of the text, the token ids, every iteration and the summary."""

import json
import sys
from dataclasses import replace
from pathlib import Path
from time import perf_counter

from specchat.limits import reply_limit
from specchat.runtime import Engine, Models, Penalties, SamplingParams, counted_from, encode_prompt, quoted_prediction
from specchat.summary import Summary, event_record, summarize
from specchat.textstream import TextStream
from specchat.tracing import SKIPPED_ITERATIONS, traced_reply


def run_generation(models: Models, engine: Engine, prompt: str, raw: bool, max_new_tokens: int,
                   sampling: SamplingParams, as_json: bool, system: str | None = None,
                   trace: Path | None = None, penalties: Penalties | None = None) -> None:
    prompt_ids = encode_prompt(models.tokenizer, prompt, raw, system)
    sampling = counted_from(sampling, penalties, prompt_ids)
    sampling = replace(sampling, prediction=quoted_prediction(prompt, models.tokenizer))  # the code it quotes
    room = reply_limit(len(prompt_ids), max_new_tokens, models.context)
    if room < max_new_tokens:
        print(f"notice: at most {room} new tokens: the {len(prompt_ids)}-token prompt fills the rest of the "
              f"{models.context}-token context", file=sys.stderr)
    text = TextStream(models.tokenizer)
    events = []
    start = perf_counter()
    try:
        with traced_reply(trace) as iteration_done:
            for event in engine.generate(prompt_ids, room, sampling):
                iteration_done()
                events.append(event)
                if event.notice:
                    print(f"notice: {event.notice}", file=sys.stderr)
                delta = text.push(event.token_ids)
                if not as_json:
                    sys.stdout.write(delta)
                    sys.stdout.flush()
        if trace is not None and len(events) <= SKIPPED_ITERATIONS:
            print(f"notice: --trace records from the reply's iteration {SKIPPED_ITERATIONS + 1}: this one ran "
                  f"{len(events)}, so {trace} holds none of them", file=sys.stderr)
    except KeyboardInterrupt:
        # Ctrl+C keeps what was generated: the text so far (with --json, its record) and the figures,
        # then exits 130 as the interrupt would have
        report(models, text, events, perf_counter() - start, as_json, interrupted=True)
        raise
    report(models, text, events, perf_counter() - start, as_json, interrupted=False)


def report(models: Models, text: TextStream, events: list, wall_s: float, as_json: bool, interrupted: bool) -> None:
    """The reply's end: the JSON record, or the text's last bytes and the figures on stderr."""
    summary = summarize(events, wall_s)
    if as_json:
        record = {
            "text": text.text,
            "token_ids": text.token_ids,
            "iterations": [event_record(e) for e in events],
            "summary": {**vars(summary), "transfer_gbps": summary.transfer_gbps},
            "plan": plan_record(models),
            "interrupted": interrupted,
        }
        print(json.dumps(record))
    else:
        sys.stdout.write(text.finish() + "\n")
        print(
            f"[{'interrupted: ' if interrupted else ''}{summary.new_tokens} tokens, {summary.iterations} iterations, "
            f"gen rate {summary.gen_rate:.2f}, {summary.tokens_per_s:.2f} tok/s{streaming_note(summary)}]",
            file=sys.stderr,
        )


def plan_record(models: Models) -> dict:
    """Where the memory plan put the target's layers and which form of the draft it chose, with
    what auto chose and why (empty where nothing was planned: dsi's Ray actors plan their own)."""
    if models.memory is None:
        return {}
    placement = models.memory.placement
    return {"resident_layers": placement.resident, "ram_layers": placement.ram, "disk_layers": placement.disk,
            "pass_bytes": placement.pass_bytes, "context": models.memory.context,
            "draft_quant": models.memory.draft.quant if models.memory.draft is not None else None,
            "notes": list(models.memory.notes)}


def streaming_note(summary: Summary) -> str:
    """Weight streaming figures, when the target was offloaded."""
    if summary.transfer_bytes == 0:
        return ""
    return (f", streamed {summary.transfer_bytes / 1e9:.1f} GB at {summary.transfer_gbps:.2f} GB/s, "
            f"stalled {summary.stall_s:.1f} s, link idle {summary.link_idle:.0%}")

