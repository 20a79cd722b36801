"""What a request asks its reply to keep to, and the field it asks in: OpenAI's `response_format`,
llama.cpp's `json_schema` and `grammar` (GBNF, or Lark in llguidance's dialect), Ollama's `format`,
or calls of the tools a `tool_choice` forces. One form a reply: a request asking two is a 400."""

from dataclasses import dataclass, field
from specchat.serve.errors import bad_request
from specchat.serve.schema import Decoded

FORCED_CALL = "a tool_choice that forces a call"  # how a forced tool is named beside another form


@dataclass(frozen=True)
class Form:
    """One form: a JSON schema, a grammar's text, or the functions whose calls the reply makes."""

    field: str  # the request's field that asks for it: a refusal points at it
    schema: dict | None = None
    grammar: str | None = None
    calls: list[dict] = field(default_factory=list)
    one_call: bool = False  # the calls' grammar takes one call, not several (parallel_tool_calls false)


def form_of(request: Decoded, schema: dict | None = None, forced: list[dict] | None = None,
            schema_field: str = "response_format", one_call: bool = False) -> Form | None:
    """The form `request` asks (None: free text): `schema` from its `schema_field` (the Responses
    API's text.format), one or more calls (`one_call`: one) of the `forced` functions of its
    tool_choice, or llama.cpp's `json_schema` and `grammar` fields."""
    forms = [form for form in (Form(schema_field, schema=schema) if schema is not None else None,
                               Form("json_schema", schema=request.json_schema) if request.json_schema is not None
                               else None,
                               Form("grammar", grammar=request.grammar) if request.grammar is not None else None,
                               Form("tools", calls=forced, one_call=one_call) if forced else None)
             if form is not None]
    if len(forms) > 1:
        first, second = (FORCED_CALL if form.calls else form.field for form in forms[:2])
        raise bad_request(f"{first} and {second} ask two forms of one reply: send one", "invalid_value",
                          "tool_choice" if forms[1].calls else forms[1].field)
    return forms[0] if forms else None
