#!/usr/bin/env bash
# A full disk while saving: keel train must fail with a clear message and a non-zero exit, and
# leave the previous checkpoint intact and no partial folder behind. The disk is "full" through
# the file-size limit (ulimit -f), with SIGXFSZ ignored so that writes fail with EFBIG.
# Usage: test-train-full-disk.sh KEEL TEXT WORKDIR
set -uo pipefail
keel=$1 text=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
args=(--preset small --data "$text" --window 32 --batch 2 --warmup 0 --seed 3)
"$keel" train "${args[@]}" --out "$work/run" --steps 2 >/dev/null || { echo "FAIL: the first run failed"; exit 1; }
before=$(sha256sum "$work/run/checkpoint/model.safetensors" | cut -d' ' -f1)
resume=(--resume "$work/run/checkpoint" --data "$text" --window 32 --batch 2 --warmup 0 --seed 3)
out=$( (trap '' XFSZ; ulimit -f 512; "$keel" train "${resume[@]}" --out "$work/run" --steps 4) 2>&1 ); rc=$?
fail=0
[ $rc -ne 0 ] || { echo "FAIL: the run with a full disk exited 0"; fail=1; }
grep -q "write failed: File too large (nothing was replaced)" <<<"$out" || { echo "FAIL: no clear message:"; echo "$out"; fail=1; }
after=$(sha256sum "$work/run/checkpoint/model.safetensors" | cut -d' ' -f1)
[ "$before" = "$after" ] || { echo "FAIL: the previous checkpoint changed"; fail=1; }
"$keel" info "$work/run/checkpoint" >/dev/null || { echo "FAIL: the previous checkpoint no longer loads"; fail=1; }
left=$(ls "$work/run" | grep -c 'tmp' || true)
[ "$left" -eq 0 ] || { echo "FAIL: partial output left: $(ls "$work/run")"; fail=1; }
[ $fail -eq 0 ] && echo "full disk: refused with '$(grep -o 'write failed[^;]*' <<<"$out" | head -n1)'; previous checkpoint intact"
exit $fail
