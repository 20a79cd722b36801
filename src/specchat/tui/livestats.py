"""The figures behind the live panels, kept apart from the widgets that draw them."""

from collections import deque
from dataclasses import dataclass, field

from specchat.decoding.events import ALONE, LOOK, IterationEvent
from specchat.transfer import gbps
from specchat.summary import Summary

WINDOW = 60  # iterations shown in the sparklines


@dataclass
class LiveStats:
    accepted: deque[int] = field(default_factory=lambda: deque(maxlen=WINDOW))
    tree_sizes: deque[int] = field(default_factory=lambda: deque(maxlen=WINDOW))
    last: IterationEvent | None = None
    iterations: int = 0  # since the app started
    reply_tokens: int = 0
    reply_engine_s: float = 0.0
    reply_jobs_submitted: int = 0  # dsi's verification jobs; engines without jobs report none
    reply_jobs_preempted: int = 0
    reply_alone: int = 0  # --budget auto: iterations the target ran alone, drafting predicted slower
    reply_looks: int = 0  # and trees drafted while it did, to measure drafting's rate again

    def start_reply(self) -> None:
        self.reply_tokens = 0
        self.reply_engine_s = 0.0
        self.reply_jobs_submitted = 0
        self.reply_jobs_preempted = 0
        self.reply_alone = self.reply_looks = 0

    def record(self, event: IterationEvent) -> None:
        if event.tree_size > 0:  # the sparklines and the mean are per drafted tree, not the prompt's pass
            self.accepted.append(event.accepted)
            self.tree_sizes.append(event.tree_size)
        self.last = event
        self.iterations += 1
        self.reply_tokens += len(event.token_ids)
        # Weight streaming runs alongside drafting and the target pass, so it is inside them.
        self.reply_engine_s += event.draft_s + event.target_s
        self.reply_jobs_submitted += event.jobs_submitted
        self.reply_jobs_preempted += event.jobs_preempted
        self.reply_alone += event.drafting == ALONE
        self.reply_looks += event.drafting == LOOK

    @property
    def mean_accepted(self) -> float:
        return sum(self.accepted) / len(self.accepted) if self.accepted else 0.0

    @property
    def tokens_per_s(self) -> float:
        # Engine time rather than wall time: it is what the decoding costs, unaffected by the
        # UI, and reproducible with the fake engine.
        return self.reply_tokens / self.reply_engine_s if self.reply_engine_s > 0 else 0.0

    @property
    def transfer_gb_per_s(self) -> float:
        last = self.last
        return gbps(last.transfer_bytes, last.transfer_s) if last else 0.0


def stats_report(last: Summary | None, stats: LiveStats) -> str:
    """What /stats shows: the last reply's totals and the session's acceptance."""
    if last is None:
        return "no reply yet"
    return (
        f"last reply: {last.new_tokens} tokens in {last.iterations} iterations "
        f"({last.gen_rate:.2f} per iteration), {last.tokens_per_s:.1f} tokens/s; "
        f"draft {last.draft_s:.2f} s, target {last.target_s:.2f} s, transfer {last.transfer_s:.2f} s; "
        f"prefill {last.prefill_tokens} tokens in {last.prefill_s:.2f} s\n"
        f"session: {stats.iterations} iterations, mean accepted {stats.mean_accepted:.2f} "
        f"over the last {len(stats.accepted)}"
        f"{drafting_report(last, stats)}"
    )


def drafting_report(reply: Summary, stats: LiveStats) -> str:
    """Under --budget auto, when the last reply left the target alone and why; else nothing."""
    event = stats.last
    if not stats.reply_alone or event is None:
        return ""
    return (f"\ndrafting off in {stats.reply_alone} of {reply.iterations} iterations of the last reply "
            f"({stats.reply_looks} looks): predicted {event.rate_alone:.1f} tokens/s for the target alone "
            f"against {event.rate_with_tree:.1f} with a tree")
