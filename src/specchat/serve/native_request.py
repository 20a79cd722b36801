"""What llama.cpp's own routes (/completion, /infill) take beside the prompt: `n_predict`, the
editor stops, `response_fields`, `cache_prompt`, `n_probs` and the sampling every route shares;
unknown fields (`samplers`, `id_slot`...) are ignored. No `model` is needed: one is served."""

from specchat.decoding.token_log import TokenLog
from specchat.serve.errors import bad_request, unsupported
from specchat.serve.schema import Decoded, token_limit

MAX_PROBS = 100  # alternatives a token at most (llama.cpp sets no bound)


class NativeRequest(Decoded):
    model: str = ""  # llama.cpp's clients send none, or any name
    n_predict: int = -1  # -1: as many as the context holds
    n_indent: int = 0  # > 0: stop before a later line indented less
    t_max_predict_ms: int = 0  # > 0: stop at the first new line after this long
    cache_prompt: bool = True  # with n_predict 0: compute the prompt into a slot for the next request
    n_probs: int = 0  # > 0: each token's log-probability and the n likeliest there (completion_probabilities)
    post_sampling_probs: bool = False  # refused: the probabilities given are the target's, before sampling


def wanted_tokens(request: NativeRequest) -> int | None:
    """The tokens asked for; None for the room left in the context."""
    if request.n_predict < 0:
        return None
    return token_limit("n_predict", request.n_predict) if request.n_predict else 0


def token_log(request: NativeRequest) -> TokenLog | None:
    """The log the reply's tokens are recorded in, with the `n_probs` likeliest alternatives each
    (None: n_probs 0, nothing recorded)."""
    if request.post_sampling_probs:
        raise unsupported("post_sampling_probs (the probabilities after temperature and top-p: n_probs gives the "
                          "target's before them) is", "post_sampling_probs")
    if not 0 <= request.n_probs <= MAX_PROBS:
        raise bad_request(f"n_probs must be in [0, {MAX_PROBS}] (got {request.n_probs})", param="n_probs")
    return TokenLog(request.n_probs) if request.n_probs else None


def response_fields(request: NativeRequest) -> list[str] | None:
    """The paths of the reply's fields asked for (None: all of them)."""
    fields = (request.model_extra or {}).get("response_fields")
    if fields is not None and not (isinstance(fields, list) and all(isinstance(f, str) for f in fields)):
        raise bad_request("response_fields must be a list of strings", param="response_fields")
    return fields
