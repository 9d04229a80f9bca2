#!/usr/bin/env bash
# Prepares what scripts/gpu-check.sh needs on a GPU machine without network, both git-ignored and
# carried there: .gpu-debs/ (the Debian -dev packages keel builds against) and .gpu-data/ (the
# transformers fixture, keel's saves of it, and a checkpoint keel initialised with keel's own logits for
# it). Needs build/keel and apt.
set -euo pipefail
cd "$(dirname "$0")/.."
fx=${KEEL_FIXTURES:-tests/fixtures}/qwen35-tiny
mkdir -p .gpu-debs
(cd .gpu-debs && apt-get download libcjson-dev libcjson1 libxxhash-dev libxxhash0 libpcre2-dev libpcre2-8-0 libpcre2-16-0 \
    libpcre2-32-0 libpcre2-posix3 libutf8proc-dev libutf8proc2 libcmocka-dev libcmocka0 2>/dev/null)
rm -rf .gpu-data && mkdir -p .gpu-data/fixture .gpu-data/saved .gpu-data/init
cp -r "$fx/causal-f32-sharded" "$fx/multimodal-bf16" "$fx/reference.safetensors" "$fx/meta.json" "$fx/peer-f32.json" "$fx/peer-bf16.json" .gpu-data/fixture/
./build/keel save "$fx/causal-f32-sharded" .gpu-data/saved/text-f32
./build/keel save "$fx/multimodal-bf16" .gpu-data/saved/multimodal-bf16
./build/keel save "$fx/causal-f32-sharded" .gpu-data/saved/text-bf16 --dtype bf16
./build/keel init --preset tiny .gpu-data/init/tiny --seed 3
./build/keel info .gpu-data/init/tiny --batch 2 --window 48 --dump-logits .gpu-data/init/tiny-logits.safetensors >/dev/null
cp assets/moby-dick.txt .gpu-data/
mkdir -p .gpu-data/qwen3 && cp assets/qwen3/tokenizer.json assets/qwen3/tokenizer_config.json .gpu-data/qwen3/
# the sources gpu-check.sh's bitwise stage builds beside the tree under test (HEAD, or KEEL_BITWISE_BASE);
# without tests/fixtures (the stage trains from .gpu-data/fixture; with them, 29 MB, the tree and what is
# carried no longer fit the device tool's 64 MiB)
git archive --format=tar "${KEEL_BITWISE_BASE:-HEAD}" -- . ':(exclude)tests/fixtures' >.gpu-data/base.tar
# NCCL's header, for a GPU machine whose NCCL (in PyTorch's wheels) comes without one
if [ -e /usr/local/cuda/include/nccl.h ]; then mkdir -p .gpu-data/nccl-include && cp -r /usr/local/cuda/include/nccl*.h /usr/local/cuda/include/nccl_device .gpu-data/nccl-include/; fi
du -sh .gpu-data
