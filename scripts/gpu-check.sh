#!/usr/bin/env bash
# The GPU tier, on a machine with an NVIDIA GPU and no network: builds keel with the CUDA backend
# (sm_90a machine code and compute_90 PTX) and runs the GPU checks, then prints one summary table. Needs, carried from the
# development machine: .gpu-debs (the Debian -dev packages keel builds against, from
# `scripts/gpu-prepare.sh`) and .gpu-data (the fixture and checkpoints, same script).
#   scripts/gpu-check.sh            every stage
#   scripts/gpu-check.sh ops grad   only those stages (build always runs)
# Stages: ops grad fault reference recompute model bf16 adamw hf lora chat cross bench trace, gdn (the delta rule's
# cases, gradients and GPU time alone: a quick first look), gdn-ncu (its kernels' time, issue slots
# and stall reasons under ncu), gdn-ncu16 (the same in the bf16 step, a line a kernel), gdn-sass (those
# kernels under ncu's full set: stall samples by reason, the opcodes' shares of samples and instructions), conv-ncu
# (the DeltaNet conv's heads and value kernels in the bf16 step: the last forward layer's and the first backward's, and
# the first CONV1D_BACK_INPUT's (k_conv4_rows, which also runs the value channels since the thirtieth session);
# with bitwise in the same call, also the base build's, for a same-call before/after), attn (flash attention's cases, gradients, and its kernels' time under
# ncu at the 0.8B shape, batch 8), memory (planned against measured peaks, recompute off and full), lt-survey
# (cuBLASLt's answers timed for each product shape of the bf16 step: the measurement behind cuda_lt.cu's LT_PREFS),
# step-kernels (every kernel of one bf16 step at batch 8 timed alone by ncu, one line a kernel: scripts/ncu_step_table.py),
# bitwise (training byte for byte against a base build: .gpu-data/base.tar, `git archive` of a commit; or BASE_KEEL, one built already;
# BITWISE_OPS=OP,OP adds those ops' test-ops cases, compared line by line with their --bits hashes),
# and multi (needs 2 GPUs) and profile
# (GPU time per op and operand shapes of the bench step) and profile16 (the bf16 batch-8 step: wall
# time, then GPU time per op), which are not in the default list
set -uo pipefail
cd "$(dirname "$0")/.."
# Logs go to a folder of their own and, at exit, into one archive in $OUT (default
# /tmp/keel-gpu-out): a runner that returns only a few files still returns all of them.
final=${OUT:-/tmp/keel-gpu-out}
out=$(mktemp -d /tmp/keel-gpu-logs.XXXXXX)
mkdir -p "$final"
pack() { tar -czf "$final/gpu-logs.tar.gz" -C "$out" . 2>/dev/null && echo "logs: $final/gpu-logs.tar.gz"; }
trap pack EXIT
trap 'exit 143' TERM INT
stages=${*:-ops grad fault reference recompute trace model bf16 adamw hf lora chat cross bench}
want() { [[ " $stages " == *" $1 "* ]]; }
declare -a rows
record() { rows+=("$(printf '%-44s %-6s %s' "$1" "$2" "$3")"); [ "$2" = PASS ] || status=1; }
status=0
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
nproc

