"""The target's log-probabilities of a prompt's own tokens: each token after the first, given the
ones before it, with the likeliest alternatives there, as a reply's tokens are logged
(decoding/token_log.py: before temperature, top-p and any grammar). OpenAI's text completions give
them with `echo` and `logprobs`; evaluation harnesses score a continuation so (lm-evaluation-harness's
loglikelihood tasks). One pass of the whole prompt from position 0 on the cache given, its LM head
in row blocks so that the logits held stay small. An engine runs it on its kept target cache
(prefix.py's `from_start`), so that the reply to the prompt that follows computes only its last
token again: the prompt runs through the target once, not twice."""

import torch

from specchat.decoding.forward import CausalLM
from specchat.decoding.kvcache import SlotCache
from specchat.decoding.token_log import TokenLog, TokenLogprobs

HEAD_ROWS = 64  # LM-head rows a call: 39 MB of float32 logits for a 151,936-token vocabulary


def prompt_logprobs(target: CausalLM, token_ids: list[int], top: int, cache: SlotCache) -> list[TokenLogprobs]:
    """An entry for each of token_ids[1:], in order: its log-probability after the tokens before it
    and the `top` likeliest tokens there (the first token has none: nothing comes before it); `cache`,
    empty, then holds `token_ids`."""
    hidden = target.hidden(torch.tensor(token_ids), torch.arange(len(token_ids)), cache)
    log = TokenLog(top)
    for start in range(0, len(token_ids) - 1, HEAD_ROWS):
        rows = hidden[start:min(start + HEAD_ROWS, len(token_ids) - 1)]
        for logits, token in zip(target.logits(rows), token_ids[start + 1:start + 1 + len(rows)]):
            log.record(logits, token)
    return log.entries
