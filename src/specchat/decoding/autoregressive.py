"""The baseline engine: the target alone, one forward per token."""

from collections.abc import Collection, Iterator
from time import perf_counter

import torch

from specchat.decoding.events import IterationEvent, LiveSettings, SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import new_cache
from specchat.decoding.sampling import sample_token


class AutoregressiveEngine:
    name = "autoregressive"

    def __init__(self, target: CausalLM, stop_ids: Collection[int]) -> None:
        self.target = target
        self.stop_ids = frozenset(stop_ids)

    def live_settings(self) -> LiveSettings:
        return LiveSettings()  # the target alone reads no live setting

    def apply(self, settings: LiveSettings) -> None:
        """Nothing to adopt: every field is one this engine does not honour."""

    def generate(
        self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams
    ) -> Iterator[IterationEvent]:
        cache = new_cache()
        tokens = torch.tensor(prompt_ids)
        position = len(prompt_ids)
        for produced in range(1, max_new_tokens + 1):
            start, moved = perf_counter(), self.target.transfer_stats()
            hidden = self.target.hidden(tokens, torch.arange(position - tokens.numel(), position), cache)
            token = sample_token(self.target.logits(hidden[-1:])[0], sampling, position)
            elapsed = perf_counter() - start
            moved = self.target.transfer_stats() - moved
            finished = token in self.stop_ids or produced == max_new_tokens
            yield IterationEvent(
                token_ids=[token], accepted=0, tree_size=0, depth=0,
                draft_s=0.0, target_s=elapsed, transfer_s=moved.transfer_s, transfer_bytes=moved.bytes,
                stall_s=moved.stall_s, link_idle=moved.idle_s / elapsed if elapsed > 0 else 0.0, finished=finished,
            )
            if finished:
                return
            tokens = torch.tensor([token])
            position += 1
