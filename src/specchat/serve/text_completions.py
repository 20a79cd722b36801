"""Text completions (POST /v1/completions): a raw prompt, or a prefix and a suffix to fill in the
middle of, decoded by the same engines as a chat, whole or streamed as server-sent events; a batch
of prompts answered n choices each (one left out), a choice after another, choice p x n + i the
i-th of prompt p, as OpenAI orders them; with `best_of`, each prompt's n choices are the likeliest
of that many candidates. Code editors ask it for completions at the cursor, evaluation harnesses
for scores of continuations (`echo` with `logprobs`)."""

import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from specchat.decoding.events import Engine
from specchat.decoding.guide import Grammar
from specchat.decoding.token_log import TokenLog, TokenLogprobs
from specchat.serve.choices import best_indices, choice_count, choice_sampling
from specchat.serve.endpoint import Endpoint
from specchat.serve.form import form_of
from specchat.serve.reply import Reply
from specchat.serve.scheduler import Job
from specchat.serve.penalty_fields import openai_penalties
from specchat.serve.schema import check_model, parse_body, sampling_of, stop_strings
from specchat.serve.structured import response_schema
from specchat.serve.text_reply import (LegacyLogprobs, TextChunks, joined, logprob_per_token, text_choice,
                                       text_completion)
from specchat.serve.text_request import (TextRequest, candidates_of, check_text_features, completion_tokens,
                                         prompt_ids, prompts_of)


@dataclass
class Choice:
    """One prompt's completion: its job and reply, the prompt's text where it is echoed, and the
    logprobs of its tokens (the echoed prompt's, once scored, then the completion's)."""

    index: int
    job: Job
    reply: Reply
    echoed: str
    logprobs: LegacyLogprobs
    first: "Choice | None" = None  # the first choice of the same prompt, where this is a later one (n > 1)
    scored: dict | None = None
    text: str = ""  # the choice's whole text, once decoded (not streamed)

    @property
    def pair(self) -> tuple[Job, Reply]:
        return self.job, self.reply


