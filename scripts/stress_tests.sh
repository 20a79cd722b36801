#!/usr/bin/env bash
# The tests that once raced the clock (TUI, DSI, streamer, serve under load), run RUNS times in a
# row while LOAD busy processes keep every core occupied: a test that decides pass or fail by the
# wall clock fails here sooner or later. Prints one line a run and the count of failed runs; exits
# non-zero when any run failed. Usage: bash scripts/stress_tests.sh [RUNS] (default 20).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS="${1:-20}"
LOAD="${LOAD:-$(nproc)}"  # busy processes beside the tests
TESTS=(tests/tui/test_tui_app.py tests/tui/test_tui_parts.py tests/dsi/test_dsi_engine.py tests/dsi/test_dsi_workers.py
       tests/dsi/test_dsi_jobs.py tests/offload/test_streamer.py tests/serve/test_serve_load.py)

# A private base for tmp_path: pytest removes all but the newest three of its default ones, so a
# concurrent pytest session elsewhere would delete this run's directories under it.
base="$(mktemp -d)"
busy=()
stop_load() { for pid in "${busy[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$base"; }
trap stop_load EXIT
for _ in $(seq "$LOAD"); do
  python3 -c "while True: pass" &
  busy+=("$!")
done

failed=0
# -n 0: each run in one process beside the busy ones, not spread over xdist workers (pyproject's addopts)
for run in $(seq "$RUNS"); do
  start=$(date +%s)
  if python3 -m pytest -q -n 0 -p no:cacheprovider --basetemp "$base/run" -m "not real" "${TESTS[@]}" > "$base/run.log" 2>&1; then
    result="passed"
  else
    result="FAILED"
    failed=$((failed + 1))
    kept="${TMPDIR:-/tmp}/stress_run_$run.log"  # the whole log of a failed run, for its traceback
    cp "$base/run.log" "$kept"
    grep -E "^(FAILED|ERROR)" "$kept" || tail -5 "$kept"
    echo "(log: $kept)"
  fi
  echo "run $run/$RUNS: $result, $(tail -1 "$base/run.log"), $(( $(date +%s) - start )) s with $LOAD busy processes"
done
echo "$failed of $RUNS runs failed"
[ "$failed" -eq 0 ]
