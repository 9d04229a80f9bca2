#!/usr/bin/env bash
# Sampled traces (keel train --trace-sample, the form large models use): a ref and a cpu trace of
# one training step agree within 1e-8 at every node; a cpu trace with the copy-row-limit fault is
# found at its first faulty node; and the sampled flat index reported is a real one.
# Usage: test-trace-sample.sh KEEL TEXT WORKDIR
set -uo pipefail
keel=$1 text=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
common=(--preset small --data "$text" --window 64 --batch 2 --steps 1 --warmup 0 --eval-every 0 --eval-batches 1 --threads 2
        --trace-sample 37)
"$keel" train "${common[@]}" --backend ref --out "$work/ref" --trace "$work/ref.trace" >/dev/null || { echo "FAIL: ref run"; exit 1; }
"$keel" train "${common[@]}" --backend cpu --out "$work/cpu" --trace "$work/cpu.trace" >/dev/null || { echo "FAIL: cpu run"; exit 1; }
KEEL_FAULT=copy-row-limit:100 "$keel" train "${common[@]}" --backend cpu --out "$work/bad" --trace "$work/bad.trace" >/dev/null ||
  { echo "FAIL: faulted run"; exit 1; }
fail=0
out=$("$keel" diff "$work/ref.trace" "$work/cpu.trace" --tolerance 1e-8); rc=$?
[ $rc -eq 0 ] || { echo "FAIL: ref vs cpu (sampled) diverged:"; echo "$out"; fail=1; }
echo "ref vs cpu: $(head -n1 <<<"$out")"
out=$("$keel" diff "$work/cpu.trace" "$work/bad.trace"); rc=$?
[ $rc -eq 1 ] || { echo "FAIL: the fault was not found (exit $rc):"; echo "$out"; fail=1; }
grep -q "first divergence: node 'get_rows" <<<"$out" || { echo "FAIL: expected the embedding GET_ROWS first:"; echo "$out"; fail=1; }
idx=$(grep -o "among the sampled values: [0-9]*" <<<"$out" | grep -o "[0-9]*$")
# the embedding output [128,64,2] holds 16384 values, sampled every ceil(16384/37) = 443; its rows
# of 128 are cut at 100, so the index reported must be a sampled one in the cut part of a row
[ -n "$idx" ] && [ $((idx % 443)) -eq 0 ] && [ $((idx % 128)) -ge 100 ] || { echo "FAIL: reported index '$idx' is not a sampled index in a cut row"; fail=1; }
echo "fault found: $(grep -m1 'first divergence' <<<"$out"); index $idx"
exit $fail
