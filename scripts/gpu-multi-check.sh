#!/usr/bin/env bash
# Data parallelism on 2 GPUs (a machine with at least 2, e.g. the nvidia-h200-x2 kind): a
# Qwen3.5-0.8B-shaped model (keel init --preset 0.8b) at window 1024 trains 20 steps with --nproc 2 (batch 1 per GPU) and on
# 1 GPU at the same global batch (--accum 2). The losses must agree within 1e-5 relative, tokens/s
# must scale by at least 1.8x from 1 to 2 GPUs (1 GPU at batch 1 against 2 GPUs at batch 1 each),
# and a rank that dies or hangs must stop the other within 60 s with a message.
# Usage: scripts/gpu-multi-check.sh KEEL OUTDIR
set -uo pipefail
keel=$1 out=$2
export NCCL_NVLS_ENABLE=0 # NVLink multicast stays off on shared machines
export KEEL_DIST_COLLECTIVE=nccl # refuse, rather than fall back to the TCP sums
data=.gpu-data/moby-dick.txt
work=/tmp/keel-multi
rm -rf $work && mkdir -p $work
n=$(nvidia-smi -L | wc -l)
[ "$n" -ge 2 ] || { echo "needs 2 GPUs, this machine has $n"; exit 1; }
# one fresh 0.8B checkpoint for every run: each then starts in seconds instead of drawing 752M
# random values itself
t0=$(date +%s)
"$keel" init --preset 0.8b $work/init --seed 7 || exit 1
echo "keel init --preset 0.8b: $(( $(date +%s) - t0 )) s"
common=(--model $work/init --data "$data" --steps 20 --window 1024 --batch 1 --seed 7 --lr 3e-4 --warmup 2 --eval-every 0 --eval-batches 1
        --backend cuda)
KEEL_DIST_VERBOSE=1 timeout 300 "$keel" train "${common[@]}" --nproc 2 --out $work/two >$work/two.out 2>$work/two.err || { tail -20 $work/two.out $work/two.err; exit 1; }
grep -m1 "data parallel" $work/two.out; tail -2 $work/two.out; grep -m3 "bucket" $work/two.err
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
# Failures: rank 1 exits or hangs before step 5's first all-reduce; rank 0 must stop with a message
# within 60 s of it. Twice: under --nproc (keel's launcher sees the exit) and with each rank
# started by hand as a multi-host launcher would (rank 0 finds out through NCCL or the TCP link).
stamp() { while IFS= read -r l; do printf '%s %s\n' "$(date +%s.%N)" "$l"; done; }
fail=0
check() { # NAME LOG: the fault's time, the stop's time, rank 0's (or the launcher's) message and exit status
    local name=$1 log=$2 tf te rc line
    tf=$(grep -m1 "KEEL_DIST_FAULT" "$log" | cut -d' ' -f1)
    te=$(grep -Em1 "(rank 0|launcher) exit status" "$log" | cut -d' ' -f1)
    rc=$(grep -Em1 "(rank 0|launcher) exit status" "$log" | awk '{print $NF}')
    line=$(grep -Em1 "rank 0: |stopping the other ranks" "$log" | cut -d' ' -f2-)
    if [ -n "$tf" ] && [ -n "$te" ] && [ "${rc:-0}" -ne 0 ] && [ -n "$line" ]; then
        local took
        took=$(python3 -c "print(f'{$te - $tf:.1f}')")
        echo "$name: stopped ${took}s after the fault (limit 60 s), exit status $rc: $line"
        python3 -c "import sys; sys.exit(0 if $te - $tf <= 60 else 1)" || fail=1
    else
        echo "$name: FAIL (exit status ${rc:-none})"; tail -5 "$log"; fail=1
    fi
}
for fault in exit hang; do
    { KEEL_DIST_FAULT=$fault:1:5 timeout 150 "$keel" train "${common[@]}" --steps 8 --nproc 2 --dist-timeout 30 --out $work/f-$fault; echo "launcher exit status $?"; } 2>&1 | stamp >$work/f-$fault.log
    check "--nproc 2, rank 1 does $fault" $work/f-$fault.log
    port=$((29500 + RANDOM % 1000))
    for r in 1 0; do
        { KEEL_DIST_FAULT=$fault:1:5 KEEL_RANK=$r KEEL_WORLD_SIZE=2 KEEL_MASTER_ADDR=127.0.0.1 KEEL_MASTER_PORT=$port KEEL_LOCAL_RANK=$r \
            timeout 150 "$keel" train "${common[@]}" --steps 8 --dist-timeout 30 --out $work/g-$fault; echo "rank $r exit status $?"; } 2>&1 | stamp >$work/g-$fault-$r.log &
        pid[$r]=$!
    done
    wait ${pid[0]}
    pkill -f "g-$fault" 2>/dev/null; wait ${pid[1]} 2>/dev/null # a hanging rank 1 is the test's to end
    sort -n $work/g-$fault-1.log $work/g-$fault-0.log >$work/g-$fault.log
    check "separate launches, rank 1 does $fault" $work/g-$fault.log
done
cp $work/two.out $work/two.err $work/*.log "$out/" 2>/dev/null # every rank's lines, with their times
exit $fail
