#!/usr/bin/env bash
# Data parallelism on 2 GPUs (a machine with at least 2, e.g. the nvidia-h200-x2 kind): a
# Qwen3.5-0.8B-shaped model at window 1024 trains 20 steps with --nproc 2 (batch 1 per GPU) and on
# 1 GPU at the same global batch (--accum 2). The losses must agree within 1e-5 relative, tokens/s
# must scale by at least 1.8x from 1 to 2 GPUs (1 GPU at batch 1 against 2 GPUs at batch 1 each),
# and a rank that dies or hangs must stop the other within 60 s with a message.
# Usage: scripts/gpu-multi-check.sh KEEL OUTDIR
set -uo pipefail
keel=$1 out=$2
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on shared machines
data=.gpu-data/moby-dick.txt
work=/tmp/keel-multi
rm -rf $work && mkdir -p $work
n=$(nvidia-smi -L | wc -l)
[ "$n" -ge 2 ] || { echo "needs 2 GPUs, this machine has $n"; exit 1; }
common=(--preset 0.8b --data "$data" --steps 20 --window 1024 --batch 1 --seed 7 --lr 3e-4 --warmup 2 --eval-every 0 --eval-batches 1
        --backend cuda)
KEEL_DIST_VERBOSE=1 "$keel" train "${common[@]}" --nproc 2 --out $work/two 2>$work/two.err || { tail -20 $work/two.err; exit 1; }
grep -m3 "bucket" $work/two.err
"$keel" train "${common[@]}" --accum 2 --out $work/one-accum || exit 1
"$keel" train "${common[@]}" --out $work/one || exit 1
cp $work/two/metrics.jsonl "$out/multi-two.jsonl"; cp $work/one-accum/metrics.jsonl "$out/multi-one-accum.jsonl"; cp $work/one/metrics.jsonl "$out/multi-one.jsonl"
python3 - $work/one-accum/metrics.jsonl $work/two/metrics.jsonl $work/one/metrics.jsonl <<'PY' || exit 1
import json, sys
def rows(p):
    return [json.loads(l) for l in open(p) if '"loss"' in l]
a, b, c = rows(sys.argv[1]), rows(sys.argv[2]), rows(sys.argv[3])
worst = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b))
print(f"step 20 loss: 1 GPU (--accum 2) {a[-1]['loss']:.9g}, 2 GPUs {b[-1]['loss']:.9g}; worst relative difference over 20 steps {worst:.2e} (limit 1e-5)")
# tokens/s over steps 6..20 (after warm-up), from the elapsed times
def tps(r, tokens_per_step):
    return (r[-1]["tokens"] - r[4]["tokens"]) / (r[-1]["elapsed_s"] - r[4]["elapsed_s"])
t1, t2 = tps(c, 1024), tps(b, 2048)
print(f"tokens/s: 1 GPU {t1:.0f}, 2 GPUs {t2:.0f}: {t2 / t1:.2f}x (at least 1.8x)")
ok = len(a) == 20 and len(b) == 20 and worst <= 1e-5 and t2 / t1 >= 1.8
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
PY
fail=0
for fault in exit hang; do
    start=$(date +%s)
    msg=$(KEEL_DIST_FAULT=$fault:1:5 "$keel" train "${common[@]}" --steps 8 --nproc 2 --dist-timeout 30 --out $work/f-$fault 2>&1); rc=$?
    took=$(( $(date +%s) - start - 0 ))
    line=$(grep -Em1 "rank 0: " <<<"$msg")
    if [ $rc -ne 0 ] && [ -n "$line" ]; then echo "$fault: rank 0 stopped with: $line (whole run ${took}s)"; else echo "$fault: FAIL (rc $rc)"; tail -5 <<<"$msg"; fail=1; fi
done
exit $fail
