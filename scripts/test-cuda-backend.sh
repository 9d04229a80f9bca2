#!/usr/bin/env bash
# The CUDA backend in a build made with nvcc: with a usable GPU, a quick op check must pass; without
# one, asking for it must fail with a message that says so (not a crash, not a silent fallback).
# Usage: test-cuda-backend.sh KEEL
keel=$1
if nvidia-smi -L >/dev/null 2>&1; then
    exec "$keel" test-ops --backend cuda --op ADD,CPY,MUL_MAT
fi
exec "$(dirname "$0")/expect-failure.sh" "cuda: no usable CUDA device" "$keel" test-ops --backend cuda --op ADD
