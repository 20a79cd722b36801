#!/usr/bin/env bash
# Check specchat's offloading on a CUDA machine: offloaded-vs-resident logits on the GPU, pinned
# host-to-device bandwidth against `specchat doctor`'s probe, and a short specexec run with
# --offload auto. Prints PASS / FAIL lines; exits 0 with a message when there is no GPU.
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
