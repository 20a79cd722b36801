"""The bytes one token stands for, which llama.cpp's pieces and OpenAI's logprobs `bytes` give:
a token may hold part of a character, whose bytes its decoded text (a replacement character)
no longer has."""

import re
from functools import cache

from transformers import PreTrainedTokenizerBase
from transformers.convert_slow_tokenizer import bytes_to_unicode

BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback: one byte a token


def token_bytes(tokenizer: PreTrainedTokenizerBase, token: int) -> bytes:
    """The bytes one token stands for: a byte-level BPE's token is its bytes spelled one character
    each (GPT-2's table), a byte-fallback token names its byte; any other token is its text."""
    name = tokenizer.convert_ids_to_tokens(token)
    if name is None:  # a row of the model's padded vocabulary past the tokenizer's: no token, no bytes
        return b""
    if match := BYTE_TOKEN.fullmatch(name):
        return bytes([int(match[1], 16)])
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and type(backend.decoder).__name__ == "ByteLevel" and set(name) <= byte_of().keys():
        return bytes(byte_of()[char] for char in name)
    return tokenizer.decode([token], skip_special_tokens=False).encode()


@cache
def byte_of() -> dict[str, int]:
    """GPT-2's table read backwards: the character a byte-level BPE spells each byte with -> the byte."""
    return {char: byte for byte, char in bytes_to_unicode().items()}
