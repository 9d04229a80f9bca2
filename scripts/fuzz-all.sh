#!/usr/bin/env bash
# `make fuzz`: every libFuzzer target of BUILD for SECONDS, JOBS at a time, each from its committed
# seeds plus the corpus earlier runs grew (BUILD/fuzz-work/<target>/). Prints one line per target
# (executions, corpus size) and fails when any target found a crash, a leak or a sanitizer report.
# Usage: fuzz-all.sh BUILD SECONDS JOBS
set -uo pipefail
build=$1 seconds=$2 jobs=$3
root=$(cd "$(dirname "$0")/.." && pwd)
targets=(safetensors config tokenizer trace trainer_state chat_template)
echo "fuzz: ${#targets[@]} targets, ${seconds} s each, ${jobs} at a time"
printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} "$root/scripts/run-fuzzer.sh" "$build/fuzz_{}" \
  "$root/tests/fuzz/seeds/{}" "$build/fuzz-work/{}" "$seconds"
