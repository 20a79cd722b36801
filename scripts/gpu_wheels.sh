#!/usr/bin/env bash
# The wheels a bare GPU machine needs to run specchat's GPU checks (gpu_check.sh and `pytest -m
# cuda`): the device machines have Python 3.12, torch, triton and numpy of their own, no network,
# and not this project's dependencies at its versions. This downloads, into .whl/ (ignored by git),
# every package specchat needs at the version installed here (the versions the suite passed on,
# listed by gpu_wheels.py, which says what is left out and why), as CPython 3.12 (or $PY_VERSION)
# manylinux wheels, and prints the line that installs them there: ~30 MB, so that they and the
# tree travel within a device call's 64 MiB. Run it where specchat is installed
# (scripts/install.sh), then carry .whl to the device.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
DEST=".whl"
packages="$("$PYTHON" scripts/gpu_wheels.py)"  # name==version a line (what is left out: its SKIP)
rm -rf "$DEST"
platforms=()
# pip matches a wheel's glibc tag exactly: every one from 2_17 to 2_34 (llguidance's is 2_31)
for minor in $(seq 34 -1 17); do
    platforms+=(--platform "manylinux_2_${minor}_x86_64")
done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# shellcheck disable=SC2086  # one argument a package
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version "${PY_VERSION:-3.12}" --implementation cp \
    "${platforms[@]}" -d "$DEST" $packages
echo "$(ls "$DEST" | wc -l) wheels, $(du -sh "$DEST" | cut -f1), in $DEST. On the device, carry $DEST and begin with:"
echo "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $DEST/*.whl && export PYTHONPATH=/tmp/site:\$PWD/src || exit;"
