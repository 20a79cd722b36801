"""llama.cpp's infill request (POST /infill), as llama.vim and llama.vscode send it: the text before
and after the cursor, the start of the cursor's line (`prompt`), and extra context chunks from
other files, laid out as llama.cpp lays them so that the model sees what it sees there:

    [repo]myproject\\n [file_sep]{name}\\n{text} ... [file_sep]filename\\n
    [prefix]{input_prefix}{prompt}[suffix]{input_suffix}[middle]

(without repository tokens, each chunk follows "\\n\\n--- snippet ---\\n\\n"). Every piece of text is
encoded as text: a special token's name typed in the code stays characters. What does not fit is
cut as llama.cpp cuts it: the prefix to its last 3/4 of a 2048-token batch, the suffix to the
batch's last quarter, the extra context to what the context leaves after a batch and twice the
tokens asked for, dropping its oldest tokens first."""

from pydantic import Field

from specchat.serve.fim import FimTokens
from specchat.serve.native_request import NativeRequest
from specchat.serve.schema import Strict

BATCH = 2048  # llama.cpp's default n_batch, which its infill layout is sized by
PREFIX_TAKE = 3 * BATCH // 4
REPO_NAME = "myproject"  # llama.cpp's: the editor does not say which repository
FILE_NAME = "filename"  # llama.cpp's: nor which file the cursor is in
SNIPPET = "\n\n--- snippet ---\n\n"  # a chunk's opening where the model has no file separator


class ExtraChunk(Strict):
    text: str
    filename: str = "tmp"


class InfillRequest(NativeRequest):
    input_prefix: str
    input_suffix: str
    input_extra: list[ExtraChunk] = Field(default_factory=list)
    prompt: str = ""  # the cursor's line so far


class InfillLayout:
    """The token ids of one request, in the layout above."""

    def __init__(self, tokenizer, fim: FimTokens) -> None:
        self.tokenizer, self.fim = tokenizer, fim

    def text(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))

    def special(self, name: str) -> list[int]:
        return list(self.tokenizer.encode(name, add_special_tokens=False))

    def ids(self, request: InfillRequest, context: int, wanted: int | None) -> tuple[list[int], bool]:
        """The prompt's ids, and whether anything was cut to fit."""
        prompt = self.text(request.prompt)
        prefix, suffix = self.text(request.input_prefix), self.text(request.input_suffix)
        extra = self.extra(request.input_extra)
        prefix_take = min(len(prefix), PREFIX_TAKE)
        suffix_take = min(len(suffix), max(0, BATCH // 4 - (2 + len(prompt))))
        core = (self.special(self.fim.prefix) + prefix[len(prefix) - prefix_take:] + prompt
                + self.special(self.fim.suffix) + suffix[:suffix_take] + self.special(self.fim.middle))
        start = list(self.tokenizer.encode(""))  # a BOS, where the model has one
        # llama.cpp's share for the extra context, and never more than leaves a token to decode
        room = min(context - BATCH - 2 * (wanted or 0), context - len(start) - len(core) - 1)
        extra_take = min(len(extra), max(0, room))
        ids = start + extra[len(extra) - extra_take:] + core
        return ids, (prefix_take, suffix_take, extra_take) != (len(prefix), len(suffix), len(extra))

    def extra(self, chunks: list[ExtraChunk]) -> list[int]:
        ids = self.special(self.fim.repo) + self.text(f"{REPO_NAME}\n") if self.fim.repo else []
        for chunk in chunks:
            opening = self.special(self.fim.file_sep) + self.text(f"{chunk.filename}\n") if self.fim.file_sep \
                else self.text(SNIPPET)
            ids += opening + self.text(chunk.text)
        if self.fim.file_sep:
            ids += self.special(self.fim.file_sep) + self.text(f"{FILE_NAME}\n")
        return ids
