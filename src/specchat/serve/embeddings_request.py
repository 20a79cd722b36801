"""The embedding requests: OpenAI's (/v1/embeddings), Ollama's (/api/embed) and Ollama's older one
(/api/embeddings), llama.cpp's own (/embedding), each input as the token ids the target embeds,
checked against the context."""

from pydantic import Field
from transformers import PreTrainedTokenizerBase

from specchat.serve.errors import bad_request
from specchat.serve.schema import Strict
from specchat.serve.text_request import as_batch, checked_ids

ENCODINGS = ("float", "base64")  # OpenAI's client asks base64 unless told otherwise: float32 bytes


class EmbeddingsRequest(Strict):
    """OpenAI's: one text or token array, or a list of either."""

    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: str = "float"
    dimensions: int | None = None  # the first dimensions, normalized again (text-embedding-3's Matryoshka cut)


class EmbedRequest(Strict):
    """Ollama's: one text or a list of texts (none: nothing embedded, as Ollama answers a load check)."""

    model: str
    input: str | list[str] = Field(default_factory=list)
    truncate: bool = True  # a text past the context is cut to it; false: refused
    dimensions: int | None = None


class LegacyEmbeddingsRequest(Strict):
    """Ollama's first embedding route: one prompt, its vector as the model gives it (not normalized)."""

    model: str
    prompt: str = ""


class NativeEmbeddingRequest(Strict):
    """llama.cpp's own (/embedding, /embeddings): `content` (or `input`) as its tokenizer routes take
    prompts, and how each vector is normalized (`embd_normalize`: -1 none, 0 the largest magnitude to
    32760, 1 taxicab, 2 Euclidean, p > 2 the p-norm)."""

    content: str | list[int] | list[str | list[int]] | None = None
    input: str | list[int] | list[str | list[int]] | None = None
    embd_normalize: int = 2  # Euclidean: llama-server's default


def native_inputs(request: NativeEmbeddingRequest, tokenizer: PreTrainedTokenizerBase,
                  context: int) -> list[list[int]]:
    """Each prompt's token ids, as llama-server reads `content` (or `input`): a 400 where neither is
    given, or for an empty prompt or one past the context."""
    given = request.content if request.content is not None else request.input
    if given is None:
        raise bad_request('"input" or "content" must be provided', param="content")
    if not given:
        raise bad_request("content is empty: give a text, token ids or a list of them", param="content")
    return [within(tokens_of(item, tokenizer, f"content[{index}]"), context, f"content[{index}]")
            for index, item in enumerate(as_batch(given))]


def within(ids: list[int], context: int, param: str) -> list[int]:
    if len(ids) > context:
        raise bad_request(f"{param} is {len(ids)} tokens, past the context of {context}", "context_length_exceeded",
                          param)
    return ids


def openai_inputs(request: EmbeddingsRequest, tokenizer: PreTrainedTokenizerBase, context: int) -> list[list[int]]:
    """Each input's token ids, in order; a 400 for an empty input, a token outside the vocabulary
    or an input past the context (OpenAI's server refuses those too: it cuts nothing)."""
    if request.encoding_format not in ENCODINGS:
        raise bad_request(f"encoding_format must be one of {', '.join(ENCODINGS)} (got {request.encoding_format!r})",
                          param="encoding_format")
    given = request.input
    if not given:
        raise bad_request("input is empty: give a text, a token array or a list of them", param="input")
    return [within(tokens_of(item, tokenizer, f"input[{index}]"), context, f"input[{index}]")
            for index, item in enumerate(as_batch(given))]


def tokens_of(item: str | list[int], tokenizer: PreTrainedTokenizerBase, param: str) -> list[int]:
    ids = checked_ids(item, len(tokenizer), param) if isinstance(item, list) else list(tokenizer.encode(item))
    if not ids:
        raise bad_request(f"{param} is empty: there is nothing to embed", param=param)
    return ids


def ollama_inputs(request: EmbedRequest, tokenizer: PreTrainedTokenizerBase, context: int) -> list[list[int]]:
    """Each text's token ids, cut to the context where `truncate` (Ollama's default), else a 400."""
    texts = [request.input] if isinstance(request.input, str) else request.input
    inputs = [tokens_of(text, tokenizer, f"input[{index}]") for index, text in enumerate(texts)]
    if not request.truncate and any(len(ids) > context for ids in inputs):
        raise bad_request(f"the input length exceeds the context length ({context} tokens): send truncate true "
                          "to cut it", param="input")
    return [ids[:context] for ids in inputs]


def checked_dimensions(dimensions: int | None, hidden: int) -> int:
    """The dimensions a vector keeps: all of them where none are asked."""
    if dimensions is None:
        return hidden
    if not 1 <= dimensions <= hidden:
        raise bad_request(f"dimensions must be in [1, {hidden}] (got {dimensions})", param="dimensions")
    return dimensions
