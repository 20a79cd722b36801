"""One chat completion: the request checked and encoded into a job a choice (OpenAI's `n`, one
left out), each queued once the one before it has ended, and their events turned into OpenAI's
reply, whole or streamed as server-sent events, a choice after another."""

from collections.abc import AsyncIterator
from dataclasses import replace

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from specchat.decoding.prediction import Prediction
from specchat.decoding.token_log import TokenLog
from specchat.serve.choices import choice_count, choice_sampling
from specchat.serve.endpoint import Endpoint
from specchat.serve.form import form_of
from specchat.serve.reply import Chunks, Reply, completion
from specchat.serve.scheduler import Job
from specchat.serve.penalty_fields import openai_penalties
from specchat.serve.prediction import predicted_tokens, quoting
from specchat.serve.schema import (ChatRequest, chat_messages, check_chat_features, check_model, parse_body,
                                   requested_tokens, sampling_of, stop_strings)
from specchat.serve.structured import CallHold, forced_functions, offered_functions, response_schema


class ChatCompletions(Endpoint):
    async def respond(self, request: Request) -> Response:
        """POST /v1/chat/completions, once the key is checked."""
        chat = parse_body(await request.body(), ChatRequest)
        check_chat_features(chat)
        check_model(chat.model, self.config.model)
        messages = chat_messages(chat)
        if self.config.log_prompts:
            request.state.messages = messages
        choices = self.prepare(chat, messages)
        self.queue(request, choices[0][0])  # before the status: a refusal of the first is one
        if chat.stream:
            include_usage = chat.stream_options is not None and chat.stream_options.include_usage
            return self.streamed_all(request, choices, self.stream(request, choices, include_usage), len(choices))
        texts = []
        for index, (job, reply) in enumerate(choices):
            if index:
                self.queue(request, job)
            texts.append(await self.collect(request, job, reply))
        answer = completion(self.config.model, texts, choices)
        request.state.tokens = (answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"])
        return JSONResponse(answer)

    def prepare(self, chat: ChatRequest, messages: list[dict]) -> list[tuple[Job, Reply]]:
        """A job and reply a choice, the prompt encoded and the grammar compiled once; each choice with
        its own seed (serve/choices.py), grammar state, logprobs, penalties, mirostat state and place
        in a predicted output (the client's, else the code the last message quotes)."""
        functions = offered_functions(chat.tools, chat.tool_choice)
        form = self.form(form_of(chat, response_schema(chat.response_format),
                                 forced_functions(functions, chat.tool_choice)))
        prompt_ids = self.chat_ids(messages, chat.tools if functions else None)
        stops, wanted = stop_strings(chat), requested_tokens(chat)
        predicted = predicted_tokens(chat.prediction, self.config.tokenizer)

        def choice(index: int) -> tuple[Job, Reply]:
            sampling = replace(choice_sampling(sampling_of(chat, self.config.sampling), index),
                               guide=None if form is None else form.start(),
                               token_log=self.logged(TokenLog(chat.top_logprobs or 0) if chat.logprobs else None,
                                                     "logprobs"),
                               prediction=None if predicted is None else Prediction(predicted))
            job = self.job(prompt_ids, wanted, quoting(sampling, messages, self.config.tokenizer), "messages",
                           openai_penalties(chat, self.config.tokenizer, self.config.sampling))  # as chat_job's
            return job, self.reply(stops, sampling, may_call=bool(functions))

        return [choice(index) for index in range(choice_count(chat.n))]

    async def stream(self, request: Request, choices: list[tuple[Job, Reply]],
                     include_usage: bool) -> AsyncIterator[dict]:
        """Each choice's chunks in turn, then the usage of them all where asked."""
        chunks = Chunks(self.config.model)
        for index, (job, reply) in enumerate(choices):
            if index:
                self.queue(request, job)
            async for chunk in self.choice_chunks(chunks, job, reply, index):
                yield chunk
        if include_usage:
            yield chunks.summed(choices, len(choices))

    async def choice_chunks(self, chunks: Chunks, job: Job, reply: Reply, index: int) -> AsyncIterator[dict]:
        hold = CallHold() if reply.may_call else None
        yield chunks.delta({"role": "assistant", "content": ""}, index=index)
        async for text in self.pieces(job, reply):
            yield chunks.delta({"content": hold.push(text) if hold else text}, logprobs=reply.new_logprobs(),
                               index=index)
        tail, calls = hold.finish(reply.finish()) if hold else (reply.finish(), [])
        if tail or reply.unsent_logprobs:
            yield chunks.delta({"content": tail}, logprobs=reply.new_logprobs(), index=index)
        if calls:
            yield chunks.calls(calls, index)
        yield chunks.last(reply, job, bool(calls), index)
