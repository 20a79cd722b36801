"""The target's log-probabilities of a prompt's own tokens: each token after the first, given the
ones before it, with the likeliest alternatives there, as a reply's tokens are logged
(decoding/token_log.py: before temperature, top-p and any grammar). OpenAI's text completions give
them with `echo` and `logprobs`; evaluation harnesses score a continuation so (lm-evaluation-harness's
loglikelihood tasks). One pass of the whole prompt on a cache of its own, its LM head in row blocks
so that the logits held stay small; the engine's kept caches are left as they were."""

from specchat.decoding.forward import CausalLM
from specchat.decoding.token_log import TokenLog, TokenLogprobs

HEAD_ROWS = 64  # LM-head rows a call: 39 MB of float32 logits for a 151,936-token vocabulary


def prompt_logprobs(target: CausalLM, token_ids: list[int], top: int) -> list[TokenLogprobs]:
    """An entry for each of token_ids[1:], in order: its log-probability after the tokens before it
    and the `top` likeliest tokens there (the first token has none: nothing comes before it)."""
    hidden = target.rows_from_start(token_ids)
    log = TokenLog(top)
    for start in range(0, len(token_ids) - 1, HEAD_ROWS):
        rows = hidden[start:min(start + HEAD_ROWS, len(token_ids) - 1)]
        for logits, token in zip(target.logits(rows), token_ids[start + 1:start + 1 + len(rows)]):
            log.record(logits, token)
    return log.entries
