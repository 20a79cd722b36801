"""llama.cpp's infill route (POST /infill), for the editor plugins built on it (llama.vim,
llama.vscode): the middle at the cursor, from the text around it and chunks of other files, in the
model's fill-in-the-middle format (serve/infill_request.py), decoded by the same engines as every
other route and answered as llama.cpp answers (serve/native.py)."""

from starlette.requests import Request
from starlette.responses import Response

from specchat.serve.errors import bad_request
from specchat.serve.infill_request import InfillLayout, InfillRequest
from specchat.serve.native import Native
from specchat.serve.native_request import wanted_tokens
from specchat.serve.schema import parse_body


class Infill(Native):
    async def respond(self, request: Request) -> Response:
        """POST /infill, once the key is checked."""
        if self.config.fim is None:
            raise bad_request("/infill: this model has no fill-in-the-middle tokens, so it cannot complete at a "
                              "cursor", "unsupported_parameter", "input_suffix")
        body = parse_body(await request.body(), InfillRequest)
        layout = InfillLayout(self.config.tokenizer, self.config.fim)
        wanted = wanted_tokens(body)
        ids, truncated = layout.ids(body, self.config.context, wanted)
        if self.config.log_prompts:
            request.state.prompt, request.state.suffix = body.input_prefix + body.prompt, body.input_suffix
        return await self.answer(request, body, ids, wanted, truncated, "input_prefix")
