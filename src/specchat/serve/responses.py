"""POST /v1/responses, OpenAI's Responses API, for the agents that speak it: the request mapped
onto the job the chat route would queue (serve/responses_request.py: messages, tools, the form, the
sampling and penalties), decoded by the same engines, and answered as a response object, whole or
streamed as its events (serve/responses_reply.py), each an SSE event named by its type."""

import json
from collections.abc import AsyncIterator
from dataclasses import replace

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from specchat.decoding.token_log import TokenLog
from specchat.serve.endpoint import Endpoint
from specchat.serve.form import form_of
from specchat.serve.penalty_fields import openai_penalties
from specchat.serve.reply import Reply
from specchat.serve.responses_reply import (Events, Shell, StreamedMessage, call_item, logprob_entries, status_of,
                                            whole_output)
from specchat.serve.responses_request import (ResponsesRequest, chat_tool_choice, chat_tools,
                                              check_responses_features, input_messages, output_limit, text_schema,
                                              wants_logprobs)
from specchat.serve.scheduler import Job
from specchat.serve.schema import check_model, parse_body, sampling_of, stop_strings
from specchat.serve.structured import CallHold, forced_functions, offered_functions, split_calls


class Responses(Endpoint):
    stream_end = ""  # the last event, response.completed, ends it
    async def respond(self, request: Request) -> Response:
        """POST /v1/responses, once the key is checked."""
        body = parse_body(await request.body(), ResponsesRequest)
        check_responses_features(body)
        check_model(body.model, self.config.model)
        job, reply = self.prepare(body, request)
        shell = Shell(self.config.model, body)
        self.queue(request, job)
        if body.stream:
            return self.streamed(request, job, reply, self.stream(shell, job, reply))
        text = await self.collect(request, job, reply)
        content, calls = split_calls(text) if reply.may_call else (text, [])
        status = status_of(reply, bool(calls))
        output = whole_output(content or "", calls, status, logprob_entries(reply))
        return JSONResponse(shell.body(job, status, output, reply))

    def prepare(self, body: ResponsesRequest, request: Request) -> tuple[Job, Reply]:
        messages = input_messages(body)
        if self.config.log_prompts:
            request.state.messages = messages
        tools, choice = chat_tools(body.tools), chat_tool_choice(body.tool_choice)
        functions = offered_functions(tools, choice)
        form = self.form(form_of(body, text_schema(body.text), forced_functions(functions, choice), "text.format",
                                 one_call=body.parallel_tool_calls is False))
        log = TokenLog(body.top_logprobs or 0) if wants_logprobs(body) else None
        sampling = replace(sampling_of(body, self.config.sampling), guide=None if form is None else form.start(),
                           token_log=self.logged(log, "include"))
        job = self.chat_job(messages, tools if functions else None, output_limit(body), sampling, "input",
                            openai_penalties(body, self.config.tokenizer, self.config.sampling))
        return job, self.reply(stop_strings(body), sampling, may_call=bool(functions))

    async def stream(self, shell: Shell, job: Job, reply: Reply) -> AsyncIterator[dict]:
        """The response's events: created, the message's text as it comes (until a call begins),
        the calls whole, then completed (or incomplete) with the whole response."""
        events = Events()
        yield events.event("response.created", response=shell.body(job, "in_progress", []))
        yield events.event("response.in_progress", response=shell.body(job, "in_progress", []))
        message, hold = StreamedMessage(events), CallHold() if reply.may_call else None
        async for text in self.pieces(job, reply):
            if text := hold.push(text) if hold else text:
                for event in message.delta(text, logprob_entries(reply)):
                    yield event
        tail, calls = hold.finish(reply.finish()) if hold else (reply.finish(), [])
        status = status_of(reply, bool(calls))
        if tail or (message.opened and reply.unsent_logprobs):
            for event in message.delta(tail, logprob_entries(reply)):
                yield event
        output = [message.item(status)] if message.opened or not calls else []
        if output:
            for event in message.close(status):
                yield event
        for call in map(call_item, calls):
            for event in events.call(len(output), call):
                yield event
            output.append(call)
        yield events.event(f"response.{status}", response=shell.body(job, status, output, reply))

    @staticmethod
    def frame(chunk: dict) -> str:
        """An event on the wire: named by its type, as OpenAI's stream names them."""
        return f"event: {chunk.get('type', 'error')}\ndata: {json.dumps(chunk, ensure_ascii=False)}\n\n"
