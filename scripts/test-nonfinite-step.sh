#!/usr/bin/env bash
# A step whose gradients are not finite: a learning rate of 1e30 makes step 1's update overflow the
# weights, so step 2's loss and gradient norm are NaN. keel train must stop with exit 1, naming the
# step, the first parameter whose gradient is not finite, and that the device skipped the update,
# and leave step 1's checkpoint (saved every step) as the newest one, complete.
# Usage: test-nonfinite-step.sh KEEL TEXT WORKDIR [BACKEND]
set -uo pipefail
keel=$1 text=$2 work=$3 backend=${4:-cpu}
rm -rf "$work" && mkdir -p "$work"
fail=0
"$keel" train --preset tiny --data "$text" --steps 5 --window 32 --batch 4 --eval-every 0 --save-every 1 --lr 1e30 \
  --warmup 0 --clip 0 --backend "$backend" --out "$work/run" >"$work/out.log" 2>&1
rc=$?
[ $rc -eq 1 ] || { echo "FAIL: exit $rc, expected 1"; fail=1; }
grep -q "step 2: the loss is nan and the gradient norm nan; first non-finite gradient: model\." "$work/out.log" &&
  grep -q "the update was skipped; no checkpoint written for this step" "$work/out.log" ||
  { echo "FAIL: the message:"; cat "$work/out.log"; fail=1; }
grep -q '"step": 1, ' "$work/run/metrics.jsonl" && ! grep -q '"step": 2, ' "$work/run/metrics.jsonl" ||
  { echo "FAIL: metrics.jsonl should end at step 1"; fail=1; }
"$keel" info "$work/run/checkpoint" --window 32 >"$work/info.log" 2>&1 && grep -q '"step":[[:space:]]*1,' "$work/run/checkpoint/trainer_state.json" ||
  { echo "FAIL: step 1's checkpoint is not whole:"; cat "$work/info.log"; fail=1; }
[ $fail -eq 0 ] && echo "a non-finite step on $backend: exit 1, named, update skipped, step 1's checkpoint intact"
exit $fail
