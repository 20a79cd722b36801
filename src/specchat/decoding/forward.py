"""A thin adapter over a transformers causal LM: hidden states with any attention mask, and
logits computed only for the rows that are needed.

Splitting the LM head off matters: a target pass over a 1024-node tree would otherwise spend
~240 GFLOP on a [1025 x 1536] @ [1536 x 151936] product, while verification reads at most a
few dozen of those rows.
"""

from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from specchat.decoding.head_rows import BATCH_ROWS
from specchat.decoding.kvcache import cache_length, new_cache
from specchat.host_pull import HostSender
from specchat.transfer import TransferStats


class WeightStream(Protocol):
    """What an offloaded model exposes: cumulative transfer statistics, the bytes one pass
    streams (and a pass of whole layers, which a MoE's ring moves after calls that routed widely,
    and whether it is doing so now) and the share of a pass its staging area holds."""

    def stats(self) -> TransferStats: ...

    @property
    def pass_bytes(self) -> int: ...

    @property
    def whole_pass_bytes(self) -> int: ...

    @property
    def loading_whole(self) -> bool: ...

    @property
    def staged_share(self) -> float: ...


@dataclass
class CausalLM:
    """A decoder-only model split into its trunk (to hidden states) and its LM head."""

    model: PreTrainedModel
    stream: WeightStream | None = None  # set when the decoder layers are streamed (offload)
    # A draft may score only a sub-vocabulary (FR-Spec): `vocab` holds the token ids its
    # `head` [len(vocab) rows] scores; every other token gets probability 0.
    vocab: torch.Tensor | None = None
    head: nn.Module | None = None
    # A draft's: the slots its cache may hold, the context and the largest tree the memory plan
    # counts (growing a tree runs 1.15-3.5 rows a kept node: decoding/static_step.draft_slots);
    # None: no bound, the cache grows
    capacity: int | None = None
    # The rows of a target's LM head the verification walk computes in one call: BATCH_ROWS, or 1
    # where each row costs a call's time (decoding/head_rows.py; the loader measures it)
    head_rows: int = BATCH_ROWS
    sender: HostSender | None = field(default=None, repr=False)  # made at the first `send`

    def send(self, host: torch.Tensor) -> torch.Tensor:
        """`host` (contiguous) on the model's device, as a new tensor: beside a GPU pulled from a
        pinned buffer by the GPU's threads, so that no layer the streamer is copying delays it
        (host_pull.py)."""
        self.sender = self.sender or HostSender(self.device)
        return self.sender.send(host)

    def transfer_stats(self) -> TransferStats:
        """Cumulative bytes and seconds of weight streaming (zero for a model in memory)."""
        return self.stream.stats() if self.stream is not None else TransferStats()

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @torch.inference_mode()
    def hidden(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: DynamicCache,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run `tokens` [n] at absolute `positions` [n] after the cached slots.

        `mask` is a bool [n, cached + n] matrix (True = attend); None means plain causal.
        Returns the final-norm hidden states [n, hidden_size]; the cache grows by n slots.
        """
        device = self.device
        attention = None if mask is None else to_additive_mask(mask, self.dtype, device)
        input_ids, position_ids = self.rows_on_device(tokens, positions)
        out = self.model.get_decoder()(
            input_ids=input_ids,
            position_ids=position_ids,
            attention_mask=attention,
            cache=cache,  # transformers 5.24 renamed past_key_values (removed in 5.40)
            use_cache=True,
        )
        return out.last_hidden_state[0]

    def rows_on_device(self, tokens: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`tokens` and `positions` [n] as the decoder's [1, n] inputs on the model's device: from
        the host beside a GPU in one pull (`send`), which waits for no layer the streamer is
        copying (a draft's first run of an iteration catches up on the committed tokens so)."""
        if self.device.type == "cuda" and tokens.device.type == positions.device.type == "cpu":
            ids = self.send(torch.stack([tokens.view(-1).long(), positions.view(-1).long()]))
            return ids[0:1], ids[1:2]
        return tokens.view(1, -1).to(self.device), positions.view(1, -1).to(self.device)

    def rows_from_start(self, token_ids: list[int]) -> torch.Tensor:
        """The final-norm rows of `token_ids` run from position 0 on a cache of their own (an
        embedding's pass): a kept cache is left as it was."""
        return self.hidden(torch.tensor(token_ids), torch.arange(len(token_ids)), new_cache())

    def graphs_captured(self) -> int:
        """The steps captured as CUDA graphs so far (a static draft's, static_step.py): none here."""
        return 0

    def uses_before_replay(self) -> int:
        """The runs of a new shape before its runs cost what a reply's do (a captured draft's first
        runs eagerly, its second captures: static_step.py): none here."""
        return 0

    def room(self, cache: DynamicCache) -> int | None:
        """The most rows a step may still run on `cache`: the slots left of `capacity`; None: no
        bound, the cache grows (a static draft's reserved slots bound it: decoding/static_step.py)."""
        return None if self.capacity is None else max(0, self.capacity - cache_length(cache))

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head on hidden rows [m, H] -> float32 logits [m, V] (-inf outside `vocab`)."""
        if self.vocab is None:
            return self.model.get_output_embeddings()(hidden).float()
        full = torch.full((hidden.shape[0], self.model.config.vocab_size), -torch.inf, device=hidden.device)
        full[:, self.vocab.to(hidden.device)] = self.head(hidden).float()
        return full

    @torch.inference_mode()
    def top_logprobs(self, hidden: torch.Tensor, k: int, temperature: float,
                     allowed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """The k likeliest next tokens per row of `hidden` [m, H]: (log-probs [m, k], token ids
        [m, k]) under the temperature-scaled distribution (scale 1 at temperature 0), scoring
        only `vocab` when set, and only the tokens `allowed` [m, V] (a reply's grammar) when
        given: a row that allows none of the scored tokens gives no finite log-prob."""
        scale = temperature if temperature > 0 else 1.0
        head = self.head if self.vocab is not None else self.model.get_output_embeddings()
        logits = head(hidden).float() / scale
        if allowed is not None:
            scored = allowed if self.vocab is None else allowed[:, self.vocab.to(allowed.device)]
            logits = logits.masked_fill(~scored.to(logits.device), -float("inf"))
        # log p = logit - logsumexp(logits): taking the top k first spares writing a whole
        # [m, V] log-softmax for the k entries read.
        top = logits.topk(min(k, logits.shape[-1]), dim=-1)
        values = top.values - logits.logsumexp(dim=-1, keepdim=True)
        ids = self.vocab.to(hidden.device)[top.indices] if self.vocab is not None else top.indices
        return values.cpu(), ids.cpu()


def to_additive_mask(mask: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """bool [n, k] (True = attend) -> additive float [1, 1, n, k]: 0 where attended, dtype min
    where masked, the form transformers accepts as a custom 4-D mask."""
    additive = torch.zeros(mask.shape, dtype=dtype, device=device)
    additive.masked_fill_(~mask.to(device), torch.finfo(dtype).min)
    return additive.view(1, 1, *mask.shape)
