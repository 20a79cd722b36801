#!/bin/bash
# time to first token of a ~500-token prompt: old checkout against new, alternating, 2 runs each
PROMPT=$(python -c "
from specchat.bench.datasets import mtbench_first_turns
print(' '.join(mtbench_first_turns(12)))")
for run in 1 2; do
  for tree in /tmp/old /work/main; do
    PYTHONPATH=$tree/src python -m specchat generate --engine autoregressive --temperature 0 --max-new-tokens 1 --json "$PROMPT" 2>/dev/null \
      | python -c "import json,sys; r=json.load(sys.stdin); it=r['iterations'][0]; print('$tree', 'run $run', it['prefill_tokens'], 'tokens, prefill', round(it['prefill_s'],2), 's')"
  done
done
