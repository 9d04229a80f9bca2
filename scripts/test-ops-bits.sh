#!/usr/bin/env bash
# keel test-ops --bits: each passing case's line ends with a hash of its result bits, so that two builds
# can be compared case by case (scripts/gpu-check.sh's same-call before/after of a change meant to keep the
# bits). Checked on cpu: every passing line carries a hash, forward and gradient tiers; two runs print the
# same lines; and the hashes of different cases differ (a hash that ignored the data would repeat).
# Usage: test-ops-bits.sh KEEL WORKDIR
set -euo pipefail
keel=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
fail=0
for tier in forward grad; do
    g=()
    [ $tier = grad ] && g=(--grad)
    for r in 1 2; do
        "$keel" test-ops --backend cpu --op RMS_NORM_W,SOFT_MAX "${g[@]}" --bits >"$work/$tier-$r.txt"
    done
    ok=$(grep -c ' cpu: OK' "$work/$tier-1.txt" || true)
    with=$(grep ' cpu: OK' "$work/$tier-1.txt" | grep -cE ', bits [0-9a-f]{16}\)$' || true)
    uniq=$(grep -oE 'bits [0-9a-f]{16}' "$work/$tier-1.txt" | sort -u | wc -l)
    if [ "$ok" -lt 5 ] || [ "$with" -ne "$ok" ]; then
        echo "FAIL $tier: $with of $ok passing cpu lines carry a hash"; fail=1
    elif ! cmp -s "$work/$tier-1.txt" "$work/$tier-2.txt"; then
        echo "FAIL $tier: two runs printed different lines"; diff "$work/$tier-1.txt" "$work/$tier-2.txt" | head -5; fail=1
    elif [ "$uniq" -ne "$ok" ]; then
        echo "FAIL $tier: $uniq distinct hashes for $ok cases"; fail=1
    else
        echo "ok $tier: $ok cases, each with its own hash, the same in two runs"
    fi
done
exit $fail
