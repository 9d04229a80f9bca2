#!/usr/bin/env bash
# Runs every CPU test: the whole CTest suite of the release build, then the unit tests and the
# forward op tests again under AddressSanitizer + UndefinedBehaviorSanitizer, then each libFuzzer
# target for 20 s from its committed seeds. Ends with the line
# "N passed, N failed" and a non-zero exit when anything failed.
set -uo pipefail
jobs=${KEEL_TEST_JOBS:-2}
total_pass=0
total_fail=0
run() { # dir, extra ctest args...
  local dir=$1; shift
  local log; log=$(mktemp)
  ctest --test-dir "$dir" --output-on-failure -j "$jobs" "$@" 2>&1 | tee "$log"
  local line; line=$(grep -E "tests passed, [0-9]+ tests failed out of [0-9]+" "$log" | tail -n 1)
  if [ -z "$line" ]; then
    echo "run-checks: no CTest summary from $dir" >&2
    total_fail=$((total_fail + 1))
  else
    local failed total
    failed=$(sed -E 's/.*tests passed, ([0-9]+) tests failed out of ([0-9]+).*/\1/' <<<"$line")
    total=$(sed -E 's/.*tests passed, ([0-9]+) tests failed out of ([0-9]+).*/\2/' <<<"$line")
    total_pass=$((total_pass + total - failed))
    total_fail=$((total_fail + failed))
  fi
  rm -f "$log"
}
run build -LE fuzz-long
run build-asan -L sanitize
run build-fuzz -L fuzz
echo "${total_pass} passed, ${total_fail} failed"
[ "$total_fail" -eq 0 ]
