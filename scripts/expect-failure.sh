#!/usr/bin/env bash
# Runs a command that must fail: a non-zero exit and a message matching the pattern (extended
# regex) on stderr or stdout. Usage: expect-failure.sh PATTERN COMMAND [ARGS...]
pattern=$1; shift
out=$("$@" 2>&1); rc=$?
if [ $rc -eq 0 ]; then echo "expected a failure, got exit 0"; echo "$out"; exit 1; fi
if ! grep -Eq -- "$pattern" <<<"$out"; then echo "exit $rc, but no message matching: $pattern"; echo "$out"; exit 1; fi
echo "refused as expected (exit $rc): $(grep -E -- "$pattern" <<<"$out" | head -n1)"
