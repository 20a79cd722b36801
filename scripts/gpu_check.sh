#!/usr/bin/env bash
# Check specchat on a CUDA machine in one command: a ring smaller than a pass reused over several
# passes, a GPTQ target streamed from pinned RAM and from disk, nf4 and int8 drafts, the
# --budget auto probe against measured passes, --offload auto under a --vram-budget that makes the
# default pair stream, and pinned host->device bandwidth against `specchat doctor`'s probe.
# Prints a table with a verdict per check (PASS / FAIL / SKIP with its reason) and exits 1 on any
# FAIL; exits 0 with a message when there is no GPU. The same checks as tests: pytest -m cuda.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c "import specchat" 2>/dev/null; then
    echo "specchat is not installed for $PYTHON: run scripts/install.sh first" >&2
    exit 2
fi
if ! command -v nvidia-smi >/dev/null 2>&1 && ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no NVIDIA GPU found (no nvidia-smi, and torch sees no CUDA device): nothing to check"
    exit 0
fi
exec "$PYTHON" scripts/gpu_check.py
