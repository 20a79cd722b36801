#!/usr/bin/env bash
# Run a command under cgroup memory limits, as Docker, Kubernetes or a systemd service would run
# it, and report per limit: the exit status (137 = killed by the kernel's OOM killer), the peak
# memory charged to the cgroup, and decode tokens/s: the tokens made after the prompt's pass over
# the seconds after it, as scripts/bench_llamacpp.py reads them (`specchat generate --json`'s
# summary less its first event; llama.cpp's eval line, its one-token passes). The page cache is
# dropped before each run, so no run starts with the model's files already read.
#
# usage: sudo scripts/bench_memory_limit.sh [LIMIT_GB ...] [-- COMMAND ...]
#   LIMIT_GB  limits in GB (1e9 bytes); default 4 2 1.5
#   COMMAND   default: specchat generate "Explain what a mutex is." --raw --offload disk
#             --resident-layers 0 --max-new-tokens 32 --json
#   LLAMA_CLI=/path/llama-completion LLAMA_MODEL=/path/model.gguf: also run llama.cpp under each
#             limit on the default command's text, given raw to both (--raw; -no-cnv), so both
#             decode after the same tokens; not with a COMMAND of your own, whose text may differ.
#   TAIL_LINES=8: how many of each run's last stderr lines (the plan, a refusal) to show.
# Needs root and a cgroup v2 hierarchy with the memory controller or a cgroup v1 memory
# hierarchy; where it cannot make a cgroup it prints "skip: <reason>" and exits 0.
# Exits 1 when any run was killed, else 0.
set -euo pipefail

