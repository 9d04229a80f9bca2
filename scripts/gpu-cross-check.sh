#!/usr/bin/env bash
# cpu against cuda on a Qwen3.5-0.8B-shaped model (random init from a seed, batch 1, window 1024):
# three training steps on each backend, on the same machine. The losses must agree within 5e-5
# relative, and keel diff between the two backends' traces of step 1 (every node, 4096 sampled
# values each) must find no node beyond the tolerance whose inputs were within it. The tolerance,
# 1e-6 normalised squared error (1e-3 relative rms), leaves room for float32 reductions with
# cancellation: a per-head gradient summed over 4096 tokens turns input differences of 1e-8 into
# 2.4e-8 (seen on the H200); a wrong kernel (an index off, a row cut short) gives errors of order 1.
# Usage: scripts/gpu-cross-check.sh KEEL OUTDIR
set -uo pipefail
keel=$1 out=$2
data=.gpu-data/moby-dick.txt
work=/tmp/keel-cross
rm -rf $work && mkdir -p $work
common=(--preset "${KEEL_CROSS_PRESET:-0.8b}" --data "$data" --steps 3 --window "${KEEL_CROSS_WINDOW:-1024}" --batch 1 --seed 7 --lr 3e-4 --warmup 0 --eval-every 0
        --eval-batches 1 --trace-step 1 --trace-sample 4096 --trace-max-bytes 4000000000)
"$keel" train "${common[@]}" --backend "${KEEL_CROSS_BACKEND:-cuda}" --out $work/cuda --trace $work/cuda.trace || exit 1
"$keel" train "${common[@]}" --backend cpu --threads "$(nproc)" --out $work/cpu --trace $work/cpu.trace || exit 1
cp $work/cuda/metrics.jsonl "$out/cross-cuda-metrics.jsonl"; cp $work/cpu/metrics.jsonl "$out/cross-cpu-metrics.jsonl"
python3 - $work/cpu/metrics.jsonl $work/cuda/metrics.jsonl <<'PY' || exit 1
import json, sys
def losses(p):
    return [json.loads(l)["loss"] for l in open(p) if '"loss"' in l]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
worst = 0.0
for i, (x, y) in enumerate(zip(a, b)):
    rel = abs(x - y) / abs(x)
    worst = max(worst, rel)
    print(f"step {i + 1}: loss cpu {x:.9g}  cuda {y:.9g}  relative difference {rel:.2e}")
ok = len(a) == 3 and len(b) == 3 and worst <= 5e-5
print(f"losses after 3 steps: worst relative difference {worst:.2e} (limit 5e-5): {'PASS' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
PY
"$keel" diff $work/cpu.trace $work/cuda.trace --tolerance 1e-6 | tee "$out/cross-diff.txt"
rc=${PIPESTATUS[0]}
echo "keel diff cpu vs cuda trace of step 1 (tolerance 1e-6 nmse): $([ $rc -eq 0 ] && echo PASS || echo FAIL)"
exit $rc
