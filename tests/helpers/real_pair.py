"""The real pair as the suite loads it (the embedded Qwen2.5-Coder draft and target), and the
sizes and sampling of the suite's reduced exactness runs."""

from dataclasses import dataclass
from pathlib import Path

import torch
from helpers.suite_scale import scaled

from specchat.chat_template import encode_chat
from specchat.decoding.events import SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.stopping import stop_token_ids
from specchat.dtypes import DTYPES
from specchat.engine_options import EngineOptions
from specchat.heap_trim import release_free_heap
from specchat.limits import DEFAULT_DTYPE
from specchat.models.draft import resolve_draft_quant
from specchat.models.draft_approx import approximate_draft
from specchat.models.loading import load
from specchat.models.registry import DEFAULT_DRAFT, DEFAULT_TARGET
from specchat.quant.onednn_float import route_float32_linears
from specchat.runtime import encode_prompt, pick_device

# the suite's reduced exactness runs: 2 MT-Bench prompts (1 where the run is scaled down:
# tests/helpers/suite_scale.py) x 32 new tokens
GREEDY_PROMPTS = scaled(2)
GREEDY_NEW_TOKENS = 32

PAPER_SAMPLING = SamplingParams(temperature=0.6, top_p=0.9, seed=1234)


def emitted(engine, prompt_ids, sampling) -> tuple[list[int], list]:
    """An engine's reduced exactness run: its tokens and events for GREEDY_NEW_TOKENS."""
    events = list(engine.generate(prompt_ids, GREEDY_NEW_TOKENS, sampling))
    return [t for e in events for t in e.token_ids], events


@dataclass
class RealPair:
    """The embedded Qwen2.5-Coder pair: the target in float32, where exactness is judged, and the
    draft with both of the app's CPU approximations on, whatever `--draft-quant auto` picks on this
    machine: int8 linears and its sub-vocabulary head (the app's default form on an idle x86 CPU).
    Every real test over the pair then proves exactness with the approximations on."""

    target: CausalLM
    draft: CausalLM
    tokenizer: object
    stop_ids: frozenset[int]
    directory: Path  # the target's converted files

    def chat(self, prompt: str) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, raw=False)

    def chat_with_tools(self, prompt: str, tools: list[dict]) -> list[int]:
        """A user message with `tools` declared as the chat template declares them."""
        return encode_chat(self.tokenizer, [{"role": "user", "content": prompt}], tools)


def real_draft(int8: bool | None = None, vocab_size: int | None = EngineOptions.draft_vocab or None,
               int4: bool = False) -> CausalLM:
    """The embedded draft in the app's default dtype, its weights in
    int8 if `int8` (None: as `--draft-quant auto` decides on this device), its decoder's linears
    rounded to 4 bits if `int4` (`int8` False then), its head scoring the
    `vocab_size` most frequent tokens (None: all; the default: as the app's). The verifier never
    reads the draft's probabilities, so its dtype may differ from the target's."""
    dtype = DTYPES[DEFAULT_DTYPE]
    draft = load(DEFAULT_DRAFT, dtype, progress=False)
    quant = resolve_draft_quant(EngineOptions.draft_quant if int8 is None else ("int8" if int8 else "none"),
                                pick_device(), dtype)
    stop_ids = stop_token_ids(draft.model, draft.tokenizer)
    return approximate_draft(draft.model, draft.tokenizer, draft.directory, quant.kind == "int8", vocab_size, stop_ids,
                             quant.dense_above, int4=int4)


def load_real_pair() -> RealPair:
    """The float32 target, its linears multiplied as the app multiplies them on this CPU (through
    oneDNN over the widths where it measured faster: quant/onednn_float.py), and the int8
    sub-vocabulary draft, the draft first: preparing it leaves ~1.2 GB of freed heap, returned
    before the target loads."""
    draft = real_draft(int8=True)
    release_free_heap()
    target = load(DEFAULT_TARGET, torch.float32, progress=False)
    route_float32_linears(target.model.modules(), target.model.device)
    pair = RealPair(target=CausalLM(target.model), draft=draft, tokenizer=target.tokenizer,
                    stop_ids=stop_token_ids(target.model, target.tokenizer), directory=target.directory)
    release_free_heap()
    return pair
