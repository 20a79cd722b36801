"""Anthropic's Messages API beside OpenAI's, for Claude Code and the Anthropic SDK: POST
/v1/messages mapped onto the job the chat route would queue (serve/anthropic_request.py), decoded by
the same engines, answered as a message whole or streamed as Anthropic's events
(serve/anthropic_reply.py); POST /v1/messages/count_tokens counts a conversation's prompt tokens.
Each refusal is in Anthropic's error shape; the key may come as `x-api-key`, as its clients send it."""

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from specchat.serve import anthropic_reply
from specchat.serve.anthropic_reply import StreamedBlocks, message, message_id, tool_use, whole_content
from specchat.serve.anthropic_request import (Conversation, MessagesRequest, chat_messages, chat_tool_choice,
                                              chat_tools, output_limit, output_schema, stop_sequences)
from specchat.serve.endpoint import Endpoint, ServeConfig
from specchat.serve.errors import APIError
from specchat.serve.form import form_of
from specchat.serve.penalty_fields import openai_penalties
from specchat.serve.reply import Reply
from specchat.serve.scheduler import Job, Scheduler
from specchat.serve.schema import check_model, parse_body, parsed, sampling_of
from specchat.serve.structured import CallHold, forced_functions, offered_functions, split_calls

Handler = Callable[[Request], Awaitable[Response]]


class AnthropicMessages(Endpoint):
    frame = staticmethod(anthropic_reply.frame)
    error_body = staticmethod(anthropic_reply.error_body)
    stream_end = ""  # the last event, message_stop, ends it

    async def respond(self, request: Request) -> Response:
        """POST /v1/messages, once the key is checked."""
        body = parse_body(await request.body(), MessagesRequest)
        check_model(body.model, self.config.model)
        job, reply = self.prepare(body, request)
        self.queue(request, job)
        if body.stream:
            return self.streamed(request, job, reply, self.stream(job, reply))
        text = await self.collect(request, job, reply)
        content, calls = split_calls(text) if reply.may_call else (text, [])
        return JSONResponse(message(self.config.model, message_id(), whole_content(content or "", calls), job, reply,
                                    bool(calls)))

    def prepare(self, body: MessagesRequest, request: Request) -> tuple[Job, Reply]:
        messages = chat_messages(body)
        if self.config.log_prompts:
            request.state.messages = messages
        tools, (choice, one_call) = chat_tools(body.tools), chat_tool_choice(body.tool_choice)
        functions = offered_functions(tools, choice)
        form = self.form(form_of(body, output_schema(body), forced_functions(functions, choice), "output_config.format",
                                 one_call))
        sampling = replace(sampling_of(body, self.config.sampling), guide=None if form is None else form.start())
        job = self.chat_job(messages, tools if functions else None, output_limit(body), sampling, "messages",
                            openai_penalties(body, self.config.tokenizer, self.config.sampling))
        return job, self.reply(stop_sequences(body), sampling, may_call=bool(functions))

    async def stream(self, job: Job, reply: Reply) -> AsyncIterator[dict]:
        """message_start, the text block as it comes (until a call begins), each call's block
        whole, then message_delta (why it stopped, the tokens out) and message_stop."""
        identifier, blocks = message_id(), StreamedBlocks()
        yield {"type": "message_start", "message": message(self.config.model, identifier, [], job)}
        hold = CallHold() if reply.may_call else None
        async for text in self.pieces(job, reply):
            if text := hold.push(text) if hold else text:
                for event in blocks.text(text):
                    yield event
        tail, calls = hold.finish(reply.finish()) if hold else (reply.finish(), [])
        for event in (blocks.text(tail) if tail else []) + blocks.close_text(bool(calls)):
            yield event
        for call in calls:
            for event in blocks.call(tool_use(call)):
                yield event
        ended = message(self.config.model, identifier, [], job, reply, bool(calls))
        yield {"type": "message_delta", "delta": {key: ended[key] for key in ("stop_reason", "stop_sequence")},
               "usage": {"output_tokens": ended["usage"]["output_tokens"]}, "specchat": ended["specchat"]}
        yield {"type": "message_stop"}

    def count(self, body: Conversation) -> dict:
        """POST /v1/messages/count_tokens: the prompt tokens of the conversation, its tools declared."""
        check_model(body.model, self.config.model)
        tools, (choice, _) = chat_tools(body.tools), chat_tool_choice(body.tool_choice)
        return {"input_tokens": len(self.chat_ids(chat_messages(body),
                                                  tools if offered_functions(tools, choice) else None))}


def anthropic_routes(config: ServeConfig, scheduler: Scheduler, authorize: Callable[[Request, str], None]
                     ) -> list[Route]:
    endpoint = AnthropicMessages(config, scheduler)

    def guarded(answer: Handler) -> Handler:
        async def route(request: Request) -> Response:
            try:
                authorize(request, "x-api-key: KEY")
                return await answer(request)
            except APIError as error:
                return JSONResponse(anthropic_reply.error_body(error), status_code=error.status)
        return route

    async def count(request: Request) -> Response:
        return JSONResponse(endpoint.count(parsed(await request.body(), Conversation)))

    return [Route("/v1/messages", guarded(endpoint.respond), methods=["POST"]),
            Route("/v1/messages/count_tokens", guarded(count), methods=["POST"])]
