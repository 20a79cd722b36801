"""Ollama's decoding routes, POST /api/chat and POST /api/generate, for the clients that speak
Ollama's API (oterm, Open WebUI, editor plugins): each request mapped onto the job the OpenAI
routes would queue (serve/ollama_request.py), decoded by the same engines, and answered with
Ollama's objects (serve/ollama_reply.py), streamed as lines of JSON unless `stream` is false."""

from collections.abc import AsyncIterator
from dataclasses import replace

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from specchat.decoding.events import SamplingParams
from specchat.decoding.token_log import TokenLog
from specchat.serve.endpoint import Endpoint
from specchat.serve.form import Form
from specchat.serve.ollama_reply import assistant, error_body, last, loaded, ndjson, piece
from specchat.serve.ollama_request import (OllamaBody, OllamaChat, OllamaGenerate, chat_messages,
                                           check_generate_features, check_ollama_features, check_ollama_model,
                                           format_schema, wanted_tokens)
from specchat.serve.reply import Reply
from specchat.serve.scheduler import Job
from specchat.serve.penalty_fields import llama_penalties
from specchat.serve.schema import parsed, sampling_of, stop_strings
from specchat.serve.structured import CallHold, offered_functions, split_calls
from specchat.serve.text_request import checked_ids, prompt_ids

NDJSON = "application/x-ndjson"


class Ollama(Endpoint):
    frame = staticmethod(ndjson)
    media_type = NDJSON
    stream_end = ""  # the last line says done
    error_body = staticmethod(error_body)

    def checked(self, body: OllamaBody) -> None:
        """The model is this server's; the features are offered."""
        check_ollama_model(body.model, self.config.model)
        check_ollama_features(body)

    def sampling(self, body: OllamaBody) -> SamplingParams:
        """The options' sampling, the server's defaults for what they leave out, kept to `format`."""
        schema = format_schema(body.format)
        form = self.form(None if schema is None else Form("format", schema=schema))
        return replace(sampling_of(body.options, self.config.sampling), guide=None if form is None else form.start(),
                       token_log=self.logged(TokenLog(body.top_logprobs) if body.logprobs else None, "logprobs"))

    def answer(self, request: Request, job: Job, reply: Reply, chunks: AsyncIterator[dict]) -> Response:
        self.queue(request, job)
        return self.streamed(request, job, reply, chunks)


class OllamaChatRoute(Ollama):
    async def respond(self, request: Request) -> Response:
        """POST /api/chat, once the key is checked."""
        body = parsed(await request.body(), OllamaChat)
        self.checked(body)
        if not body.messages:
            return JSONResponse(loaded(self.config.model, "message", assistant("", [])))
        messages = chat_messages(body.messages)
        if self.config.log_prompts:
            request.state.messages = messages
        functions = offered_functions(body.tools, None)  # Ollama has no tool_choice: the model may call
        sampling = self.sampling(body)
        asked = llama_penalties(body.options, self.config.tokenizer, self.config.sampling)
        job = self.chat_job(messages, body.tools if functions else None, wanted_tokens(body.options), sampling,
                            "messages", asked)
        reply = self.reply(stop_strings(body.options), sampling, may_call=bool(functions))
        if body.stream:
            return self.answer(request, job, reply, self.stream(job, reply))
        self.queue(request, job)
        text = await self.collect(request, job, reply)
        content, calls = split_calls(text) if reply.may_call else (text, [])
        return JSONResponse(last(self.config.model, "message", assistant(content or "", calls), job, reply))

    async def stream(self, job: Job, reply: Reply) -> AsyncIterator[dict]:
        """The text as it comes, until a tool call begins; the calls, and the held tail, in the last."""
        hold = CallHold() if reply.may_call else None
        async for text in self.pieces(job, reply):
            if (content := hold.push(text) if hold else text) or reply.unsent_logprobs:
                yield piece(self.config.model, "message", assistant(content, []), reply)
        tail, calls = hold.finish(reply.finish()) if hold else (reply.finish(), [])
        yield last(self.config.model, "message", assistant(tail, calls), job, reply)


class OllamaGenerateRoute(Ollama):
    async def respond(self, request: Request) -> Response:
        """POST /api/generate, once the key is checked."""
        body = parsed(await request.body(), OllamaGenerate)
        self.checked(body)
        check_generate_features(body)
        if not body.prompt and not body.suffix:
            return JSONResponse(loaded(self.config.model, "response", ""))
        if self.config.log_prompts:
            request.state.prompt = body.prompt
        sampling = self.sampling(body)
        job = self.job(self.generate_ids(body), wanted_tokens(body.options), sampling, "prompt",
                       llama_penalties(body.options, self.config.tokenizer, self.config.sampling))
        reply = self.reply(stop_strings(body.options), sampling)
        if body.stream:
            return self.answer(request, job, reply, self.stream(body, job, reply))
        self.queue(request, job)
        text = await self.collect(request, job, reply)
        return JSONResponse(last(self.config.model, "response", text, job, reply) | context_of(body, job, reply))

    def generate_ids(self, body: OllamaGenerate) -> list[int]:
        """The prompt through the chat template as the user's message (after `system`), or as it is
        under `raw`; with a `suffix` (raw or not), in the model's fill-in-the-middle format; after
        the `context` of an earlier answer, as Ollama puts it before."""
        context = checked_ids(body.context or [], len(self.config.tokenizer), "context")
        if body.raw or body.suffix:
            return context + prompt_ids(body.prompt, body.suffix, self.config.tokenizer, self.config.fim)
        system = [{"role": "system", "content": body.system}] if body.system else []
        return context + self.chat_ids([*system, {"role": "user", "content": body.prompt}])

    async def stream(self, body: OllamaGenerate, job: Job, reply: Reply) -> AsyncIterator[dict]:
        async for text in self.pieces(job, reply):
            yield piece(self.config.model, "response", text, reply)
        yield last(self.config.model, "response", reply.finish(), job, reply) | context_of(body, job, reply)


def context_of(body: OllamaGenerate, job: Job, reply: Reply) -> dict:
    """Ollama's `context` on a templated answer's last object: the token ids of the prompt and the
    reply (up to where it ended), which a client sends back to go on from them; the slot's caches
    hold exactly these, so the next prompt reuses them."""
    if body.raw:
        return {}
    return {"context": job.prompt_ids + reply.stream.token_ids[:reply.completion_tokens]}
