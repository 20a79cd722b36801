"""Reference tokens computed once a run, whichever xdist worker asks first.

The real pair's references (HF greedy, seeded autoregressive: 64 float32 one-token passes each,
~40 s on one core of the AMX Xeon) were kept per process, so each worker whose modules used them
decoded them again. Here each kind is a JSON file in a folder every worker of the run shares; an
exclusive flock around "read, or compute and write" makes a second worker wait for the first's
file instead of decoding the same tokens (the kernel drops the lock if a worker dies, and the next
one computes them). The tokens are the same either way: the same float32 weights, code and one
thread per worker.
"""

import fcntl
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

References = list[tuple[list[int], list[int]]]  # (prompt ids, the target's tokens) per prompt


@dataclass(frozen=True)
class SharedTokens:
    directory: Path  # shared by every worker of the run (one process: its own temporary folder)

    def get(self, kind: str, compute: Callable[[], References]) -> References:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{kind}.json"
        with open(self.directory / f"{kind}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if path.exists():
                return [(list(prompt), list(tokens)) for prompt, tokens in json.loads(path.read_text())]
            references = compute()
            path.write_text(json.dumps(references))
            return references
