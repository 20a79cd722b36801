#!/bin/bash
# the same disk-tier reply at a fixed seed, old code then new code
P="Write a Python function that checks whether a number is prime."
ARGS=(--offload disk --resident-layers 0 --budget 64 --temperature 0.6 --seed 7 --max-new-tokens 32 --draft-quant int8 --json)
cd /tmp/oldcode && PYTHONPATH=/tmp/oldcode/src python3 -m specchat generate "$P" "${ARGS[@]}" > /tmp/gen8_old.json 2>/tmp/gen8_old.err
cd /work/main && python3 -m specchat generate "$P" "${ARGS[@]}" > /tmp/gen8_new.json 2>/tmp/gen8_new.err
echo done
