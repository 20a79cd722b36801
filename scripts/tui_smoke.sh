#!/usr/bin/env bash
# Drive `specchat run` in a real terminal (tmux) as a new user would: start, ask a question,
# change the budget with /budget 256 and see the panel follow, cancel a reply, quit.
# Prints what the screen showed at each step; exits non-zero if a step is not seen.
# SPECCHAT_ARGS adds options, e.g. SPECCHAT_ARGS="--offload disk --resident-layers 0".
set -euo pipefail
SESSION="specchat-smoke-$$"
export SPECCHAT_DATA_DIR="${SPECCHAT_DATA_DIR:-$(mktemp -d)}"
WAIT_LOAD="${WAIT_LOAD:-600}"
screen() { tmux capture-pane -p -t "$SESSION"; }
wait_for() {  # wait_for PATTERN SECONDS
    local deadline=$((SECONDS + $2))
    until screen | grep -aq -- "$1"; do
        if ((SECONDS > deadline)); then echo "FAIL: '$1' not seen"; screen; exit 1; fi
        sleep 1
    done
    echo "ok: '$1' seen after ${SECONDS}s"
}
wait_reply_done() {  # a finished reply leaves the screen unchanged (panels move every iteration)
    local last="" now stable=0 deadline=$((SECONDS + $1))
    while ((stable < 8)); do
        if ((SECONDS > deadline)); then echo "FAIL: reply did not finish"; screen; exit 1; fi
        now=$(screen | md5sum); [[ "$now" == "$last" ]] && stable=$((stable + 1)) || stable=0
        last="$now"; sleep 1
    done
    echo "ok: reply finished after ${SECONDS}s"
}
trap 'tmux kill-session -t "$SESSION" 2>/dev/null || true' EXIT
tmux new-session -d -s "$SESSION" -x 160 -y 45 "specchat run --temperature 0 --budget 16 ${SPECCHAT_ARGS:-}; sleep 5"
wait_for "loading" 60
wait_for "Message, or /help" "$WAIT_LOAD"
tmux send-keys -t "$SESSION" "/max-tokens 24" Enter
tmux send-keys -t "$SESSION" "What is a KV cache? One sentence." Enter
wait_for "size 16" 300
wait_for "mean [0-9.]* over" 300
wait_reply_done 600
tmux send-keys -t "$SESSION" "/budget 256" Enter
wait_for "budget 256" 30
tmux send-keys -t "$SESSION" "/max-tokens 200" Enter
sleep 2
tmux send-keys -t "$SESSION" "Write a long story about a tree." Enter
wait_for "size 256" 600
# Key-to-screen latency while decoding: type a marker and time until the terminal shows it.
latencies=()
for marker in zq01 zq02 zq03 zq04 zq05 zq06 zq07 zq08 zq09 zq10 zq11 zq12 zq13 zq14 zq15 zq16 zq17 zq18 zq19 zq20; do
    start=$(date +%s%N)
    tmux send-keys -t "$SESSION" -l "$marker"
    until screen | grep -aq "$marker"; do sleep 0.005; done
    latency=$(( ($(date +%s%N) - start) / 1000000 ))
    latencies+=("$latency")
    echo "key-to-screen latency while decoding: $latency ms"
    tmux send-keys -t "$SESSION" BSpace BSpace BSpace BSpace
    sleep 0.3
done
printf '%s\n' "${latencies[@]}" | sort -n | awk '{v[NR]=$1} END {
    printf "latency over %d samples: median %d ms, p90 %d ms, max %d ms\n", NR, v[int((NR+1)/2)], v[int(NR*0.9)], v[NR] }'
tmux send-keys -t "$SESSION" Escape
wait_for "reply cut" 120
screen | grep -aq "a reply is being written" && { echo "FAIL: a message was refused"; exit 1; }
screen | grep -av "^ *▏ *$" | head -60
tmux send-keys -t "$SESSION" "/quit" Enter
sleep 3
if tmux has-session -t "$SESSION" 2>/dev/null && screen | grep -aq "Message, or /help"; then
    echo "FAIL: app still running after /quit"; exit 1
fi
echo "ok: quit"