class TextCompletions(Endpoint):
    async def respond(self, request: Request) -> Response:
        """POST /v1/completions, once the key is checked: every prompt of a batch is checked before
        any is decoded, then each choice is decoded in turn, as a request of its own."""
        body = parse_body(await request.body(), TextRequest)
        check_text_features(body)
        check_model(body.model, self.config.model)
        prompts = prompts_of(body)
        if self.config.log_prompts:
            request.state.prompt = prompts[0] if len(prompts) == 1 else prompts
            if body.suffix is not None:
                request.state.suffix = body.suffix
        count = choice_count(body.n)
        candidates, form = candidates_of(body, count), self.form(form_of(body, response_schema(body.response_format)))
        choices = [choice for number, prompt in enumerate(prompts)
                   for choice in self.prepare(body, form, prompt, number * candidates, candidates, candidates > count)]
        await self.start(request, body, choices[0])  # before the status: a refusal of the first is one
        if body.stream:
            include_usage = body.stream_options is not None and body.stream_options.include_usage
            return self.streamed_all(request, [choice.pair for choice in choices],
                                     self.stream(request, body, choices, include_usage, count), count)
        return JSONResponse(await self.whole(request, body, choices, candidates, count))

    async def whole(self, request: Request, body: TextRequest, choices: list[Choice], candidates: int,
                    count: int) -> dict:
        """The answer once every choice is decoded: each prompt's `count` likeliest of its `candidates`."""
        for choice in choices:
            if choice.index:
                await self.start(request, body, choice)
            choice.text = choice.echoed + await self.collect(request, choice.job, choice.reply)
        returned = best(choices, candidates, count)
        shown = [joined(choice.scored, choice.logprobs.take(choice.reply)) if body.logprobs is not None else None
                 for choice in returned]  # a ranked reply logs its tokens' logprobs unasked: not shown
        answer = text_completion(self.config.model, [text_choice(index, choice.text, choice.reply, logprobs)
                                                     for index, (choice, logprobs) in enumerate(zip(returned, shown))],
                                 [choice.pair for choice in choices], candidates, [choice.pair for choice in returned])
        request.state.tokens = (answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"])
        return answer

    async def start(self, request: Request, body: TextRequest, choice: Choice) -> None:
        """Score the echoed prompt where asked (once a prompt: its later choices take the first's),
        then queue the choice's reply."""
        choice.scored = choice.first.scored if choice.first else await self.scored_prompt(
            request, body, choice.job.prompt_ids, choice.logprobs)
        self.queue(request, choice.job)

    async def scored_prompt(self, request: Request, body: TextRequest, prompt_ids: list[int],
                            logprobs: LegacyLogprobs) -> dict | None:
        """The echoed prompt's logprobs, where `echo` and `logprobs` ask for them: the target's pass
        over the prompt, run before the reply is queued, on the slot the reply then reuses it in."""
        if not body.echo or body.logprobs is None:
            return None
        top = body.logprobs

        def work(engine: Engine, cancel: threading.Event) -> list[TokenLogprobs]:
            return engine.score(prompt_ids, top)

        return logprobs.prompt(prompt_ids, await self.computed(request, prompt_ids, work, keeps=True))

    def prepare(self, body: TextRequest, form: Grammar | None, prompt: str | list[int], first: int,
                count: int, ranked: bool) -> list[Choice]:
        """The `count` choices answering `prompt`, numbered from `first`: each its job and reply (its
        own seed, serve/choices.py), and the prompt's text when it is echoed before the completion;
        `ranked`: candidates, whose tokens' logprobs are logged to rank them by."""
        stops, wanted = stop_strings(body), completion_tokens(body)
        ids = prompt_ids(prompt, body.suffix, self.config.tokenizer, self.config.fim)
        echoed = (prompt if isinstance(prompt, str) else self.config.tokenizer.decode(ids)) if body.echo else ""
        logs, field = body.logprobs is not None or ranked, "logprobs" if body.logprobs is not None else "best_of"
        choices: list[Choice] = []
        for number in range(count):
            sampling = replace(choice_sampling(sampling_of(body, self.config.sampling), number),
                               guide=None if form is None else form.start(),
                               token_log=self.logged(TokenLog(body.logprobs or 0) if logs else None, field))
            job = self.job(ids, wanted, sampling, "prompt",
                           openai_penalties(body, self.config.tokenizer, self.config.sampling))
            choices.append(Choice(first + number, job, self.reply(stops, sampling), echoed,
                                  LegacyLogprobs(self.config.tokenizer, offset=len(echoed)),
                                  choices[0] if choices else None))
        return choices

    async def stream(self, request: Request, body: TextRequest, choices: list[Choice], include_usage: bool,
                     per_prompt: int) -> AsyncIterator[dict]:
        """Each choice's chunks in turn, then the usage of them all where asked."""
        chunks = TextChunks(self.config.model)
        for choice in choices:
            if choice.index:
                await self.start(request, body, choice)
            async for chunk in self.choice_chunks(chunks, choice):
                yield chunk
        if include_usage:
            yield chunks.summed([choice.pair for choice in choices], per_prompt)

    async def choice_chunks(self, chunks: TextChunks, choice: Choice) -> AsyncIterator[dict]:
        job, reply, logprobs, index = choice.job, choice.reply, choice.logprobs, choice.index
        if choice.echoed:
            yield chunks.text(choice.echoed, choice.scored, index=index)
        async for text in self.pieces(job, reply):
            yield chunks.text(text, logprobs.take(reply), index=index)
        tail = reply.finish()
        if tail or reply.unsent_logprobs:
            yield chunks.text(tail, logprobs.take(reply), index=index)
        yield chunks.last(reply, job, index)


def best(choices: list[Choice], candidates: int, count: int) -> list[Choice]:
    """Each prompt's `count` likeliest of its `candidates` (all of them, in order, where they are as
    many), its choices' order: the best first."""
    if candidates == count:
        return choices
    prompts = [choices[start:start + candidates] for start in range(0, len(choices), candidates)]
    return [own[index] for own in prompts for index in best_indices([logprob_per_token(c.reply) for c in own], count)]
