"""llama.cpp's own completion objects, which its clients (editor plugins, scripts) read:
`content`, `stop`, how it stopped, token counts and `timings` (with the draft tokens scored and
accepted, the fields llama.cpp fills for its own speculative decoding); `response_fields` picks
paths out of the final object ("timings/prompt_n" becomes that key)."""

from time import perf_counter

from specchat.decoding.token_log import TokenLogprobs
from specchat.serve.reply import Reply, logprob_entry
from specchat.serve.scheduler import Job

MISSING = object()  # a path the reply does not hold


def stop_type(reply: Reply, cut: bool) -> str:
    """eos: the model ended it; word: a stop string; limit: the token limit, or an editor's stop."""
    if reply.stopped:
        return "word"
    return "eos" if reply.ended_by_model and not cut else "limit"


def timings(job: Job, reply: Reply) -> dict:
    events = reply.events
    prompt_n, prompt_s = (events[0].prefill_tokens, events[0].prefill_s) if events else (0, 0.0)
    wall_s = (job.ended_s or perf_counter()) - job.started_s if job.started else 0.0
    predicted_n, predicted_s = reply.completion_tokens, max(wall_s - prompt_s, 0.0)
    figures = {"cache_n": len(job.prompt_ids) - prompt_n if events else 0,
               **rates("prompt", prompt_n, prompt_s), **rates("predicted", predicted_n, predicted_s)}
    if scored := sum(event.tree_size for event in events):
        figures |= {"draft_n": scored, "draft_n_accepted": sum(event.accepted for event in events)}
    return figures


def rates(kind: str, tokens: int, seconds: float) -> dict:
    return {f"{kind}_n": tokens, f"{kind}_ms": seconds * 1000,
            f"{kind}_per_token_ms": seconds * 1000 / tokens if tokens else 0.0,
            f"{kind}_per_second": tokens / seconds if seconds else 0.0}


def partial(text: str, job: Job, reply: Reply) -> dict:
    """A streamed piece (with the probabilities of the tokens logged since the last, if asked)."""
    return {"index": 0, "content": text, "tokens": [], "stop": False,
            "tokens_predicted": reply.completion_tokens, "tokens_evaluated": len(job.prompt_ids)} | probabilities(reply)


def final(model: str, text: str, job: Job, reply: Reply, cut: bool, truncated: bool) -> dict:
    """The whole reply (streamed: the last object, its text already sent)."""
    return {"index": 0, "content": text, "tokens": [], "stop": True, "model": model,
            "tokens_predicted": reply.completion_tokens, "tokens_evaluated": len(job.prompt_ids),
            "truncated": truncated, "stop_type": stop_type(reply, cut), "stopping_word": reply.scan.word,
            "tokens_cached": len(job.prompt_ids) + reply.completion_tokens,
            "timings": timings(job, reply)} | probabilities(reply)


def probabilities(reply: Reply) -> dict:
    """llama.cpp's `completion_probabilities` of the tokens logged since the last call, each
    OpenAI's logprob entry with the token's id (none where n_probs was not asked for)."""
    entries = reply.take_logged()
    if entries is None:
        return {}
    return {"completion_probabilities": [with_ids(logprob_entry(reply.stream.tokenizer, entry), entry)
                                         for entry in entries]}


def with_ids(described: dict, entry: TokenLogprobs) -> dict:
    top = [alternative | {"id": token} for alternative, (token, _) in zip(described["top_logprobs"], entry.top)]
    return described | {"id": entry.token, "top_logprobs": top}


def picked(result: dict, paths: list[str] | None) -> dict:
    """Only the fields at `paths` (slash-separated), keyed by their paths; all without paths."""
    if not paths:
        return result
    found = {}
    for path in paths:
        value: object = result
        for key in path.split("/"):
            value = value.get(key, MISSING) if isinstance(value, dict) else MISSING
        if value is not MISSING:
            found[path] = value
    return found
