"""llama.cpp's infill route (POST /infill), for the editor plugins built on it (llama.vim,
llama.vscode): the middle at the cursor, from the text around it and chunks of other files, in the
model's fill-in-the-middle format, decoded by the same engines as every other route; llama.cpp's
own reply objects, whole or streamed as server-sent events (without OpenAI's [DONE])."""

from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from specchat.serve.endpoint import Endpoint
from specchat.serve.errors import bad_request
from specchat.serve.infill_cut import LineCut
from specchat.serve.infill_reply import final, partial, picked
from specchat.serve.infill_request import InfillLayout, InfillRequest, wanted_tokens
from specchat.serve.reply import Reply
from specchat.serve.scheduler import Job
from specchat.serve.schema import parse_body, sampling_of, stop_strings


class Infill(Endpoint):
    async def respond(self, request: Request) -> Response:
        """POST /infill, once the key is checked."""
        if self.config.fim is None:
            raise bad_request("/infill: this model has no fill-in-the-middle tokens, so it cannot complete at a "
                              "cursor", "unsupported_parameter", "input_suffix")
        body = parse_body(await request.body(), InfillRequest)
        fields, wanted, sampling = response_fields(body), wanted_tokens(body), sampling_of(body, self.config.sampling)
        ids, truncated = InfillLayout(self.config.tokenizer, self.config.fim).ids(body, self.config.context, wanted)
        if self.config.log_prompts:
            request.state.prompt, request.state.suffix = body.input_prefix + body.prompt, body.input_suffix
        job, reply = self.job(ids, wanted, sampling, "input_prefix"), self.reply(stop_strings(body), sampling)
        cut = LineCut(body.n_indent, body.t_max_predict_ms / 1000)
        if wanted == 0:  # nothing to decode (llama.vim asks so to warm llama.cpp's cache; no cache is warmed here)
            return JSONResponse(picked(final(self.config.model, "", job, reply, False, truncated), fields))
        self.queue(request, job)
        if body.stream:
            chunks = self.stream(job, reply, cut, truncated)
            return StreamingResponse(self.events(request, job, reply, chunks, end=""), media_type="text/event-stream")
        text = await self.collect(request, job, reply, self.kept(job, reply, cut))
        return JSONResponse(picked(final(self.config.model, text, job, reply, cut.hit, truncated), fields))

    async def kept(self, job: Job, reply: Reply, cut: LineCut) -> AsyncIterator[str]:
        """The reply's text as the editor stops keep it."""
        async for text in self.texts(job, reply):
            if kept := cut.push(text):
                yield kept
            if cut.hit:
                return

    async def stream(self, job: Job, reply: Reply, cut: LineCut, truncated: bool) -> AsyncIterator[dict]:
        async for text in self.kept(job, reply, cut):
            yield partial(text, job, reply)
        yield final(self.config.model, "", job, reply, cut.hit, truncated)


def response_fields(body: InfillRequest) -> list[str] | None:
    fields = (body.model_extra or {}).get("response_fields")
    if fields is not None and not (isinstance(fields, list) and all(isinstance(f, str) for f in fields)):
        raise bad_request("response_fields must be a list of strings", param="response_fields")
    return fields
