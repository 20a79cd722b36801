"""The baseline engine: the target alone, one forward per token."""

from collections.abc import Collection, Iterator
import torch
from transformers import DynamicCache

from specchat.decoding.embedding import embedding
from specchat.decoding.events import IterationEvent, LiveSettings, SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import cache_length
from specchat.decoding.prefix import PrefixCache, Reuse, with_prefill
from specchat.decoding.prompt_logprobs import prompt_logprobs
from specchat.decoding.sampling import emit_token
from specchat.decoding.token_log import TokenLogprobs
from specchat.device_clock import now


def next_token(target: CausalLM, seq: list[int], cache: DynamicCache, sampling: SamplingParams) -> int:
    """Run the tokens of `seq` that `cache` lacks through `target` and sample the token at
    position len(seq), as sequential decoding does (the cache then holds all of `seq`)."""
    cached, position = cache_length(cache), len(seq)
    hidden = target.hidden(torch.tensor(seq[cached:]), torch.arange(cached, position), cache)
    return emit_token(target.logits(hidden[-1:])[0], sampling, position)


class AutoregressiveEngine:
    name = "autoregressive"
    keeps_forms = True

    def __init__(self, target: CausalLM, stop_ids: Collection[int]) -> None:
        self.target = target
        self.stop_ids = frozenset(stop_ids)
        self.history = PrefixCache(1)  # holds every committed token but the last, between replies too

    def live_settings(self) -> LiveSettings:
        return LiveSettings()  # the target alone reads no live setting

    def apply(self, settings: LiveSettings) -> None:
        """Nothing to adopt: every field is one this engine does not honour."""

    def forget(self) -> None:
        self.history.forget()

    def embed(self, token_ids: list[int], pooling: str) -> torch.Tensor:
        return embedding(self.target, token_ids, pooling)

    def score(self, token_ids: list[int], top: int) -> list[TokenLogprobs]:
        return self.history.from_start(token_ids, lambda cache: prompt_logprobs(self.target, token_ids, top, cache))

    def generate(
        self, prompt_ids: list[int], max_new_tokens: int, sampling: SamplingParams
    ) -> Iterator[IterationEvent]:
        yield from self.history.guard(self.decode(self.history.begin(prompt_ids), max_new_tokens, sampling))

    def decode(self, reuse: Reuse, max_new_tokens: int, sampling: SamplingParams) -> Iterator[IterationEvent]:
        """The first forward runs the prompt past the reused prefix (its prefill), each later one
        the token before."""
        seq, (cache,) = reuse.tokens, reuse.caches
        for produced in range(1, max_new_tokens + 1):
            start = now(self.target.device)
            moved = self.target.transfer_stats()
            token = next_token(self.target, seq, cache, sampling)
            elapsed = now(self.target.device) - start
            moved = self.target.transfer_stats() - moved  # after the synchronize: every wait counted
            seq.append(token)
            finished = token in self.stop_ids or produced == max_new_tokens
            event = IterationEvent(
                token_ids=[token], accepted=0, tree_size=0, depth=0,
                draft_s=0.0, target_s=elapsed, transfer_s=moved.transfer_s, transfer_bytes=moved.bytes,
                stall_s=moved.stall_s, start_stall_s=moved.start_stall_s,
                link_idle=moved.idle_s / elapsed if elapsed > 0 else 0.0, finished=finished,
            )
            yield with_prefill(event, reuse, elapsed) if produced == 1 else event
            if finished:
                return
