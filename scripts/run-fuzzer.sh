#!/usr/bin/env bash
# Runs one libFuzzer target for SECONDS from its committed seeds (plus the corpus it grew before,
# in WORK/corpus), with a fixed seed for the run-to-run order; a crash, leak, timeout or sanitizer
# report fails it and leaves the input in WORK/ (crash-*, leak-*, timeout-*). Prints the
# executions and the corpus size.
# Usage: run-fuzzer.sh FUZZER SEEDS_DIR WORK SECONDS [extra libFuzzer flags...]
set -uo pipefail
fuzzer=$1 seeds=$2 work=$3 seconds=$4; shift 4
mkdir -p "$work/corpus"
log=$work/last.log
"$fuzzer" -max_total_time="$seconds" -seed=1 -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
  -print_final_stats=1 -artifact_prefix="$work/" "$@" "$work/corpus" "$seeds" >"$log" 2>&1
rc=$?
name=$(basename "$fuzzer")
execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
if [ $rc -ne 0 ]; then
  grep -E 'ERROR|SUMMARY|runtime error|Test unit written|==[0-9]+==' "$log" | head -n 20
  echo "$name: FAILED (exit $rc) after ${execs:-?} executions; log $log"
  exit 1
fi
echo "$name: ${execs:-?} executions in ${seconds} s, corpus $(ls "$work/corpus" | wc -l) inputs, no crash, leak or sanitizer report"
