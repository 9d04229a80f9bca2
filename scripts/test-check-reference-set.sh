#!/usr/bin/env bash
# keel check-reference on a set of fixtures, and the sets it must refuse by name: (1) two seeds of
# tests/fixtures/qwen35-tiny-seeds as a set pass, with each fixture's line and the pooled verdict;
# (2) the same set where one fixture's peer file has no error for a tensor fails, naming the tensor
# and the fixture; (3) a fixture whose reference lacks a gradient fails, naming it; (4) a folder
# with no fixture in it and a set given --checkpoint are refused with a message and exit 2.
# Usage: test-check-reference-set.sh KEEL SEEDS_DIR WORKDIR
set -euo pipefail
keel=$1 seeds=$2 work=$3
rm -rf "$work" && mkdir -p "$work/set" "$work/empty"
cp -r "$seeds/seed1" "$seeds/seed2" "$work/set/"
fail=0
out=$("$keel" check-reference "$work/set" --precision bf16 --backend cpu) || { echo "FAIL: the set of two seeds failed: $out"; fail=1; }
grep -q "seed1        alone: 62 passed" <<<"$out" && grep -q "^PASS: 62 passed, 0 failed" <<<"$out" ||
    { echo "FAIL: no per-fixture line or pooled verdict: $out"; fail=1; }
# (2) the peer's file of seed2 without layer 0's A_log (both devices' entries)
sed -i '/"grad.model.layers.0.linear_attn.A_log"/d' "$work/set/seed2/peer-bf16.json"
set +e
out=$("$keel" check-reference "$work/set" --precision bf16 --backend cpu 2>&1); rc=$?
set -e
[ $rc = 1 ] && grep -q "grad.model.layers.0.linear_attn.A_log .*no peer's error for it in seed2  FAIL" <<<"$out" ||
    { echo "FAIL: a missing peer error was not named (rc $rc): $out"; fail=1; }
cp "$seeds/seed2/peer-bf16.json" "$work/set/seed2/"
# (3) seed2's reference without layer 0's A_log gradient: the tensor renamed in the file's header (a
# name of the same length, so the header and the offsets stay valid)
LC_ALL=C sed -i 's/"grad\.model\.layers\.0\.linear_attn\.A_log"/"grad.model.layers.0.linear_attn.A_lox"/' \
    "$work/set/seed2/reference.safetensors"
set +e
out=$("$keel" check-reference "$work/set" --precision bf16 --backend cpu 2>&1); rc=$?
set -e
[ $rc = 1 ] && grep -q "grad.model.layers.0.linear_attn.A_log .*missing from the reference" <<<"$out" ||
    { echo "FAIL: a gradient missing from a fixture's reference was not named (rc $rc): $out"; fail=1; }
# (4) refusals
set +e
out=$("$keel" check-reference "$work/empty" 2>&1); rc=$?
set -e
[ $rc = 2 ] && grep -q "no reference.safetensors in it, nor in a folder of it" <<<"$out" || { echo "FAIL: empty folder (rc $rc): $out"; fail=1; }
set +e
out=$("$keel" check-reference "$work/set" --checkpoint multimodal-bf16 2>&1); rc=$?
set -e
[ $rc = 2 ] && grep -q "a set of fixtures is checked whole: --checkpoint is for one fixture" <<<"$out" ||
    { echo "FAIL: --checkpoint with a set (rc $rc): $out"; fail=1; }
[ $fail = 0 ] && echo "check-reference sets: PASS"
exit $fail
