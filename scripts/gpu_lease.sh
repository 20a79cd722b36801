#!/usr/bin/env bash
# What a lent GPU machine should run for issue 48, in one command, so that the plan lives in the
# repository and not in a session's scratch folder. A lease is short (minutes in all), so this runs
# the measurements that decide the next change and nothing else:
#   bench  scripts/bench_copy_contention.py three ways (as it stands, 256 rows a step, no inputs):
#          does a draft step slow down beside the ring's loads, with its inputs pulled (~30 s each)
#   pair   gpu_check.sh --pair on the Llama-3.1 AWQ pair at budget 1024, auto's placement beside
#          --resident-layers 0 (the ring in place of resident layers), one reply traced (~5 min)
#   cuda   the cuda tests (~65 s)
# Each part's output goes to DIR/<part>.log (DIR: the argument, else $OUT, else ./gpu-lease) as well
# as to the terminal; a failed part does not stop the next. It ends with a line a part (its verdict,
# exit status and seconds) and exits 1 if any failed.
#   bash scripts/gpu_lease.sh                  # all three (~7 minutes on an H200)
#   bash scripts/gpu_lease.sh --parts bench,pair
#   bash scripts/gpu_lease.sh --dry-run        # the same commands, shrunk, on any device
# On a machine without the project's packages, carry .whl (scripts/gpu_wheels.sh): this installs
# it into a temporary folder first.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
parts="bench,pair,cuda"
dry=()
dir="${OUT:-gpu-lease}"
while (( $# )); do
    case "$1" in
        --dry-run) dry=(--dry-run) ;;
        --parts) parts="${2:?--parts takes a comma-separated list of bench, pair, cuda}"; shift ;;
        -*) echo "gpu_lease.sh: unknown option $1 (--dry-run, --parts LIST, then a folder)" >&2; exit 2 ;;
        *) dir="$1" ;;
    esac
    shift
done
for part in ${parts//,/ }; do
    if [[ ! "$part" =~ ^(bench|pair|cuda)$ ]]; then
        echo "gpu_lease.sh: no part named '$part' (bench, pair, cuda)" >&2
        exit 2
    fi
done
mkdir -p "$dir"
if ! "$PYTHON" -c "import specchat" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
    site="$(mktemp -d)"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl || exit 1
    export PYTHONPATH="$site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
fi

bench() {
    "$PYTHON" scripts/bench_copy_contention.py "${dry[@]}" \
        && "$PYTHON" scripts/bench_copy_contention.py "${dry[@]}" --rows 256 \
        && "$PYTHON" scripts/bench_copy_contention.py "${dry[@]}" --no-inputs
}
pair() {
    PYTHON="$PYTHON" bash scripts/gpu_check.sh --pair "${dry[@]}" --only llama-3.1-70b-awq --budgets 1024 \
        --also '--resident-layers 0' --trace "$dir"
}
cuda() {
    "$PYTHON" -m pytest -q -rA -p no:cacheprovider -o addopts="" tests/scripts/test_gpu_checks_on_cuda.py -m cuda
}

verdicts=()
failed=0
for part in ${parts//,/ }; do
    echo "== $part"
    start=$SECONDS
    "$part" 2>&1 | tee "$dir/$part.log"
    status=${PIPESTATUS[0]}
    verdict=PASS
    if (( status )); then verdict=FAIL; failed=1; fi
    verdicts+=("$verdict $part: exit $status, $((SECONDS - start)) s, $dir/$part.log")
done
printf '%s\n' "${verdicts[@]}"
exit "$failed"