# -- build: the -dev packages unpacked into a private prefix
deps=/tmp/keel-deps
mkdir -p $deps
for f in .gpu-debs/*.deb; do dpkg -x "$f" $deps; done
lib=$deps/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# NCCL: the toolkit's, else the one PyTorch's wheels bring (its header, else the copy
# gpu-prepare.sh took from the development machine's toolkit)
nccl=()
if [ ! -e /usr/local/cuda/lib64/libnccl.so ] && [ ! -e /usr/local/cuda/lib/libnccl.so ]; then
    nl=$(python3 -c 'import glob, os, site
for d in site.getsitepackages():
    for p in sorted(glob.glob(os.path.join(d, "nvidia", "**", "libnccl.so*"), recursive=True)): print(p); raise SystemExit' 2>/dev/null)
    if [ -n "$nl" ]; then
        ni=$(dirname "$(dirname "$nl")")/include
        [ -e "$ni/nccl.h" ] || ni=$PWD/.gpu-data/nccl-include
        nccl=(-DNCCL_LIBRARY="$nl" -DNCCL_INCLUDE_DIR="$ni")
        export LD_LIBRARY_PATH=$(dirname "$nl"):$LD_LIBRARY_PATH
        echo "NCCL: $nl, header from $ni"
    fi
fi
# build_tree SRC BUILD LOG: keel with the CUDA backend from the sources in SRC into BUILD
build_tree() {
    cmake -S "$1" -B "$2" "${nccl[@]}" -DCMAKE_BUILD_TYPE=Release -DKEEL_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="90a-real;90-virtual" \
        -DCMAKE_PREFIX_PATH=$deps/usr -DCMAKE_LIBRARY_PATH=$lib -DCMAKE_INCLUDE_PATH=$deps/usr/include >"$out/$3" 2>&1 &&
        cmake --build "$2" -j "$(nproc)" >>"$out/$3" 2>&1
}
t0=$(date +%s)
if build_tree . build-gpu build.log; then
    record "build (CUDA backend, sm_90a + PTX)" PASS "$(( $(date +%s) - t0 )) s"
else
    tail -40 "$out/build.log"
    record "build (CUDA backend, sm_90a + PTX)" FAIL "see build.log"
    printf '%s\n' "${rows[@]}"
    exit 1
fi
keel=./build-gpu/keel
fx=.gpu-data/fixture

# run NAME LOGFILE CMD...: PASS when the command exits 0; the log's last line is the detail
run() {
    local name=$1 log=$2; shift 2
    local t=$(date +%s)
    "$@" >"$out/$log" 2>&1
    local rc=$?
    local tail_line
    tail_line=$(grep -v '^$' "$out/$log" | tail -n 1 | cut -c1-90)
    if [ $rc -eq 0 ]; then record "$name" PASS "$tail_line ($(( $(date +%s) - t ))s)"; else record "$name" FAIL "rc=$rc: $tail_line"; tail -25 "$out/$log"; fi
}

# The cpu-vs-cuda cross check spends minutes on the cpu backend: it runs in the background on
# three quarters of the cores while the other stages use the rest, and the timed stages (bench,
# profile) wait for it.
cross_pid=
if want cross; then
    n=$(nproc)
    cross_t=$(date +%s)
    if command -v taskset >/dev/null && [ "$n" -ge 8 ]; then
        lo=$((n / 4))
        taskset -c "$lo-$((n - 1))" scripts/gpu-cross-check.sh "$keel" "$out" >"$out/cross.log" 2>&1 &
        cross_pid=$!
        taskset -pc "0-$((lo - 1))" $$ >/dev/null
    else
        scripts/gpu-cross-check.sh "$keel" "$out" >"$out/cross.log" 2>&1 &
        cross_pid=$!
    fi
fi
finish_cross() {
    [ -n "$cross_pid" ] || return 0
    wait "$cross_pid"
    local rc=$? tail_line
    cross_pid=
    tail_line=$(grep -v '^$' "$out/cross.log" | tail -n 1 | cut -c1-90)
    if [ $rc -eq 0 ]; then record "0.8B: cpu vs cuda, 3 steps" PASS "$tail_line ($(( $(date +%s) - cross_t ))s)"
    else record "0.8B: cpu vs cuda, 3 steps" FAIL "rc=$rc: $tail_line"; tail -25 "$out/cross.log"; fi
    grep -E "^step|worst|largest|divergence" "$out/cross.log" | head -12
}

# attention's backward with its dS in slabs (300000 bytes: the 3-example bf16 case in slabs of 2
# and 1) and without dS (0: dq recomputes the scores), beside the default (every example at once)
attn_ds_paths() {
    for ds in 300000 0; do
        run "test-ops FLASH_ATTN_BACK, dS budget $ds (cuda)" attn-ds$ds.log env KEEL_CUDA_FA_DS_BYTES=$ds $keel test-ops --backend ref,cuda --op FLASH_ATTN_BACK
        grep "^cuda:\|FAIL" "$out/attn-ds$ds.log" | head -20
    done
}
if want ops; then
    run "test-ops --backend cuda (forward)" ops.log $keel test-ops --backend ref,cuda
    grep "^cuda:" "$out/ops.log"
    want attn || attn_ds_paths
    run "fused ops = the ops they replace (bitwise)" fused.log ./build-gpu/test_fused
    grep "^cuda" "$out/fused.log"
fi
if want gdn; then # the chunked gated delta rule alone: its cases, its gradients, its time in the bf16 step
    run "test-ops GATED_DELTA_NET* (cuda)" gdn-ops.log $keel test-ops --backend ref,cuda --op GATED_DELTA_NET,GATED_DELTA_NET_BACK,GATED_DELTA_NET_STATE
    grep "^cuda:\|FAIL" "$out/gdn-ops.log" | head -20
    run "test-ops --grad GATED_DELTA_NET (cuda)" gdn-grad.log $keel test-ops --grad --backend cuda --op GATED_DELTA_NET
    grep "^cuda:\|FAIL\|worst" "$out/gdn-grad.log" | head -20
    for p in bf16 f32; do # the issue's shape: batch 8, window 1024, 16 heads of 128; per layer: / 18 layers / 3 steps
        run "GPU time of the delta rule, $p batch 8" gdn-profile-$p.log env KEEL_CUDA_PROFILE=1 $keel bench train --backend cuda --precision $p --batch 8 --no-torch --steps 3
        grep "GATED_DELTA" "$out/gdn-profile-$p.log" | head -4
    done
fi
if want attn; then # flash attention alone: its cases, its gradients, its kernels at bf16 batch 8
    run "test-ops FLASH_ATTN* (cuda)" attn-ops.log $keel test-ops --backend ref,cuda --op FLASH_ATTN,FLASH_ATTN_BACK
    grep "^cuda:\|FAIL" "$out/attn-ops.log" | head -20
    # the mma.sync kernels the warpgroup ones replace on Hopper (still those of other GPUs)
    run "test-ops FLASH_ATTN* (cuda, KEEL_CUDA_WGMMA=0)" attn-ops-mma.log env KEEL_CUDA_WGMMA=0 $keel test-ops --backend ref,cuda --op FLASH_ATTN,FLASH_ATTN_BACK
    grep "^cuda:\|FAIL" "$out/attn-ops-mma.log" | head -20
    attn_ds_paths
    run "test-ops --grad FLASH_ATTN (cuda)" attn-grad.log $keel test-ops --grad --backend cuda --op FLASH_ATTN
    grep "^cuda:\|FAIL\|worst" "$out/attn-grad.log" | head -20
    # a layer's four kernels (the 6th forward, then the first backward's delta, dk dv, dq)
    ncu_a='regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$,gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum'
    run "ncu: attention's kernels (bf16 batch 8)" attn-ncu.log ncu --clock-control none -k regex:k_fa --launch-skip 5 --launch-count 4 --metrics "$ncu_a" $keel bench train --backend cuda --precision bf16 --batch 8 --no-torch --steps 1
    grep -E '^  (void )?k_fa|duration|hmma|issue_active|warps_active|wavefronts' "$out/attn-ncu.log"
fi
if want gdn-ncu; then # the delta rule's kernels under ncu: the last forward layer's three, the first backward's six
    ncu_m='regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$,gpu__time_duration.sum,smsp__inst_executed.sum,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active'
    run "ncu: the delta rule's kernels (f32 batch 8)" gdn-ncu.log ncu --clock-control none -k "regex:k_gdn_(prep|state|out|pre_back|contract|grads)" --launch-skip 51 --launch-count 9 --metrics "$ncu_m" $keel bench train --backend cuda --precision f32 --batch 8 --no-torch --steps 1
    grep -E '^  k_gdn|duration|fma_cycles|issue_active.avg' "$out/gdn-ncu.log"
fi
if want gdn-ncu16; then # the same for the bf16 step, whose backward reads the states its forward carried: the last
    # forward layer's two kernels (the preparation; the state pass, which makes the output) and the first backward's
    # four, a line each (scripts/ncu_table.py); the filter leaves out the gate's kernels (GDN_GATE), launched between
    ncu_m='regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$,gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active'
    run "ncu: the delta rule's kernels (bf16 batch 8)" gdn-ncu16.log bash -c "ncu --csv --clock-control none -k regex:'k_gdn_(prep|state|out|pre_back|contract|grads)' --launch-skip 34 --launch-count 6 --metrics '$ncu_m' $keel bench train --backend cuda --precision bf16 --batch 8 --no-torch --steps 1 >$out/gdn-ncu16.csv && python3 scripts/ncu_table.py $out/gdn-ncu16.csv"
    cat "$out/gdn-ncu16.log"
fi
if want gdn-sass; then # the same six kernels under ncu's full set: per kernel, stall samples by reason and the
    # opcodes' shares of samples and instructions (scripts/ncu_sass_mix.py); the report stays in the logs
    run "ncu --set full: the delta rule's kernels (bf16 batch 8)" gdn-sass.log bash -c "ncu --clock-control none --set full --import-source no -k regex:'k_gdn_(prep|state|out|pre_back|contract|grads)' --launch-skip 34 --launch-count 6 -o $out/gdn-sass -f $keel bench train --backend cuda --precision bf16 --batch 8 --no-torch --steps 1 && ncu -i $out/gdn-sass.ncu-rep --page source --csv --print-source sass >$out/gdn-sass.csv && python3 scripts/ncu_sass_mix.py $out/gdn-sass.csv"
    grep -A2 "^k_gdn" "$out/gdn-sass.log"
fi
if want grad; then
    run "test-ops --backend cuda --grad" grad.log $keel test-ops --grad --backend cuda
    grep "^cuda:\|worst passing" "$out/grad.log"
fi
if want fault; then
    run "fault copy-row-limit:1024 ACC,SET,CPY,CONT" fault.log env KEEL_FAULT=copy-row-limit:1024 $keel test-ops --backend cuda --op ACC,SET,CPY,CONT --expect-fault 1024
    run "fault copy-row-limit:1024 gradients" fault-grad.log env KEEL_FAULT=copy-row-limit:1024 $keel test-ops --grad --backend cuda --op ACC,SET,VIEW --expect-fault 1024
fi
if want reference; then
    run "check-reference --backend cuda" reference.log $keel check-reference $fx --backend cuda
    grep -i "worst\|max\|passed" "$out/reference.log" | tail -5
    # the same model at seeds 1 to 7, each tensor's error pooled over them (tests/fixtures/README.md)
    run "check-reference seeds 1-7 --backend cuda (pooled)" reference-seeds.log $keel check-reference tests/fixtures/qwen35-tiny-seeds --backend cuda
    grep "alone\|worst\|passed" "$out/reference-seeds.log"
fi
if want recompute; then
    run "test-recompute --backend cuda (bitwise)" recompute.log $keel test-recompute --backend cuda --fixture $fx/causal-f32-sharded
fi
if want trace; then # the tracer on cuda: two runs agree node for node, and the trace names each product's algorithm
    tdir=$(mktemp -d /tmp/keel-trace.XXXXXX)
    run "tracer on cuda: two runs, keel diff finds no divergence" trace.log bash -c "$keel check-reference $fx --checkpoint causal-f32-sharded --backend cuda --precision bf16 --trace $tdir/a.bin >/dev/null && $keel check-reference $fx --checkpoint causal-f32-sharded --backend cuda --precision bf16 --trace $tdir/b.bin >/dev/null && $keel diff $tdir/a.bin $tdir/b.bin"
    tail -2 "$out/trace.log"
    run "the trace records cuBLASLt's algorithms" trace-algo.log bash -c "strings $tdir/a.bin | grep -m 4 'cublasLt algo'"
    cat "$out/trace-algo.log"
fi
if want model; then # the layer pair (plain, LoRA) against finite differences, packed windows = examples alone
    run "test-model --backend cuda (pair, LoRA, packing)" model.log $keel test-model --backend cuda
    grep "packing on\|worst" "$out/model.log"
fi
if want bf16; then # mixed precision: PyTorch autocast's own errors on the fixture, keel's within 1.5x of them
    run "peer: PyTorch autocast bf16 errors (fixture)" peer-bf16.log python3 tests/fixtures/tools/peer_errors.py $fx "$out/peer-bf16.json" bf16
    cat "$out/peer-bf16.log"
    [ -e $fx/peer-bf16.json ] || cp "$out/peer-bf16.json" $fx/ 2>/dev/null
    run "check-reference --precision bf16 (ref,cpu,cuda)" bf16-ref.log $keel check-reference $fx --precision bf16 --backend ref,cpu,cuda
    grep -i "worst\|passed\|above" "$out/bf16-ref.log" | tail -4
    run "check-reference seeds 1-7 --precision bf16 --backend cuda (pooled)" bf16-ref-seeds.log $keel check-reference tests/fixtures/qwen35-tiny-seeds --precision bf16 --backend cuda
    grep "alone\|worst\|passed" "$out/bf16-ref-seeds.log"
    run "test-recompute --precision bf16 --backend cuda" bf16-recompute.log $keel test-recompute --backend cuda --precision bf16 --fixture $fx/causal-f32-sharded
    run "test-ops --grad: products, fused LM head (cuda)" bf16-grad.log $keel test-ops --grad --backend cuda --op MUL_MAT,OUT_PROD,LINEAR_CROSS_ENTROPY
    grep "^cuda:" "$out/bf16-grad.log"
    run "bench train --precision bf16 --batch 8 (vs autocast)" bf16-bench.log $keel bench train --backend cuda --precision bf16 --batch 8 --torch bench/torch_qwen35.py
    tail -5 "$out/bf16-bench.log"
    run "bench train bf16 --batch 8 --recompute full" bf16-bench-full.log $keel bench train --backend cuda --precision bf16 --batch 8 --recompute full --no-torch
    tail -3 "$out/bf16-bench-full.log"
    run "GPU time per op, bf16 batch 8 (KEEL_CUDA_PROFILE)" bf16-profile.log env KEEL_CUDA_PROFILE=1 $keel bench train --backend cuda --precision bf16 --batch 8 --no-torch --steps 3
    grep -A40 "cuda profile" "$out/bf16-profile.log" | head -45
fi
if want adamw; then # the optimizer step: its cases, a NaN step on the device, its GPU time at bf16 batch 8
    run "test-ops SUM_SQ, ADAMW (cuda)" adamw-ops.log $keel test-ops --backend ref,cuda --op SUM_SQ,ADAMW
    grep "^cuda:" "$out/adamw-ops.log"
    run "a NaN step on cuda: stopped, update skipped" adamw-nan.log scripts/test-nonfinite-step.sh $keel .gpu-data/moby-dick.txt /tmp/keel-nonfinite cuda
    run "AdamW + SUM_SQ GPU time, bf16 batch 8" adamw-prof.log env KEEL_CUDA_PROFILE=1 $keel bench train --backend cuda --precision bf16 --batch 8 --no-torch --steps 3
    grep -E '^  (ADAMW|SUM_SQ) |^cuda +[0-9]' "$out/adamw-prof.log"
fi
if want memory; then # the plan against the device: keel info's cuda total and bench's measured peak, recompute off and full
    for rc in off full; do
        run "bench train bf16 batch 8, recompute $rc: planned vs measured" mem-$rc.log $keel bench train --backend cuda --precision bf16 --batch 8 --recompute $rc --no-torch --steps 3
        grep -E "^cuda +[0-9]|planned before" "$out/mem-$rc.log"
    done
    run "keel info --precision bf16 --batch 8 (0.8B, cuda column)" mem-info.log bash -c "$keel init /tmp/keel-c08 --preset 0.8b >/dev/null && $keel info /tmp/keel-c08 --precision bf16 --batch 8 --recompute full --peak"
    grep -E "^(off|full) |cuda scratch at|peaks at node" "$out/mem-info.log"
fi
if want hf; then
    run "transformers loads keel's checkpoints" hf.log python3 scripts/hf_load_check.py .gpu-data
fi
if want lora; then
    # LoRA against PEFT: keel trains an adapter on the fixture's model on the GPU (resumed bitwise),
    # PEFT loads it, the logits agree (keel unmerged, keel merge, PEFT), and check-reference
    # compares keel's adapter gradients on ref, cpu and cuda with PEFT's in float64
    lo=$(mktemp -d /tmp/keel-lora.XXXXXX)
    lt=(--model $fx/causal-f32-sharded --data .gpu-data/moby-dick.txt --backend cuda --lora-rank 4 --lora-alpha 8
        --lora-dropout 0.1 --steps 20 --window 64 --batch 4 --lr 1e-2 --eval-every 10)
    run "LoRA: train an adapter on cuda, 20 steps" lora-train.log $keel train "${lt[@]}" --out $lo/run
    run "LoRA: resumed; recompute full: bitwise" lora-resume.log bash -c "$keel train ${lt[*]} --out $lo/half --stop-at 10 && $keel train --resume $lo/half --backend cuda && cmp $lo/run/checkpoint/adapter_model.safetensors $lo/half/checkpoint/adapter_model.safetensors && cmp $lo/run/checkpoint/optimizer.safetensors $lo/half/checkpoint/optimizer.safetensors && $keel train ${lt[*]} --out $lo/rc --recompute full && cmp $lo/run/checkpoint/adapter_model.safetensors $lo/rc/checkpoint/adapter_model.safetensors && echo resumed and recompute-full runs: adapter and moments byte-identical"
    # keel's float32 logits on 512 ids, for the model and three copies of it with every weight one ulp
    # off: peft_check pools the float32 errors over the four (one sample is a draw, see the script)
    li=(--adapter $lo/run/checkpoint --batch 8 --window 64)
    run "LoRA: keel info --adapter --dump-logits (4 realizations)" lora-info.log bash -c "$keel info $fx/causal-f32-sharded ${li[*]} --dump-logits $lo/keel-logits.safetensors && for i in 1 2 3; do python3 scripts/perturb_weights.py $fx/causal-f32-sharded $lo/base-\$i \$i && $keel info $lo/base-\$i ${li[*]} --dump-logits $lo/keel-logits-\$i.safetensors || exit 1; done"
    run "LoRA: keel merge" lora-merge.log $keel merge $fx/causal-f32-sharded $lo/run/checkpoint $lo/merged
    run "LoRA: PEFT loads keel's adapter; logits agree" lora-peft.log python3 scripts/peft_check.py $fx/causal-f32-sharded $lo/run/checkpoint $lo/keel-logits.safetensors $lo/merged $fx $lo/ref $lo/base-1:$lo/keel-logits-1.safetensors $lo/base-2:$lo/keel-logits-2.safetensors $lo/base-3:$lo/keel-logits-3.safetensors
    cat "$out/lora-peft.log"
    run "LoRA: check-reference --adapter vs PEFT f64" lora-ref.log $keel check-reference $lo/ref --adapter $lo/run/checkpoint --backend ref,cpu,cuda
    grep -i "worst\|passed" "$out/lora-ref.log" | tail -3
    if [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; then # data parallel over NCCL: 2 GPUs against --accum 2 on one
        ld=(--model $fx/causal-f32-sharded --data .gpu-data/moby-dick.txt --backend cuda --lora-rank 4 --lora-dropout 0.1
            --steps 10 --window 64 --batch 2 --lr 1e-2 --eval-every 0)
        run "LoRA: --nproc 2 (NCCL) vs --accum 2" lora-dp.log bash -c "$keel train ${ld[*]} --accum 2 --out $lo/acc && $keel train ${ld[*]} --nproc 2 --out $lo/dp && diff <(grep -o '\"loss\": [0-9.e-]*' $lo/acc/metrics.jsonl) <(grep -o '\"loss\": [0-9.e-]*' $lo/dp/metrics.jsonl) && cmp $lo/acc/checkpoint/adapter_model.safetensors $lo/dp/checkpoint/adapter_model.safetensors && echo 10 steps: losses and adapter identical"
    fi
    run "LoRA: bench train --lora-rank 16 vs full" lora-bench.log $keel bench train --backend cuda --batch 1 --window 1024 --recompute full --lora-rank 16 --base-dtype bf16 --no-torch
    tail -6 "$out/lora-bench.log"
fi
if want chat; then
    run "chat templates: keel vs Python transformers" chat.log python3 scripts/hf_chat_check.py $keel .gpu-data/qwen3 tests/chat/conversations.jsonl tests/chat/python-semantics.jsonl
    cat "$out/chat.log"
fi
if want multi; then
    run "2 GPUs: --nproc 2, 20 steps, failures" multi.log scripts/gpu-multi-check.sh "$keel" "$out"
    cat "$out/multi.log" | grep -v "^step\|^data\|^model\|^saved"
fi
finish_cross
if want bench; then
    run "bench train (keel cuda vs PyTorch)" bench.log $keel bench train --backend cuda --torch bench/torch_qwen35.py
    cat "$out/bench.log"
fi
if want bitwise; then # training against another build of keel, byte for byte: a `git archive` of the commit to
    # compare with in .gpu-data/base.tar (or BASE_TAR) is built beside this tree; 4 steps of the fixture's model and of
    # a 128- and a 1024-wide Qwen3.5 (scripts/bitwise-models), float32 and bf16, must end with the same weights and
    # AdamW moments in every byte (BITWISE_BACKEND=cpu tries the stage on a machine without a GPU)
    # (BASE_KEEL=PATH: a base keel built already, say in the background beside this tree, instead of building one)
    base_tar=${BASE_TAR:-.gpu-data/base.tar} bb=${BITWISE_BACKEND:-cuda}
    if [ -n "${BASE_KEEL:-}" ] && [ ! -x "$BASE_KEEL" ]; then
        record "bitwise: training against a base build" FAIL "BASE_KEEL=$BASE_KEEL is not an executable"
    elif [ ! -e "$base_tar" ] && [ -z "${BASE_KEEL:-}" ]; then
        record "bitwise: training against a base build" FAIL "no $base_tar: git archive --format=tar COMMIT > $base_tar"
    else
        bdir=$(mktemp -d /tmp/keel-base.XXXXXX)
        bt=$(date +%s)
        if [ -n "${BASE_KEEL:-}" ]; then
            mkdir -p "$bdir/build" && ln -s "$(realpath "$BASE_KEEL")" "$bdir/build/keel"
            record "bitwise: the base build" PASS "given: $BASE_KEEL"
        fi
        if [ -e "$bdir/build/keel" ] || { tar -xf "$base_tar" -C "$bdir" && build_tree "$bdir" "$bdir/build" base-build.log &&
            record "bitwise: the base build" PASS "$(( $(date +%s) - bt )) s"; }; then
            base_keel=$bdir/build/keel # for conv-ncu's same-call before/after
            same=0 differ=0
            for m in fixture qwen35-128 qwen35-1024; do
                src=(--model $fx/causal-f32-sharded)
                [ $m = fixture ] || src=(--init scripts/bitwise-models/$m.json)
                for p in f32 bf16; do
                    for v in this base; do
                        k=$keel
                        [ $v = base ] && k=$bdir/build/keel
                        echo "== $m $p $v" >>"$out/bitwise.log"
                        $k train "${src[@]}" --data .gpu-data/moby-dick.txt --backend $bb --steps 4 --window 200 --batch 3 \
                            --lr 1e-3 --precision $p --out "$bdir/run-$m-$p-$v" >>"$out/bitwise.log" 2>&1
                    done
                    for f in model optimizer; do
                        if cmp -s "$bdir/run-$m-$p-this/checkpoint/$f.safetensors" "$bdir/run-$m-$p-base/checkpoint/$f.safetensors"; then
                            same=$((same + 1)) && echo "$m $p $f: identical" >>"$out/bitwise.log"
                        else
                            differ=$((differ + 1)) && echo "$m $p $f: DIFFERENT (or missing)" >>"$out/bitwise.log"
                        fi
                    done
                done
            done
            grep -E "identical|DIFFERENT" "$out/bitwise.log"
            if [ $differ -eq 0 ]; then record "bitwise: 4 training steps, 3 models x f32/bf16" PASS "$same of $same files identical ($bb)"
            else record "bitwise: 4 training steps, 3 models x f32/bf16" FAIL "$differ of $((same + differ)) files differ ($bb)"; fi
            # BITWISE_OPS=OP,OP: those ops' cases (forward and gradients) case by case, each line's hash of its result
            # bits (test-ops --bits) against the base's; a base older than --bits (63ff8f9) or than its XXH64 (093ebd7)
            # prints no hash or other digits, and fails here
            if [ -n "${BITWISE_OPS:-}" ]; then
                for v in this base; do
                    k=$keel
                    [ $v = base ] && k=$bdir/build/keel
                    { $k test-ops --backend $bb --op "$BITWISE_OPS" --bits; $k test-ops --backend $bb --op "$BITWISE_OPS" --grad --bits; } 2>&1 |
                        grep " $bb: " >"$out/ops-bits-$v.txt"
                done
                n=$(grep -cE ', bits [0-9a-f]{16}\)$' "$out/ops-bits-this.txt" || true)
                if [ "$n" -gt 0 ] && cmp -s "$out/ops-bits-this.txt" "$out/ops-bits-base.txt"; then
                    record "bitwise: $BITWISE_OPS cases (--bits)" PASS "$n of $n case lines identical, hashes included ($bb)"
                else
                    diff "$out/ops-bits-base.txt" "$out/ops-bits-this.txt" | head -10
                    record "bitwise: $BITWISE_OPS cases (--bits)" FAIL "$(diff "$out/ops-bits-base.txt" "$out/ops-bits-this.txt" | grep -c '^>') of $(wc -l <"$out/ops-bits-this.txt") lines differ, $n with a hash ($bb)"
                fi
            fi
        else
            tail -20 "$out/base-build.log"
            record "bitwise: the base build" FAIL "see base-build.log"
        fi
    fi
fi
if want conv-ncu; then # the command the twentieth session ran by hand (docs/h200-log.md, "Index arithmetic out of ...")
    conv_m='regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$,gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum'
    for v in this base; do
        k=$keel
        if [ $v = base ]; then
            k=${base_keel:-}
            [ -n "$k" ] || continue # no bitwise stage in this call: no base build
        fi
        run "ncu: the conv's kernels (bf16 batch 8, $v build)" conv-ncu-$v.log bash -c "ncu --csv --clock-control none -k regex:'k_gconv|k_conv4' --launch-skip 34 --launch-count 5 --metrics '$conv_m' $k bench train --backend cuda --precision bf16 --batch 8 --no-torch --steps 1 >$out/conv-ncu-$v.csv && python3 scripts/ncu_table.py $out/conv-ncu-$v.csv"
        cat "$out/conv-ncu-$v.log"
    done
fi
if want step-kernels; then # every kernel of the bf16 step at batch 8 timed alone by ncu (the thirty-third session's c73)
    run "ncu: every kernel of one bf16 step (batch 8)" step-kernels.log bash -c "KEEL_CUDA_GRAPH=0 ncu --csv --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum $keel bench train --backend cuda --precision bf16 --batch 8 --no-torch --steps 1 >$out/step-kernels.csv && python3 scripts/ncu_step_table.py $out/step-kernels.csv"
    cat "$out/step-kernels.log"
fi
if want lt-survey; then # cuBLASLt's answers timed for every product shape of the bf16 step (LT_PREFS's measurement)
    run "cuBLASLt's answers timed (bf16 batch 8)" lt-survey.log bash -c "KEEL_CUDA_GRAPH=0 KEEL_CUDA_LT_SURVEY=1 $keel bench train --backend cuda --precision bf16 --batch 8 --no-torch --steps 1 >/dev/null 2>$out/lt-survey.txt && python3 scripts/lt_survey_table.py $out/lt-survey.txt"
    cat "$out/lt-survey.log"
fi
if want profile; then
    run "GPU time per op and shape (KEEL_CUDA_PROFILE)" profile.log env KEEL_CUDA_PROFILE=1 $keel bench train --backend cuda --no-torch --steps 3
    grep -A60 "cuda profile" "$out/profile.log"
fi
if want profile16; then # the bf16 step at batch 8: its wall time, then the GPU time per op (their gap: the host)
    run "bf16 step, batch 8 (wall time)" p16-wall.log $keel bench train --backend cuda --precision bf16 --batch 8 --no-torch --steps 5
    grep -i "step\|tokens" "$out/p16-wall.log" | tail -4
    run "GPU time per op, bf16 batch 8 (KEEL_CUDA_PROFILE)" p16.log env KEEL_CUDA_PROFILE=1 $keel bench train --backend cuda --precision bf16 --batch 8 --no-torch --steps 3
    grep -A45 "cuda profile" "$out/p16.log"
fi

echo
echo "summary ($(date -u +%Y-%m-%dT%H:%MZ), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
printf '%-44s %-6s %s\n' stage result detail
printf '%s\n' "${rows[@]}"
exit $status
