"""Aggregating a stream of iteration events into the figures users and benchmarks report."""

from dataclasses import asdict, dataclass

from specchat.decoding.events import IterationEvent
from specchat.transfer import gbps


@dataclass(frozen=True)
class Summary:
    new_tokens: int
    iterations: int
    gen_rate: float  # new tokens per target forward (iteration)
    tokens_per_s: float
    draft_s: float
    target_s: float
    transfer_s: float
    transfer_bytes: int
    stall_s: float  # target compute waiting for streamed weights
    wall_s: float
    prefill_tokens: int = 0  # prompt tokens run (those past the prefix the engine's caches reused)
    prefill_s: float = 0.0
    link_idle: float = 0.0  # share of the iterations' time the weight link moved nothing while it had more to move
    pass_s: float = 0.0  # tree engines: the target's forwards over the trees (target_s less verification)
    start_stall_s: float = 0.0  # of stall_s, the waits for a pass's first streamed layer

    @property
    def transfer_gbps(self) -> float:
        """Weight streaming throughput while the link was busy, GB/s (1e9 bytes)."""
        return gbps(self.transfer_bytes, self.transfer_s)


def summarize(events: list[IterationEvent], wall_s: float) -> Summary:
    new_tokens = sum(len(e.token_ids) for e in events)
    iterations = len(events)
    busy = sum(e.draft_s + e.target_s for e in events)  # each event's fraction is of its own time
    return Summary(
        new_tokens=new_tokens,
        iterations=iterations,
        gen_rate=new_tokens / iterations if iterations else 0.0,
        tokens_per_s=new_tokens / wall_s if wall_s > 0 else 0.0,
        draft_s=sum(e.draft_s for e in events),
        target_s=sum(e.target_s for e in events),
        transfer_s=sum(e.transfer_s for e in events),
        transfer_bytes=sum(e.transfer_bytes for e in events),
        stall_s=sum(e.stall_s for e in events),
        wall_s=wall_s,
        prefill_tokens=sum(e.prefill_tokens for e in events),
        prefill_s=sum(e.prefill_s for e in events),
        link_idle=sum(e.link_idle * (e.draft_s + e.target_s) for e in events) / busy if busy > 0 else 0.0,
        pass_s=sum(e.pass_s for e in events),
        start_stall_s=sum(e.start_stall_s for e in events),
    )


@dataclass(frozen=True)
class TreeMeans:
    """Per drafted tree, over a reply's tree iterations (not the prompt's pass, which drafts
    none); all 0 for an engine that drafts no tree."""

    trees: int  # how many iterations drafted a tree
    tree_size: float
    depth: float
    accepted: float  # drafted tokens verification accepted


def tree_means(events: list[IterationEvent]) -> TreeMeans:
    trees = [e for e in events if e.tree_size > 0]
    count = max(len(trees), 1)
    return TreeMeans(len(trees), sum(e.tree_size for e in trees) / count, sum(e.depth for e in trees) / count,
                     sum(e.accepted for e in trees) / count)


def event_record(event: IterationEvent) -> dict:
    """An event as plain JSON-ready data."""
    return asdict(event)
