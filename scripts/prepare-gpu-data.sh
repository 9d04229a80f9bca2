#!/usr/bin/env bash
# Prepares .gpu-data/ (git-ignored, carried to the GPU machine): the shared fixture, keel's saves of
# it, and a checkpoint keel initialised with keel's own logits for it. Needs build/keel.
set -euo pipefail
cd "$(dirname "$0")/.."
fx=${KEEL_FIXTURES:-../shared/fixtures}/qwen35-tiny
rm -rf .gpu-data && mkdir -p .gpu-data/fixture .gpu-data/saved .gpu-data/init
cp -r "$fx/causal-f32-sharded" "$fx/multimodal-bf16" "$fx/reference.safetensors" .gpu-data/fixture/
./build/keel save "$fx/causal-f32-sharded" .gpu-data/saved/text-f32
./build/keel save "$fx/multimodal-bf16" .gpu-data/saved/multimodal-bf16
./build/keel save "$fx/causal-f32-sharded" .gpu-data/saved/text-bf16 --dtype bf16
./build/keel init --preset tiny .gpu-data/init/tiny --seed 3
./build/keel info .gpu-data/init/tiny --batch 2 --window 48 --dump-logits .gpu-data/init/tiny-logits.safetensors >/dev/null
du -sh .gpu-data
