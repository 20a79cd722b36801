"""The default pair through `specchat generate`, as a user runs it: float32 greedy replies under
given options, and the judge of a reply against the target's own greedy reply, run in memory
with the autoregressive engine. A reply passes when its tokens are the same, or differ only where
the reply's token is near-tied (tests/helpers/exactness.py; design.md section 8): batched tree passes and
sequential ones round differently in float32."""

import json
import subprocess
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch
from helpers.exactness import Comparison, ExactnessCheck

from specchat.decoding.events import SamplingParams
from specchat.decoding.forward import CausalLM
from specchat.decoding.stopping import stop_token_ids
from specchat.models.loading import load
from specchat.models.registry import DEFAULT_TARGET
from specchat.runtime import encode_prompt

PROMPT = "Write a Python function that returns the n-th Fibonacci number."
MAX_NEW_TOKENS = 32
GREEDY = SamplingParams(0.0, 1.0, 0)
TIMEOUT_S = 1800  # a first run may assemble and convert the embedded models


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    stderr: str

    @property
    def error(self) -> str:
        """The last line it printed on stderr (a refusal is one line)."""
        lines = [line for line in self.stderr.replace("\r", "\n").splitlines() if line.strip()]
        return lines[-1] if lines else f"exit {self.returncode}, no output"

    @property
    def reply(self) -> dict:
        return json.loads(self.stdout)

    def line_starting(self, prefix: str) -> str | None:
        return next((line for line in self.stderr.splitlines() if line.startswith(prefix)), None)


def generate(workdir: Path, *options: str) -> Run:
    """`specchat generate PROMPT --json` in float32 at temperature 0, with `options` after."""
    command = [sys.executable, "-m", "specchat", "generate", PROMPT, "--dtype", "float32", "--temperature", "0",
               "--max-new-tokens", str(MAX_NEW_TOKENS), "--offload-dir", str(workdir / "offload"), "--json", *options]
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)
    return Run(done.returncode, done.stdout, done.stderr)


class GreedyJudge:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir

    @cached_property
    def reference(self) -> list[int]:
        """The target's greedy reply: in memory, one target pass per token."""
        run = generate(self.workdir, "--engine", "autoregressive", "--offload", "none")
        if run.returncode != 0:
            raise RuntimeError(f"the in-memory autoregressive reply failed: {run.error}")
        return run.reply["token_ids"]

    def compare(self, tokens: list[int]) -> Comparison:
        if tokens == self.reference:
            return Comparison()
        return self.exactness().compare(self.prompt_ids(), self.reference, tokens, GREEDY)

    @cached_property
    def target(self):
        """The target in float32 on the CPU, loaded only when a reply differs: the near-tie test
        reads its logits at the first difference."""
        return load(DEFAULT_TARGET, torch.float32, progress=False)

    def exactness(self) -> ExactnessCheck:
        model, tokenizer = self.target.model, self.target.tokenizer
        return ExactnessCheck(CausalLM(model), stop_token_ids(model, tokenizer), MAX_NEW_TOKENS)

    def prompt_ids(self) -> list[int]:
        return encode_prompt(self.target.tokenizer, PROMPT, raw=False)
