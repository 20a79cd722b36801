#!/usr/bin/env bash
# Check specchat on a CUDA machine in one command: a ring smaller than a pass reused over several
# passes, a GPTQ target streamed from pinned RAM and from disk, nf4 and int8 drafts, the
# --budget auto probe against measured passes, --offload auto under a --vram-budget that makes the
# default pair stream, pinned host->device bandwidth against `specchat doctor`'s probe, and the
# int4 products at 70B shapes against a float64 reference, a MoE target streamed by expert, and bf16
# SpecExec with its tree passes through the int4 expansion. Prints a table with a verdict per check
# (PASS / FAIL / SKIP with its reason) and a closing line, and exits 1 on any FAIL. The same checks
# as tests: pytest -m cuda.
#   --scale             the paper-scale check: a Llama-2-70B-GPTQ-shaped target streamed through a
#                       ring, its int4 products per linear, a Llama-2-7B-shaped draft (~4 min on an H100)
#   --scale --dry-run   the same code over shrunk widths, on any device (the CPU suite runs it)
#   --pair              the paper's pairs whole with random weights through `specchat generate --json`:
#                       the iteration per budget, its projections on a 24 GB PCIe 4 card (writes ~50 GB; ~5 min a pair on an H200)
#   --pair --dry-run    the same over shrunk models, on any device (the CPU suite runs it)
# Without a GPU (no nvidia-smi, and torch sees no CUDA device) there is nothing to check: exit 0.
# With one that torch cannot use: exit 1, in one line.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c "import specchat" 2>/dev/null; then
    echo "specchat is not installed for $PYTHON: run scripts/install.sh first" >&2
    exit 2
fi
dry_run=0
for arg in "$@"; do
    if [[ "$arg" == --dry-run ]]; then dry_run=1; fi
done
# Why torch cannot use a CUDA device, in one line; nothing when it can. Its warnings go: one line.
cuda_problem() {
    "$PYTHON" - 2>/dev/null <<'PY'
import torch
if not torch.cuda.is_available():
    build = "a CPU-only build: install torch's CUDA wheel" if torch.version.cuda is None else \
        f"built for CUDA {torch.version.cuda}, sees no device: check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES"
    print(f"torch {torch.__version__} is {build}")
PY
}
if (( ! dry_run )) && command -v nvidia-smi >/dev/null 2>&1; then
    problem="$(cuda_problem)"
    if [[ -n "$problem" ]]; then
        echo "nvidia-smi is here but torch cannot use a GPU: $problem" >&2
        exit 1
    fi
fi
exec "$PYTHON" scripts/gpu_check.py "$@"
