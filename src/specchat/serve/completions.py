"""One chat completion: the request checked and encoded into a job, queued, and its events
turned into OpenAI's reply, whole or streamed as server-sent events."""

from collections.abc import AsyncIterator
from dataclasses import replace

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from specchat.decoding.token_log import TokenLog
from specchat.serve.endpoint import Endpoint
from specchat.serve.form import form_of
from specchat.serve.reply import Chunks, Reply, completion
from specchat.serve.scheduler import Job
from specchat.serve.penalty_fields import openai_penalties
from specchat.serve.schema import (ChatRequest, chat_messages, check_chat_features, check_model, parse_body,
                                   requested_tokens, sampling_of, stop_strings)
from specchat.serve.structured import CallHold, forced_functions, offered_functions, response_schema


class ChatCompletions(Endpoint):
    async def respond(self, request: Request) -> Response:
        """POST /v1/chat/completions, once the key is checked."""
        chat = parse_body(await request.body(), ChatRequest)
        check_chat_features(chat)
        check_model(chat.model, self.config.model)
        job, reply = self.prepare(chat, request)
        self.queue(request, job)
        if chat.stream:
            include_usage = chat.stream_options is not None and chat.stream_options.include_usage
            return self.streamed(request, job, reply, self.stream(job, reply, include_usage))
        text = await self.collect(request, job, reply)
        return JSONResponse(completion(self.config.model, text, reply, job))

    def prepare(self, chat: ChatRequest, request: Request) -> tuple[Job, Reply]:
        messages = chat_messages(chat)
        if self.config.log_prompts:
            request.state.messages = messages
        functions = offered_functions(chat.tools, chat.tool_choice)
        forced = forced_functions(functions, chat.tool_choice)
        form = self.form(form_of(chat, response_schema(chat.response_format), forced))
        sampling = replace(sampling_of(chat, self.config.sampling), guide=None if form is None else form.start(),
                           token_log=self.logged(TokenLog(chat.top_logprobs or 0) if chat.logprobs else None,
                                                 "logprobs"))
        stops, wanted = stop_strings(chat), requested_tokens(chat)
        job = self.job(self.chat_ids(messages, chat.tools if functions else None), wanted, sampling, "messages",
                       openai_penalties(chat, self.config.tokenizer, self.config.sampling))
        return job, self.reply(stops, sampling, may_call=bool(functions))

    async def stream(self, job: Job, reply: Reply, include_usage: bool) -> AsyncIterator[dict]:
        chunks = Chunks(self.config.model)
        hold = CallHold() if reply.may_call else None
        yield chunks.delta({"role": "assistant", "content": ""})
        async for text in self.pieces(job, reply):
            yield chunks.delta({"content": hold.push(text) if hold else text}, logprobs=reply.new_logprobs())
        tail, calls = hold.finish(reply.finish()) if hold else (reply.finish(), [])
        if tail or reply.unsent_logprobs:
            yield chunks.delta({"content": tail}, logprobs=reply.new_logprobs())
        if calls:
            yield chunks.calls(calls)
        yield chunks.last(reply, job, bool(calls))
        if include_usage:
            yield chunks.usage(reply, job)
