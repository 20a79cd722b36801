"""Distributed speculative inference (Timor et al. 2024): a drafter that never waits and a pool
of target workers verifying speculative prefixes concurrently."""
