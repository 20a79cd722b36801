"""One text completion (POST /v1/completions): a raw prompt, or a prefix and a suffix to fill in the
middle of, decoded by the same engines as a chat, whole or streamed as server-sent events. Code
editors ask it for completions at the cursor."""

import threading
from collections.abc import AsyncIterator
from dataclasses import replace

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from specchat.decoding.events import Engine
from specchat.decoding.token_log import TokenLog, TokenLogprobs
from specchat.serve.endpoint import Endpoint
from specchat.serve.form import form_of
from specchat.serve.reply import Reply
from specchat.serve.scheduler import Job
from specchat.serve.penalty_fields import openai_penalties
from specchat.serve.schema import check_model, parse_body, sampling_of, stop_strings
from specchat.serve.structured import response_schema
from specchat.serve.text_reply import LegacyLogprobs, TextChunks, joined, text_completion
from specchat.serve.text_request import (TextRequest, check_text_features, completion_tokens, prompt_ids,
                                         single_prompt)


class TextCompletions(Endpoint):
    async def respond(self, request: Request) -> Response:
        """POST /v1/completions, once the key is checked."""
        body = parse_body(await request.body(), TextRequest)
        check_text_features(body)
        check_model(body.model, self.config.model)
        job, reply, echoed = self.prepare(body, request)
        logprobs = LegacyLogprobs(self.config.tokenizer, offset=len(echoed))
        scored = await self.scored_prompt(request, body, job.prompt_ids, logprobs)
        self.queue(request, job)
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            chunks = self.stream(job, reply, echoed, scored, logprobs, include_usage)
            return self.streamed(request, job, reply, chunks)
        text = echoed + await self.collect(request, job, reply)
        return JSONResponse(text_completion(self.config.model, text, reply, job, joined(scored, logprobs.take(reply))))

    async def scored_prompt(self, request: Request, body: TextRequest, prompt_ids: list[int],
                            logprobs: LegacyLogprobs) -> dict | None:
        """The echoed prompt's logprobs, where `echo` and `logprobs` ask for them: the target's pass
        over the prompt, run before the reply is queued."""
        if not body.echo or body.logprobs is None:
            return None
        top = body.logprobs

        def work(engine: Engine, cancel: threading.Event) -> list[TokenLogprobs]:
            return engine.score(prompt_ids, top)

        return logprobs.prompt(prompt_ids, await self.computed(request, prompt_ids, work))

    def prepare(self, body: TextRequest, request: Request) -> tuple[Job, Reply, str]:
        """The job, its reply, and the prompt's text when it is echoed before the completion."""
        prompt = single_prompt(body)
        if self.config.log_prompts:
            request.state.prompt = prompt
            if body.suffix is not None:
                request.state.suffix = body.suffix
        form = self.form(form_of(body, response_schema(body.response_format)))
        sampling = replace(sampling_of(body, self.config.sampling), guide=None if form is None else form.start(),
                           token_log=self.logged(None if body.logprobs is None else TokenLog(body.logprobs),
                                                 "logprobs"))
        stops, wanted = stop_strings(body), completion_tokens(body)
        ids = prompt_ids(prompt, body.suffix, self.config.tokenizer, self.config.fim)
        echoed = (prompt if isinstance(prompt, str) else self.config.tokenizer.decode(ids)) if body.echo else ""
        asked = openai_penalties(body, self.config.tokenizer, self.config.sampling)
        job = self.job(ids, wanted, sampling, "prompt", asked)
        return job, self.reply(stops, sampling), echoed

    async def stream(self, job: Job, reply: Reply, echoed: str, scored: dict | None, logprobs: LegacyLogprobs,
                     include_usage: bool) -> AsyncIterator[dict]:
        chunks = TextChunks(self.config.model)
        if echoed:
            yield chunks.text(echoed, scored)
        async for text in self.pieces(job, reply):
            yield chunks.text(text, logprobs.take(reply))
        tail = reply.finish()
        if tail or reply.unsent_logprobs:
            yield chunks.text(tail, logprobs.take(reply))
        yield chunks.last(reply, job)
        if include_usage:
            yield chunks.usage(reply, job)
