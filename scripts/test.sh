#!/usr/bin/env bash
# Install specchat with its test tools, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS=test bash scripts/install.sh
"${PYTHON:-python3}" -m pytest -q "$@"
