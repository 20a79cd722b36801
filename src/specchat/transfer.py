"""Weight-transfer counters and their units, shared by the offload streamer that counts them and
the engines and front ends that report them."""

from dataclasses import dataclass


def gbps(nbytes: int, seconds: float) -> float:
    """Throughput in GB/s (1e9 bytes); 0 when nothing took time."""
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


def gb(nbytes: int) -> str:
    """A size as reports print it, in GB (1e9 bytes)."""
    return f"{nbytes / 1e9:.2f} GB"


def gb_to_bytes(value: float | None) -> int | None:
    """A size given in GB (an option's --ram-budget 1.4) in bytes; None stays None."""
    return None if value is None else int(value * 1e9)


@dataclass(frozen=True)
class TransferStats:
    """Cumulative counters; subtract two snapshots for one interval."""

    bytes: int = 0
    transfer_s: float = 0.0  # time the loads took (the link busy)
    stall_s: float = 0.0  # time compute waited for a layer to arrive
    idle_s: float = 0.0  # time the link moved nothing while a layer still had to be moved
    fetched_bytes: int = 0  # of `bytes`, those compute asked for as it went (a MoE layer's routed experts)
    fetch_wait_s: float = 0.0  # of `stall_s`, the time compute waited for those
    start_stall_s: float = 0.0  # of `stall_s`, the time compute waited for a pass's first streamed layer

    def __sub__(self, other: "TransferStats") -> "TransferStats":
        return TransferStats(self.bytes - other.bytes, self.transfer_s - other.transfer_s,
                             self.stall_s - other.stall_s, self.idle_s - other.idle_s,
                             self.fetched_bytes - other.fetched_bytes, self.fetch_wait_s - other.fetch_wait_s,
                             self.start_stall_s - other.start_stall_s)

    @property
    def gbps(self) -> float:
        """Throughput of the link while it was busy, in GB/s (1e9 bytes)."""
        return gbps(self.bytes, self.transfer_s)