PROMPT="Explain what a mutex is."
LIMITS=()
while (($#)) && [[ "$1" != "--" ]]; do LIMITS+=("$1"); shift; done
((${#LIMITS[@]})) || LIMITS=(4 2 1.5)
OWN_COMMAND=$#
if (($#)); then shift; COMMAND=("$@"); else
    COMMAND=(specchat generate "$PROMPT" --raw --offload disk --resident-layers 0 --max-new-tokens 32 --json)
fi
TAIL_LINES="${TAIL_LINES:-8}"
[[ -n "${LLAMA_CLI:-}" && -z "${LLAMA_MODEL:-}" ]] && { echo "error: LLAMA_CLI needs LLAMA_MODEL (a .gguf)" >&2; exit 2; }
[[ -n "${LLAMA_CLI:-}" && "$OWN_COMMAND" != 0 ]] &&
    { echo "error: LLAMA_CLI runs beside the default command only (the same prompt text)" >&2; exit 2; }
V2_ROOT=/sys/fs/cgroup
V1_ROOT=/sys/fs/cgroup/memory
CGROUP=""  # the cgroup of the run in progress, removed on exit
WORK="$(mktemp -d)"

skip() { echo "skip: $1"; exit 0; }

# v2 when the unified hierarchy at the mount root offers the memory controller (a hybrid
# machine's unified hierarchy does not: its memory controller is v1's).
cgroup_version() {
    if grep -qw memory "$V2_ROOT/cgroup.controllers" 2>/dev/null; then echo 2
    elif [[ -f "$V1_ROOT/memory.limit_in_bytes" ]]; then echo 1
    else echo 0; fi
}

# A v2 child is made under the mount root: it is exempt from the rule that a cgroup holding
# processes cannot hand controllers to its children, so enabling memory there works outside
# containers (inside one the mount root is the container's own cgroup, and this fails).
enable_v2_memory() {
    grep -qw memory "$V2_ROOT/cgroup.subtree_control" && return 0
    echo +memory > "$V2_ROOT/cgroup.subtree_control" 2>/dev/null ||
        skip "cannot enable the memory controller for children of $V2_ROOT (inside a container?)"
}

bytes_of_gb() { awk -v gb="$1" 'BEGIN { printf "%.0f", gb * 1e9 }'; }
gb_of_bytes() { awk -v b="$1" 'BEGIN { printf "%.2f GB", b / 1e9 }'; }

# Swap is capped at zero (v2) or RAM+swap at the limit (v1) so that over the limit the run is
# killed, as in a container started with equal --memory and --memory-swap, instead of being
# measured swapping.
make_cgroup() {  # make_cgroup VERSION LIMIT_BYTES -> sets CGROUP
    local version="$1" limit="$2"
    if [[ "$version" == 2 ]]; then
        CGROUP="$V2_ROOT/specchat-bench-$$"
        mkdir "$CGROUP" 2>/dev/null || skip "cannot make a cgroup under $V2_ROOT (read-only?)"
        echo "$limit" > "$CGROUP/memory.max"
        [[ -f "$CGROUP/memory.swap.max" ]] && echo 0 > "$CGROUP/memory.swap.max"
        echo 1 > "$CGROUP/memory.oom.group"  # an OOM kills the whole command, as in a container
    else
        CGROUP="$V1_ROOT/specchat-bench-$$"
        mkdir "$CGROUP" 2>/dev/null || skip "cannot make a cgroup under $V1_ROOT (read-only?)"
        echo "$limit" > "$CGROUP/memory.limit_in_bytes"
        [[ -f "$CGROUP/memory.memsw.limit_in_bytes" ]] && echo "$limit" > "$CGROUP/memory.memsw.limit_in_bytes"
    fi
    return 0
}

# Only processes this script started can be left in the cgroup (a child the OOM killer spared);
# one may exit between the read and the kill, hence `|| true`. cgroup files report size 0, so
# emptiness is read, not tested with -s.
remove_cgroup() {
    [[ -n "$CGROUP" && -d "$CGROUP" ]] || return 0
    local pid
    while read -r pid; do kill -9 "$pid" 2>/dev/null || true; done < "$CGROUP/cgroup.procs"
    while [[ -n "$(cat "$CGROUP/cgroup.procs")" ]]; do sleep 0.1; done
    rmdir "$CGROUP"
    CGROUP=""
}
trap 'remove_cgroup; rm -rf "$WORK"' EXIT

peak_bytes() {  # the cgroup's high-water mark of charged memory (anonymous and page cache)
    local file="$CGROUP/memory.peak"  # v2, Linux 5.19 and later
    [[ -f "$CGROUP/memory.max_usage_in_bytes" ]] && file="$CGROUP/memory.max_usage_in_bytes"
    if [[ -f "$file" ]]; then cat "$file"; else echo ""; fi
}

drop_page_cache() {
    sync
    echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || skip "cannot drop the page cache (/proc/sys/vm is read-only here)"
}

# Decode speed only, on both sides: specchat's summary counts the prompt's pass (the first event,
# which also makes the first token), llama.cpp's eval line never does. "-" where neither is found.
decode_tokens_per_s() {  # decode_tokens_per_s STDOUT STDERR
    python3 - "$1" "$2" <<'EOF'
import json, re, sys
out, err = (open(path, errors="replace").read() for path in sys.argv[1:3])
record = next((json.loads(line) for line in reversed(out.splitlines()) if line.startswith("{")), None)
if record is not None:
    summary = record["summary"]
    tokens = summary["new_tokens"] - len(record["iterations"][0]["token_ids"])
    seconds = summary["wall_s"] - summary["prefill_s"]
    print(f"{tokens / seconds:.2f}" if tokens > 0 and seconds > 0 else "-")
else:
    rates = re.findall(r"(?<!prompt )eval time.*?([0-9.]+) tokens per second", err)
    print(rates[-1] if rates else "-")
EOF
}

run_limited() {  # run_limited VERSION LIMIT_GB NAME COMMAND...
    local version="$1" limit_gb="$2" name="$3"; shift 3
    local status outcome peak
    drop_page_cache
    make_cgroup "$version" "$(bytes_of_gb "$limit_gb")"
    # The child joins the cgroup before exec, so everything the command starts is charged to it.
    # The outer 2>/dev/null only hides bash's own "Killed" notice; the table reports the kill.
    set +e
    { bash -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' bash "$CGROUP" "$@" \
        > "$WORK/out" 2> "$WORK/err"; } 2>/dev/null
    status=$?
    set -e
    peak="$(peak_bytes)"
    remove_cgroup
    case "$status" in
        0) outcome="completed" ;;
        137) outcome="killed"; KILLED=$((KILLED + 1)) ;;
        *) outcome="failed" ;;
    esac
    printf '| %s | %s GB | %s | %s | %s | %s |\n' "$name" "$limit_gb" "$status" "$outcome" \
        "$([[ -n "$peak" ]] && gb_of_bytes "$peak" || echo "-")" "$(decode_tokens_per_s "$WORK/out" "$WORK/err")"
    tail -n "$TAIL_LINES" "$WORK/err" | sed 's/^/    /'
}

[[ "$(id -u)" == 0 ]] || skip "needs root to make a cgroup and drop the page cache"
VERSION="$(cgroup_version)"
[[ "$VERSION" != 0 ]] || skip "no cgroup v2 memory controller at $V2_ROOT and no v1 memory hierarchy at $V1_ROOT"
[[ "$VERSION" == 2 ]] && enable_v2_memory

KILLED=0
printf -v SHOWN '%q ' "${COMMAND[@]}"
echo "cgroup v$VERSION; command: $SHOWN"
echo "| run | limit | exit | outcome | peak memory | decode tokens/s |"
echo "|---|---|---|---|---|---|"
for limit in "${LIMITS[@]}"; do
    run_limited "$VERSION" "$limit" "$(basename "${COMMAND[0]}")" "${COMMAND[@]}"
    if [[ -n "${LLAMA_CLI:-}" ]]; then
        run_limited "$VERSION" "$limit" llama.cpp "$LLAMA_CLI" -m "$LLAMA_MODEL" -p "$PROMPT" -n 32 --temp 0 -no-cnv
    fi
done
((KILLED == 0)) || { echo "$KILLED run(s) killed"; exit 1; }
