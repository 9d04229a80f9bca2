#!/usr/bin/env bash
# Crash consistency of keel train's checkpoints. A run that saves every step is
#   1. killed by the fault hook at each of the save's points (KEEL_FAULT=save-kill:P), with the
#      exchanging rename and with the two-rename fallback (save-no-exchange), and
#   2. killed with SIGKILL at KILLS (default 50) random moments,
# and after every kill `keel train --resume OUT` must find a complete checkpoint and continue
# (any exit but SIGKILL's or success fails the test). At the end the weights and AdamW state equal,
# byte for byte, those of the same run never interrupted, metrics.jsonl holds the same loss lines,
# and OUT holds no leftover folder.
# Usage: test-crash-consistency.sh KEEL TEXT WORKDIR [KILLS]
set -uo pipefail
keel=$1 text=$2 work=$3 kills_wanted=${4:-50}
rm -rf "$work" && mkdir -p "$work"
head -c 30000 "$text" >"$work/t.txt"
S=200
common=(--preset tiny --data "$work/t.txt" --window 16 --batch 2 --steps $S --save-every 1 --eval-every 50 --seed 5 --threads 1)
fail=0
if ! "$keel" train "${common[@]}" --out "$work/ref" >"$work/ref.log" 2>&1; then
  echo "FAIL: the uninterrupted run: $(tail -n 3 "$work/ref.log")"; exit 1
fi
run=$work/run
"$keel" train "${common[@]}" --out "$run" --stop-at 1 >"$work/first.log" 2>&1 || { echo "FAIL: first step: $(tail -n 3 "$work/first.log")"; exit 1; }
step_of() { node -e 'try { console.log(JSON.parse(require("fs").readFileSync(process.argv[1])).step) } catch (e) { console.log(-1) }' "$run/checkpoint/trainer_state.json"; }
resume() { # env... : one resumed run; prints its exit status
  env "$@" "$keel" train --resume "$run" >"$work/last.log" 2>&1
  echo $?
}
# 1. the fault hook at every point of the save, in both swap modes
hooks=0
for mode in "" "save-no-exchange,"; do
  for p in 1 2 3 4 5 6 7 8 9; do
    rc=$(resume KEEL_FAULT="${mode}save-kill:$p")
    if [ "$rc" != 137 ]; then echo "FAIL: KEEL_FAULT=${mode}save-kill:$p: exit $rc, not killed: $(tail -n 2 "$work/last.log")"; fail=1; fi
    hooks=$((hooks + 1))
    # the next run must find a complete checkpoint by itself (it is killed by the next hook, or by nothing)
  done
done
rc=$(resume)
if [ "$rc" != 0 ] && ! grep -q "checkpoint is at step $S already" "$work/last.log"; then
  echo "FAIL: resuming after the fault hooks: exit $rc: $(tail -n 2 "$work/last.log")"; fail=1
fi
# the run continues from here with random kills: restart the schedule's tail by going back to step 1
rm -rf "$run" && "$keel" train "${common[@]}" --out "$run" --stop-at 1 >/dev/null 2>&1
# 2. random SIGKILLs: a resumed run is killed after a random delay within a typical run's span
kills=0 attempts=0
while [ $kills -lt "$kills_wanted" ] && [ $attempts -lt $((kills_wanted * 4)) ]; do
  attempts=$((attempts + 1))
  "$keel" train --resume "$run" >"$work/last.log" 2>&1 &
  pid=$!
  sleep "0.$(printf "%03d" $((RANDOM % 500 + 50)))"
  if kill -9 $pid 2>/dev/null; then
    wait $pid 2>/dev/null; rc=$?
    [ $rc -eq 137 ] && kills=$((kills + 1))
  else
    wait $pid 2>/dev/null; rc=$?
  fi
  if [ $rc -ne 137 ] && [ $rc -ne 0 ]; then
    echo "FAIL: a resumed run after $kills kills exited $rc: $(tail -n 2 "$work/last.log")"; fail=1; break
  fi
  if [ "$(step_of)" = "$S" ] && [ $kills -lt "$kills_wanted" ]; then # finished (a fast machine): check it, go again
    cmp -s "$work/ref/checkpoint/model.safetensors" "$run/checkpoint/model.safetensors" || { echo "FAIL: weights differ after $kills kills"; fail=1; break; }
    rm -rf "$run" && "$keel" train "${common[@]}" --out "$run" --stop-at 1 >/dev/null 2>&1
  fi
done
if [ $kills -lt "$kills_wanted" ]; then echo "FAIL: only $kills of $kills_wanted kills landed in $attempts runs"; fail=1; fi
at_kill=$(step_of)
if [ "$at_kill" != "$S" ]; then
  rc=$(resume)
  [ "$rc" = 0 ] || { echo "FAIL: the final resume exited $rc: $(tail -n 3 "$work/last.log")"; fail=1; }
fi
cmp -s "$work/ref/checkpoint/model.safetensors" "$run/checkpoint/model.safetensors" || { echo "FAIL: weights differ from the uninterrupted run"; fail=1; }
cmp -s "$work/ref/checkpoint/optimizer.safetensors" "$run/checkpoint/optimizer.safetensors" || { echo "FAIL: AdamW state differs from the uninterrupted run"; fail=1; }
losses() { grep -o '"step": [0-9]*, "tokens": [0-9]*, "\(loss\|eval_loss\)": [-0-9.e]*' "$1"; }
diff <(losses "$work/ref/metrics.jsonl") <(losses "$run/metrics.jsonl") >/dev/null || { echo "FAIL: metrics.jsonl's loss lines differ from the uninterrupted run's"; fail=1; }
left=$(cd "$run" && ls -A | grep -v -x -e checkpoint -e keel.lock -e metrics.jsonl -e tokens.cache)
[ -z "$left" ] || { echo "FAIL: leftovers in OUT: $left"; fail=1; }
[ $fail -eq 0 ] && echo "crash consistency: $hooks kills by the fault hook (9 save points x 2 swap modes), $kills random SIGKILLs (run at step $at_kill of $S at the last); every resume found a complete checkpoint; weights, AdamW state and losses bitwise those of the uninterrupted run; no leftovers"
exit $fail
