"""What llama.cpp's own routes share once the prompt's token ids are known: the job, the editor
stops over the reply's text, and llama.cpp's reply objects, whole or streamed as server-sent
events (partial objects, then the final one, without OpenAI's [DONE])."""

from collections.abc import AsyncIterator
from dataclasses import replace

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from specchat.serve.endpoint import Endpoint
from specchat.serve.form import form_of
from specchat.serve.native_stops import LineCut
from specchat.serve.native_reply import final, partial, picked
from specchat.serve.native_request import NativeRequest, response_fields, token_log
from specchat.serve.reply import Reply
from specchat.serve.scheduler import Job
from specchat.serve.penalty_fields import llama_penalties
from specchat.serve.schema import sampling_of, stop_strings


class Native(Endpoint):
    stream_end = ""  # llama.cpp's own stream ends with its last chunk (stop: true)
    async def answer(self, request: Request, body: NativeRequest, ids: list[int], wanted: int | None,
                     truncated: bool, param: str) -> Response:
        """Decode `ids` as `body` asks, at most `wanted` tokens (body's wanted_tokens; `param`: the
        field a prompt too long for the context is blamed on)."""
        fields = response_fields(body)
        form = self.form(form_of(body))
        sampling = replace(sampling_of(body, self.config.sampling), guide=None if form is None else form.start(),
                           token_log=self.logged(token_log(body), "n_probs"))
        asked = llama_penalties(body, self.config.tokenizer, self.config.sampling, body.logit_bias)
        job, reply = self.job(ids, wanted, sampling, param, asked), self.reply(stop_strings(body), sampling)
        cut = LineCut(body.n_indent, body.t_max_predict_ms / 1000)
        if wanted == 0:  # nothing to return: llama.vim sends its context chunks so, to have them computed
            if body.cache_prompt:
                await self.warm(request, self.job(ids, 1, replace(sampling, token_log=None), param))
            return JSONResponse(picked(final(self.config.model, "", job, reply, False, truncated), fields))
        self.queue(request, job)
        if body.stream:
            chunks = self.stream(job, reply, cut, truncated)
            return self.streamed(request, job, reply, chunks)
        text = await self.collect(request, job, reply, self.kept(job, reply, cut))
        return JSONResponse(picked(final(self.config.model, text, job, reply, cut.hit, truncated), fields))

    async def warm(self, request: Request, job: Job) -> None:
        """Run `job` (the prompt and one token, never sent) so that a slot's caches hold the prompt:
        the next request sharing its prefix computes only the rest. A warm-up still waiting when
        another request arrives gives way to it (Scheduler.submit): that request computes what
        they share itself, and a newer warm-up holds newer context."""
        job.warm = True
        self.queue(request, job)
        await self.collect(request, job, self.reply([], job.sampling))
        request.state.tokens = (len(job.prompt_ids), 0)

    async def kept(self, job: Job, reply: Reply, cut: LineCut) -> AsyncIterator[str]:
        """The reply's text as the editor stops keep it."""
        async for text in self.texts(job, reply):
            kept = cut.push(text)
            if cut.hit:  # before the kept text goes out: its logprobs are counted to the cut
                reply.cut(len(cut.text), cut.through)
            if kept:
                yield kept
            if cut.hit:
                return

    async def stream(self, job: Job, reply: Reply, cut: LineCut, truncated: bool) -> AsyncIterator[dict]:
        async for text in self.kept(job, reply, cut):
            yield partial(text, job, reply)
        yield final(self.config.model, "", job, reply, cut.hit, truncated)
