#!/bin/bash
# float32 `specchat generate`, the old code against the new, alternated in one run.
# OLD_SRC: the src/ of a worktree at the old commit (8fdb1f4); the new code is the installed checkout.
P="Write a Python function that returns the n-th Fibonacci number, with a docstring and two doctests."
run() { # $1 label, $2 PYTHONPATH, $3 engine, $4 new tokens
  PYTHONPATH=$2 python -m specchat generate --dtype float32 --temperature 0 --engine "$3" --max-new-tokens "$4" \
    --json "$P" 2>/dev/null | python -c "import json,sys; s=json.load(sys.stdin)['summary']; print('$1', '$3', \
s['new_tokens'], round(s['tokens_per_s'],3), 'gen_rate', s['gen_rate'], 'draft', round(s['draft_s'],2), \
'target', round(s['target_s'],2))"
}
for e in specexec autoregressive; do run warm-old "$OLD_SRC" $e 8; run warm-new "" $e 8; done
for r in 1 2; do
  for e in specexec autoregressive; do run old "$OLD_SRC" $e 64; run new "" $e 64; done
done
