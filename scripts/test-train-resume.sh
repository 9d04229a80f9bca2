#!/usr/bin/env bash
# keel train determinism: (1) a run of 10 steps and the same run stopped after 6 then resumed to
# 10 (with `--resume DIR --out OUT` alone: the settings come from the checkpoint) end with
# byte-identical checkpoints (weights and optimizer state) and identical loss lines;
# (2) the same run twice gives identical losses, evaluations and weights (timing fields aside).
# Usage: test-train-resume.sh KEEL TEXT WORKDIR
set -euo pipefail
keel=$1 text=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
common=(--preset small --data "$text" --window 32 --batch 2 --accum 2 --steps 10 --warmup 2 --eval-every 5 --lr 3e-3 --seed 7)
"$keel" train "${common[@]}" --out "$work/a" >/dev/null
"$keel" train "${common[@]}" --out "$work/a2" --recompute full --threads 1 >/dev/null
"$keel" train "${common[@]}" --out "$work/b" --stop-at 6 >/dev/null
# the resumed run takes every setting from the checkpoint (trainer_state.json): only --out is new
"$keel" train --resume "$work/b/checkpoint" --out "$work/c" >/dev/null
losses() { grep -o '"step": [0-9]*, "tokens": [0-9]*, "\(loss\|eval_loss\)": [-0-9.e]*' "$@"; }
fail=0
cmp "$work/a/checkpoint/model.safetensors" "$work/c/checkpoint/model.safetensors" || { echo "FAIL: resumed weights differ"; fail=1; }
cmp "$work/a/checkpoint/optimizer.safetensors" "$work/c/checkpoint/optimizer.safetensors" || { echo "FAIL: resumed optimizer state differs"; fail=1; }
diff <(losses "$work/a/metrics.jsonl" | grep '"loss"') <(cat "$work/b/metrics.jsonl" "$work/c/metrics.jsonl" | grep -o '"step": [0-9]*, "tokens": [0-9]*, "loss": [-0-9.e]*') \
  || { echo "FAIL: loss lines differ"; fail=1; }
cmp "$work/a/checkpoint/model.safetensors" "$work/a2/checkpoint/model.safetensors" || { echo "FAIL: a second run (recompute full, 1 thread) differs"; fail=1; }
diff <(losses "$work/a/metrics.jsonl") <(losses "$work/a2/metrics.jsonl") || { echo "FAIL: a second run's losses differ"; fail=1; }
first=$(grep -o '"eval_loss": [0-9.e-]*' "$work/a/metrics.jsonl" | head -n1 | cut -d' ' -f2)
last=$(grep -o '"eval_loss": [0-9.e-]*' "$work/a/metrics.jsonl" | tail -n1 | cut -d' ' -f2)
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < f - 0.5) }' || { echo "FAIL: eval loss did not fall clearly ($first -> $last)"; fail=1; }
# a setting that fixes the run cannot change; one that may (--steps) can
if "$keel" train --resume "$work/b/checkpoint" --out "$work/d" --window 64 2>"$work/refused.txt" >/dev/null \
   || ! grep -q -- "--window cannot change" "$work/refused.txt"; then
  echo "FAIL: --resume with another --window was not refused by name: $(cat "$work/refused.txt")"; fail=1
fi
"$keel" train --resume "$work/b/checkpoint" --out "$work/e" --steps 12 --window 32 >/dev/null || { echo "FAIL: --resume --steps 12"; fail=1; }
grep -q '"step": 12,' "$work/e/metrics.jsonl" || { echo "FAIL: --steps 12 did not reach step 12"; fail=1; }
[ $fail -eq 0 ] && echo "resume (every setting from the checkpoint) and repeat bitwise identical; another --window refused; eval loss $first -> $last"
exit $fail
