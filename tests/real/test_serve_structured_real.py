"""The embedded pair behind `specchat serve`, driven by the official `openai` client as agents and
scripts drive it: `chat.completions.parse` with a pydantic model returns the parsed object; a tool
round trip (the call, the tool's result, the final answer) works whole and streamed; logprobs come
with every token; a pydantic-ai agent (a third-party client users run) calls a tool and returns its
structured output through it, over the chat route, the Responses API's and Anthropic's. Greedy, bf16 and
--budget auto: the exactness of constrained decoding is test_real_guided.py's, on float32."""

import json

import anthropic
import openai
import pytest
from helpers.serve_process import serving
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, ToolCallPart
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.providers.openai import OpenAIProvider

pytestmark = pytest.mark.real

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


class Person(BaseModel):
    name: str
    born: int


class Weather(BaseModel):
    city: str
    summary: str


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    with serving(tmp_path_factory.mktemp("serve") / "serve.log", "--temperature", "0") as server:
        client = server.client()
        yield client, client.models.list().data[0].id
    assert server.stopped_cleanly()


def test_parse_returns_the_pydantic_object(chat):
    client, model = chat
    reply = client.chat.completions.parse(
        model=model, response_format=Person, max_tokens=48,
        messages=[{"role": "user", "content": "Who created Python, and in which year was he born?"}])
    person = reply.choices[0].message.parsed
    assert isinstance(person, Person) and person.name and reply.choices[0].finish_reason == "stop"


def test_a_tool_round_trip_whole(chat):
    client, model = chat
    first = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice="required",
                                           max_tokens=48)
    assert first.choices[0].finish_reason == "tool_calls"
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
    result = {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}
    final = client.chat.completions.create(model=model, messages=[*ASK, first.choices[0].message.model_dump(), result],
                                           tools=[WEATHER], tool_choice="none", max_tokens=32)
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls


def test_a_tool_round_trip_streamed(chat):
    """The call arrives as deltas the client joins; the answer to its result streams as text."""
    client, model = chat
    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice="required",
                                                max_tokens=48, stream=True):
        if not chunk.choices:
            continue
        for delta in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"name": "", "arguments": "", "id": None})
            call["id"] = delta.id or call["id"]
            call["name"] += delta.function.name or ""
            call["arguments"] += delta.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and calls[0]["name"] == "get_weather" and calls[0]["id"]
    assert "city" in json.loads(calls[0]["arguments"])
    called = {"role": "assistant", "content": None, "tool_calls": [
        {"id": calls[0]["id"], "type": "function",
         "function": {"name": calls[0]["name"], "arguments": calls[0]["arguments"]}}]}
    result = {"role": "tool", "tool_call_id": calls[0]["id"], "content": "18 C and sunny"}
    answer = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
        model=model, messages=[*ASK, called, result], tools=[WEATHER], tool_choice="none", max_tokens=32,
        stream=True) if chunk.choices)
    assert answer.strip()


def test_logprobs_come_with_every_token(chat):
    client, model = chat
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hello."}],
                                           max_tokens=12, logprobs=True, top_logprobs=3)
    entries, choice = reply.choices[0].logprobs.content, reply.choices[0]
    assert "".join(entry.token for entry in entries) == choice.message.content  # an entry a token of the text
    assert len(entries) == reply.usage.completion_tokens - (choice.finish_reason == "stop")  # the end has none
    for entry in entries:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob == entry.logprob  # greedy: the likeliest token was emitted


def test_a_schema_the_grammar_engine_refuses_is_a_400_naming_the_field(chat):
    client, model = chat
    schema = {"type": "object", "properties": {"a": {"$ref": "#/definitions/nowhere"}}}
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=model, messages=ASK, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "broken", "schema": schema}})
    error = refused.value.body
    assert error["param"] == "response_format" and error["message"].startswith("the JSON schema cannot be compiled")
    assert client.chat.completions.create(model=model, messages=ASK, max_tokens=4).choices  # still serving


def agent_model(api: str, client: openai.OpenAI, model: str) -> object:
    """pydantic-ai's model speaking `api` to the server `client` reaches."""
    if api == "messages":  # Anthropic's API, at the server's root
        return AnthropicModel(model, provider=AnthropicProvider(anthropic_client=anthropic.AsyncAnthropic(
            base_url=str(client.base_url).removesuffix("/v1/"), api_key="unused", max_retries=0, timeout=600)))
    provider = OpenAIProvider(openai_client=openai.AsyncOpenAI(base_url=str(client.base_url), api_key="unused",
                                                               max_retries=0, timeout=600))
    return (OpenAIChatModel if api == "chat" else OpenAIResponsesModel)(model, provider=provider)


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_a_pydantic_ai_agent_calls_a_tool_and_returns_its_output_type(chat, api):
    """pydantic-ai sends its function tools beside an output tool (`final_result`) with
    tool_choice `required` (Anthropic's `any`): the reply must be calls it parses, the function
    tool runs, and the output tool's arguments validate as the agent's output type; through the chat
    completions route, the Responses API's (the function's output sent back as an input item) and
    Anthropic's Messages API's (a tool_result block)."""
    client, model = chat
    asked: list[str] = []

    def get_weather(city: str) -> str:
        """The weather in a city now."""
        asked.append(city)
        return "18 C and sunny"

    agent = Agent(agent_model(api, client, model), output_type=Weather, tools=[get_weather], retries=0)
    result = agent.run_sync(ASK[0]["content"], model_settings={"max_tokens": 64, "temperature": 0})
    called = [part.tool_name for message in result.all_messages() if isinstance(message, ModelResponse)
              for part in message.parts if isinstance(part, ToolCallPart)]
    assert "get_weather" in called and asked and "Paris" in asked[0]
    assert isinstance(result.output, Weather) and "Paris" in result.output.city
