"""llama.cpp's tokenizer routes, which scripts and front ends call to count tokens (SillyTavern's
llama.cpp backend, through /tokenize) and to template chats: POST /tokenize, POST /detokenize and
POST /apply-template. The tokenizer alone answers them: no engine runs, nothing waits in the queue."""

from typing import Any

from pydantic import Field
from transformers import PreTrainedTokenizerBase

from specchat.chat_template import chat_text
from specchat.serve.schema import Message, Strict, template_message, through_template
from specchat.serve.structured import forced_functions, offered_functions
from specchat.serve.text_request import checked_ids
from specchat.serve.token_bytes import token_bytes


class TokenizeRequest(Strict):
    content: str
    add_special: bool = False  # the tokenizer's own additions (a BOS)
    parse_special: bool = True  # a special token's name in the text is that token (false: its characters)
    with_pieces: bool = False


class DetokenizeRequest(Strict):
    tokens: list[int] = []


class TemplateRequest(Strict):
    """The chat route's messages and tools, and tool_choice, which under none declares no tools."""

    messages: list[Message] = Field(min_length=1)
    tools: list[Any] | None = None
    tool_choice: Any = None


def tokenized(tokenizer: PreTrainedTokenizerBase, request: TokenizeRequest) -> dict:
    ids = list(tokenizer.encode(request.content, add_special_tokens=request.add_special,
                                split_special_tokens=not request.parse_special))
    if not request.with_pieces:
        return {"tokens": ids}
    return {"tokens": [{"id": token, "piece": piece(tokenizer, token)} for token in ids]}


def detokenized(tokenizer: PreTrainedTokenizerBase, request: DetokenizeRequest) -> dict:
    ids = checked_ids(request.tokens, len(tokenizer), "tokens")
    return {"content": tokenizer.decode(ids, skip_special_tokens=False)}


def templated(tokenizer: PreTrainedTokenizerBase, request: TemplateRequest) -> dict:
    messages = [template_message(index, message) for index, message in enumerate(request.messages)]
    functions = offered_functions(request.tools, request.tool_choice)
    forced_functions(functions, request.tool_choice)  # a tool_choice the chat route refuses, refused here too
    tools = request.tools if functions else None
    return {"prompt": through_template(tokenizer, lambda: chat_text(tokenizer, messages, tools))}


def piece(tokenizer: PreTrainedTokenizerBase, token: int) -> str | list[int]:
    """The token's text where its bytes are whole UTF-8, else its bytes (a character split across
    tokens), as llama.cpp gives pieces."""
    raw = token_bytes(tokenizer, token)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)
