#!/usr/bin/env bash
# Data-parallel training on CPUs (several processes on loopback, the TCP all-reduce standing in
# for NCCL behind the same interface): (1) 2 ranks give weights and losses bitwise identical to
# 1 process with --accum 2 at the same global batch, and (2) twice the same; (3) with small
# gradient buckets the first bucket's all-reduce starts during the backward pass, and the result
# is still the same bits; (4) a rank that dies, or (5) hangs, stops the others with a message,
# the last checkpoint is intact, and --resume continues to the same end.
# Usage: test-train-dist.sh KEEL TEXT WORKDIR
set -uo pipefail
keel=$1 text=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
common=(--preset small --data "$text" --window 32 --batch 2 --steps 6 --warmup 2 --threads 1 --seed 5 --save-every 2)
fail=0
losses() { grep -o '"step": [0-9]*, "tokens": [0-9]*, "loss": [-0-9.e]*' "$1"; }
"$keel" train "${common[@]}" --nproc 2 --out "$work/dp" >/dev/null || { echo "FAIL: 2-rank run"; exit 1; }
"$keel" train "${common[@]}" --nproc 2 --out "$work/dp2" >/dev/null || { echo "FAIL: second 2-rank run"; exit 1; }
"$keel" train "${common[@]}" --accum 2 --out "$work/one" >/dev/null || { echo "FAIL: 1-process run"; exit 1; }
cmp -s "$work/dp/checkpoint/model.safetensors" "$work/one/checkpoint/model.safetensors" || { echo "FAIL: 2 ranks != 1 process with --accum 2"; fail=1; }
diff <(losses "$work/dp/metrics.jsonl") <(losses "$work/one/metrics.jsonl") >/dev/null || { echo "FAIL: losses differ from 1 process"; fail=1; }
cmp -s "$work/dp/checkpoint/model.safetensors" "$work/dp2/checkpoint/model.safetensors" || { echo "FAIL: two 2-rank runs differ"; fail=1; }
buckets=$(KEEL_DIST_BUCKET_BYTES=65536 KEEL_DIST_VERBOSE=1 "$keel" train "${common[@]}" --nproc 2 --out "$work/dpb" 2>&1 >/dev/null) ||
  { echo "FAIL: 2-rank run with small buckets"; echo "$buckets"; exit 1; }
first=$(grep -m1 "rank 0: bucket 1 of" <<<"$buckets")
n_buckets=$(grep -o "bucket 1 of [0-9]*" <<<"$first" | grep -o "[0-9]*$")
[[ "$first" == *"during the run"* && ${n_buckets:-0} -gt 2 ]] || { echo "FAIL: the first bucket did not start during the backward pass: $first"; fail=1; }
cmp -s "$work/dpb/checkpoint/model.safetensors" "$work/one/checkpoint/model.safetensors" || { echo "FAIL: small buckets change the result"; fail=1; }
echo "small buckets: $first; same bits as 1 process"
for fault in exit hang; do
  start=$(date +%s)
  out=$(KEEL_DIST_FAULT=$fault:1:4 "$keel" train "${common[@]}" --nproc 2 --dist-timeout 3 --out "$work/f-$fault" 2>&1); rc=$?
  took=$(( $(date +%s) - start ))
  [ $rc -ne 0 ] || { echo "FAIL: $fault: exit 0"; fail=1; }
  grep -Eq "rank 0: (lost rank 1|rank 1 did not answer in time)" <<<"$out" || { echo "FAIL: $fault: no message from rank 0:"; echo "$out"; fail=1; }
  [ "$took" -lt 60 ] || { echo "FAIL: $fault: took ${took}s"; fail=1; }
  grep -Eq '"step":[[:space:]]*2,' "$work/f-$fault/checkpoint/trainer_state.json" || { echo "FAIL: $fault: the step-2 checkpoint is not intact"; fail=1; }
  resume=("${common[@]}"); resume[0]=--resume; resume[1]="$work/f-$fault/checkpoint"
  "$keel" train "${resume[@]}" --nproc 2 --out "$work/r-$fault" >/dev/null || { echo "FAIL: $fault: resume"; fail=1; }
  cmp -s "$work/dp/checkpoint/model.safetensors" "$work/r-$fault/checkpoint/model.safetensors" || { echo "FAIL: $fault: resumed run differs"; fail=1; }
  echo "$fault: stopped in ${took}s with '$(grep -Eo 'rank 0: [^;]*' <<<"$out" | head -n1)'; resumed to the same weights"
done
[ $fail -eq 0 ] && echo "2 ranks == 1 process (--accum 2) bitwise; repeatable; failures stop the run and resume"
exit $fail
