"""Constrained decoding: a grammar (a JSON schema, a tool call's format) decides which tokens may
come next, and every engine samples the target from its distribution masked to those tokens.

Why speculation stays exact under a constraint. At position n the constrained target distribution
is p_n restricted to the allowed set G(prefix) and renormalised (then temperature and top-p, as
without one). G depends only on the emitted prefix, so the masked distribution at a tree node
equals the one sequential decoding computes at the same prefix, and sampling.py's argument
(u_n keyed by position, inverse CDF in id order) carries over unchanged: SpecExec's walk emits
exactly what constrained autoregressive decoding emits. The draft only proposes: its tree is grown
through allowed tokens (a node the grammar forbids could never be accepted), which changes how
many tokens an iteration accepts, never which.

The grammar engine is llguidance: its matcher consumes tokens, rolls them back, and fills the
allowed-token bitmask (~15 us at Qwen2.5's 151,936-token vocabulary on the project's CPU)."""

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import llguidance
import llguidance.hf
from llguidance.gbnf_to_lark import any_to_lark
import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from specchat.errors import SpecchatError


class Grammars:
    """Compiles grammars over one tokenizer, whose llguidance form is built once (~1 s)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, vocab_size: int, stop_ids: Collection[int]) -> None:
        # The model's rows may outnumber the tokenizer's words (padding): those are never allowed.
        # The tokenizer may hold words past the model's rows (a token added at load): llguidance
        # needs room for every word, and the masks keep the model's rows only (it cannot emit the rest).
        words = max(vocab_size, len(tokenizer))
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=words, eos_token=sorted(stop_ids))
        self.vocab_size = vocab_size

    def json_schema(self, schema: dict) -> "Grammar":
        """Replies that are JSON documents valid under `schema` (any JSON object for {"type": "object"})."""
        try:
            text = llguidance.LLMatcher.grammar_from_json_schema(schema)
        except ValueError as error:
            raise SpecchatError(f"the JSON schema cannot be compiled: {one_line(str(error))}") from None
        return self.compile(text, "JSON schema")

    def grammar(self, text: str) -> "Grammar":
        """Replies in the language of a grammar written in GBNF (llama.cpp's) or in Lark (llguidance's
        dialect), told apart as llguidance's converter tells them: Lark has a `start:` rule or
        `%llguidance`; GBNF's `root` becomes Lark's `start`."""
        try:
            lark = any_to_lark(text)
        except Exception as error:  # the converter raises GbnfToLarkError, and a bare Exception for a rule not defined
            raise SpecchatError(f"the grammar cannot be compiled: {one_line(str(error))}") from None
        return self.lark(lark)

    def lark(self, grammar: str) -> "Grammar":
        """Replies in the language of a Lark grammar (llguidance's dialect: `%json` embeds a schema)."""
        return self.compile(llguidance.LLMatcher.grammar_from_lark(grammar), "grammar")

    def compile(self, text: str, what: str) -> "Grammar":
        error = llguidance.LLMatcher.validate_grammar(text, self.tokenizer)
        if error and not error.startswith("WARNING"):
            raise SpecchatError(f"the {what} cannot be compiled: {one_line(error)}")
        return Grammar(self.tokenizer, text, self.vocab_size)


def one_line(text: str) -> str:
    return " ".join(text.split())


@dataclass(frozen=True)
class Grammar:
    """A compiled grammar; `start()` gives a fresh state for each reply."""

    tokenizer: llguidance.LLTokenizer
    text: str
    vocab_size: int

    def start(self) -> "Guide":
        matcher = llguidance.LLMatcher(self.tokenizer, self.text, log_level=0)
        if matcher.is_error():
            raise SpecchatError(f"the grammar cannot start: {one_line(matcher.get_error())}")
        return Guide(matcher, self.tokenizer.vocab_size, self.vocab_size)


class Guide:
    """One reply's grammar state, at the tokens it has emitted so far."""

    def __init__(self, matcher: llguidance.LLMatcher, words: int, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size  # the model's rows: the mask's width
        self.words = (words + 31) // 32  # the bitmask's int32s, one bit for each of the tokenizer's `words`

    def allowed(self, paths: Sequence[Sequence[int]] = ((),)) -> torch.Tensor:
        """bool [len(paths), V]: the tokens allowed after the emitted ones and then each path (a
        tree node's tokens below the root). A path the grammar does not take whole (one through the
        end token, after which the grammar has stopped) allows nothing: no child of it can be
        emitted. Paths are checked before they are consumed: a matcher that consumed a token it
        forbids stays in error for good."""
        bitmask = torch.zeros(len(paths), self.words, dtype=torch.int32)
        for row, path in enumerate(paths):
            path = list(path)
            if self.matcher.validate_tokens(path) < len(path):
                continue
            if path and not self.matcher.consume_tokens(path):
                raise ValueError(f"llguidance refused a path it validated: {path} ({self.matcher.get_error()})")
            fill_row(self.matcher, bitmask[row])
            if path:
                self.matcher.rollback(len(path))
        return unpack(bitmask)[:, : self.vocab_size]

    def accept(self, token: int) -> None:
        """Move past an emitted token (one the mask allowed): the end token after the grammar has
        stopped (a whole document: nothing may follow) too, which llguidance consumes."""
        if not self.matcher.consume_token(token):
            raise ValueError(f"token {token} is not allowed here: {self.matcher.get_error()}")


def fill_row(matcher: llguidance.LLMatcher, row: torch.Tensor) -> None:
    """The matcher's allowed-token bits into a contiguous int32 row of a CPU bitmask (what
    llguidance.torch does, without importing torch's compiler with it)."""
    matcher.unsafe_compute_mask_ptr(row.data_ptr(), row.numel() * row.element_size())


def unpack(bitmask: torch.Tensor) -> torch.Tensor:
    """bool [rows, 32 words]: the int32 bitmask [rows, words]'s bits, token by token. Token 32 w + b
    is bit b of word w: written little-endian, a word's bytes lie low first, so the tokens are its
    bytes' bits unpacked low bit first (numpy's unpackbits: ~25 us a row at a 151,936-token
    vocabulary, against ~1.3 ms shifting the words in torch)."""
    little = bitmask.numpy().astype("<i4", copy=False)  # a view on a little-endian host
    bits = np.unpackbits(little.view(np.uint8), axis=-1, bitorder="little")
    return torch.from_numpy(bits.view(np.bool_))


def masked(logits: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """`logits` [..., V] with every token `allowed` [..., V] forbids at -inf (a copy)."""
    return logits.masked_fill(~allowed.to(logits.device), -float("inf"))
