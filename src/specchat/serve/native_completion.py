"""llama.cpp's own completion route (POST /completion), which its scripts and many front ends call:
a raw `prompt` (text, its special tokens' names read as those tokens, or token ids), encoded as
/v1/completions encodes it, decoded by the same engines and answered as llama.cpp answers
(serve/native.py)."""

from starlette.requests import Request
from starlette.responses import Response

from specchat.serve.native import Native
from specchat.serve.native_request import NativeRequest, wanted_tokens
from specchat.serve.schema import parse_body
from specchat.serve.text_request import prompt_ids


class CompletionRequest(NativeRequest):
    prompt: str | list[int]


class NativeCompletion(Native):
    async def respond(self, request: Request) -> Response:
        """POST /completion, once the key is checked."""
        body = parse_body(await request.body(), CompletionRequest)
        if self.config.log_prompts:
            request.state.prompt = body.prompt
        ids = prompt_ids(body.prompt, None, self.config.tokenizer, self.config.fim)
        return await self.answer(request, body, ids, wanted_tokens(body), False, "prompt")
