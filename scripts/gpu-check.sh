#!/usr/bin/env bash
# The GPU tier, on a machine with an NVIDIA GPU and no network: builds keel with the CUDA backend
# (sm_90) and runs the GPU checks, then prints one summary table. Needs, carried from the
# development machine: .gpu-debs (the Debian -dev packages keel builds against, from
# `scripts/gpu-prepare.sh`) and .gpu-data (the fixture and checkpoints, same script).
#   scripts/gpu-check.sh            every stage
#   scripts/gpu-check.sh ops grad   only those stages (build always runs)
# Stages: ops grad fault reference recompute hf cross bench, and multi (needs 2 GPUs; not in the
# default list)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/keel-gpu-out}
mkdir -p "$out"
stages=${*:-ops grad fault reference recompute hf cross bench}
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
# NCCL: the toolkit's, else the one PyTorch's wheels bring
nccl=()
if [ ! -e /usr/local/cuda/lib64/libnccl.so ] && [ ! -e /usr/local/cuda/lib/libnccl.so ]; then
    nd=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null || true)
    nl=$(ls "$nd"/lib/libnccl.so* 2>/dev/null | head -n1)
    [ -n "$nl" ] && nccl=(-DNCCL_LIBRARY="$nl" -DNCCL_INCLUDE_DIR="$nd/include") && export LD_LIBRARY_PATH=$nd/lib:$LD_LIBRARY_PATH
fi
t0=$(date +%s)
if cmake -S . -B build-gpu "${nccl[@]}" -DCMAKE_BUILD_TYPE=Release -DKEEL_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="90-real;90-virtual" \
      -DCMAKE_PREFIX_PATH=$deps/usr -DCMAKE_LIBRARY_PATH=$lib -DCMAKE_INCLUDE_PATH=$deps/usr/include >"$out/build.log" 2>&1 &&
   cmake --build build-gpu -j "$(nproc)" >>"$out/build.log" 2>&1; then
    record "build (CUDA backend, sm_90 + PTX)" PASS "$(( $(date +%s) - t0 )) s"
else
    tail -40 "$out/build.log"
    record "build (CUDA backend, sm_90 + PTX)" FAIL "see build.log"
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

if want ops; then
    run "test-ops --backend cuda (forward)" ops.log $keel test-ops --backend ref,cuda
    grep "^cuda:" "$out/ops.log"
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
fi
if want recompute; then
    run "test-recompute --backend cuda (bitwise)" recompute.log $keel test-recompute --backend cuda --fixture $fx/causal-f32-sharded
fi
if want hf; then
    run "transformers loads keel's checkpoints" hf.log python3 scripts/hf_load_check.py .gpu-data
fi
if want cross; then
    run "0.8B: cpu vs cuda, 3 steps" cross.log scripts/gpu-cross-check.sh "$keel" "$out"
fi
if want multi; then
    run "2 GPUs: --nproc 2, 20 steps, failures" multi.log scripts/gpu-multi-check.sh "$keel" "$out"
    cat "$out/multi.log" | grep -v "^step\|^data\|^model\|^saved"
fi
if want bench; then
    run "bench train (keel cuda vs PyTorch)" bench.log $keel bench train --backend cuda --torch bench/torch_qwen35.py
    cat "$out/bench.log"
fi

echo
echo "summary ($(date -u +%Y-%m-%dT%H:%MZ), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
printf '%-44s %-6s %s\n' stage result detail
printf '%s\n' "${rows[@]}"
exit $status
