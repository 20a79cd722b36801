"""The embedding routes: OpenAI's POST /v1/embeddings, Ollama's POST /api/embed and POST
/api/embeddings, and llama.cpp's own POST /embedding (and /embeddings). The target embeds each
input (decoding/embedding.py, pooled as `serve --pooling` says) on the decoding thread, queued as
a reply is, so it never runs beside a decode on the same weights; the engines' kept caches are left
as they were.

OpenAI's and Ollama's /api/embed vectors have unit length (cosine similarity is their dot product),
cut first to `dimensions` where asked; /api/embeddings gives the pooled vector as it is, as Ollama's;
/embedding normalizes as its `embd_normalize` says, Euclidean by default, as llama-server's."""

import base64
import threading
from time import perf_counter

import torch
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from specchat.decoding.events import Engine
from specchat.serve.embeddings_request import (EmbeddingsRequest, EmbedRequest, LegacyEmbeddingsRequest,
                                               NativeEmbeddingRequest, checked_dimensions, native_inputs,
                                               ollama_inputs, openai_inputs)
from specchat.serve.endpoint import Endpoint
from specchat.serve.ollama_request import check_ollama_model
from specchat.serve.schema import check_model, parsed

NS_PER_S = 1_000_000_000
EUCLIDEAN = 2  # llama.cpp's embd_normalize for the 2-norm, its default


class Embeddings(Endpoint):
    async def openai(self, request: Request) -> Response:
        body = parsed(await request.body(), EmbeddingsRequest)
        check_model(body.model, self.config.model)
        inputs = openai_inputs(body, self.config.tokenizer, self.config.context)
        vectors = await self.vectors(request, inputs)
        dimensions = checked_dimensions(body.dimensions, len(vectors[0]))
        data = [{"object": "embedding", "index": index, "embedding": encoded(unit(vector[:dimensions]),
                                                                             body.encoding_format)}
                for index, vector in enumerate(vectors)]
        tokens = sum(len(ids) for ids in inputs)
        return JSONResponse({"object": "list", "data": data, "model": self.config.model,
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    async def ollama(self, request: Request) -> Response:
        start = perf_counter()
        body = parsed(await request.body(), EmbedRequest)
        check_ollama_model(body.model, self.config.model)
        inputs = ollama_inputs(body, self.config.tokenizer, self.config.context)
        vectors = await self.vectors(request, inputs) if inputs else []
        dimensions = checked_dimensions(body.dimensions, len(vectors[0])) if vectors else None
        return JSONResponse({"model": body.model, "embeddings": [unit(v[:dimensions]).tolist() for v in vectors],
                             "total_duration": round((perf_counter() - start) * NS_PER_S), "load_duration": 0,
                             "prompt_eval_count": sum(len(ids) for ids in inputs)})

    async def ollama_legacy(self, request: Request) -> Response:
        body = parsed(await request.body(), LegacyEmbeddingsRequest)
        check_ollama_model(body.model, self.config.model)
        ids = list(self.config.tokenizer.encode(body.prompt))[:self.config.context]
        vectors = await self.vectors(request, [ids]) if ids else [torch.zeros(0)]  # Ollama's: [] for no prompt
        return JSONResponse({"embedding": vectors[0].tolist()})

    async def native(self, request: Request) -> Response:
        """llama.cpp's /embedding: a list of {index, embedding: [vector]}, each normalized as asked."""
        body = parsed(await request.body(), NativeEmbeddingRequest)
        inputs = native_inputs(body, self.config.tokenizer, self.config.context)
        vectors = await self.vectors(request, inputs)
        return JSONResponse([{"index": index, "embedding": [normalized(vector, body.embd_normalize).tolist()]}
                             for index, vector in enumerate(vectors)])

    async def vectors(self, request: Request, inputs: list[list[int]]) -> list[torch.Tensor]:
        """The pooled vector of each input, in order, computed on the decoding thread."""
        pooling = self.config.pooling

        def work(engine: Engine, cancel: threading.Event) -> list[torch.Tensor]:
            return [engine.embed(ids, pooling) for ids in inputs if not cancel.is_set()]

        return await self.computed(request, [token for ids in inputs for token in ids], work)


def normalized(vector: torch.Tensor, norm: int) -> torch.Tensor:
    """llama.cpp's `embd_normalize`: -1 none, 0 the largest magnitude scaled to 32760 (an int16's
    range), otherwise divided by its p-norm (1 taxicab, 2 Euclidean); a zero vector stays zero."""
    if norm == -1:
        return vector
    total = vector.abs().max() / 32760 if norm == 0 else vector.double().norm(p=norm)
    return vector / total if total > 0 else vector


def unit(vector: torch.Tensor) -> torch.Tensor:
    """`vector` at length 1, as llama.cpp's Euclidean `embd_normalize` scales it (a zero vector stays zero)."""
    return normalized(vector, EUCLIDEAN)


def encoded(vector: torch.Tensor, encoding: str) -> list[float] | str:
    """A list of floats, or for base64 the float32 values' little-endian bytes in base64, as OpenAI's."""
    if encoding == "float":
        return vector.tolist()
    return base64.b64encode(vector.to(torch.float32).numpy().astype("<f4").tobytes()).decode("ascii")
