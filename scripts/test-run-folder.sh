#!/usr/bin/env bash
# keel train's --out folder against concurrent runs and planted links:
#   1. a second run on the same --out while the first is training is refused, naming the first
#      one's pid; the first finishes intact (its checkpoint equals a lone run's, byte for byte);
#   2. links planted at the names a save uses (checkpoint.tmp.<pid>, where keel used to put its
#      temporary folder, and checkpoint.old.*) and a damaged tokens.cache never make keel empty
#      or write to what they point at: the links are removed as leftovers, the target is intact;
#   3. `--resume OUT` (the run folder, not OUT/checkpoint) continues the run.
# Usage: test-run-folder.sh KEEL TEXT WORKDIR
set -uo pipefail
keel=$1 text=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
head -c 30000 "$text" >"$work/t.txt"
fail=0
common=(--preset tiny --data "$work/t.txt" --window 16 --batch 2 --seed 9 --threads 1 --eval-every 0)
# 1. two runs, one folder
"$keel" train "${common[@]}" --steps 300 --save-every 10 --out "$work/lone" >/dev/null 2>&1 || { echo "FAIL: the lone run"; fail=1; }
"$keel" train "${common[@]}" --steps 300 --save-every 10 --out "$work/shared" >"$work/first.log" 2>&1 &
first=$!
for _ in $(seq 100); do grep -q "pid $first" "$work/shared/keel.lock" 2>/dev/null && break; sleep 0.05; done
if "$keel" train "${common[@]}" --steps 5 --out "$work/shared" >"$work/second.log" 2>&1; then
  echo "FAIL: a second run on the same --out was not refused"; fail=1
elif ! grep -q "is in use by another keel run (pid $first" "$work/second.log"; then
  echo "FAIL: the refusal does not name the first run's pid $first: $(cat "$work/second.log")"; fail=1
else
  echo "ok   second run refused: $(grep -o 'is in use by another keel run ([^)]*)' "$work/second.log")"
fi
wait $first || { echo "FAIL: the first run failed: $(tail -n 3 "$work/first.log")"; fail=1; }
cmp -s "$work/lone/checkpoint/model.safetensors" "$work/shared/checkpoint/model.safetensors" \
  || { echo "FAIL: the first run's checkpoint differs from a lone run's"; fail=1; }
[ "$(grep -c '"loss"' "$work/shared/metrics.jsonl")" = 300 ] || { echo "FAIL: the first run's metrics.jsonl does not hold its 300 steps"; fail=1; }
# 2. planted links: at the temporary name the old code used (its pid is the shell's, kept by exec)
# and at leftover names; a garbage tokens.cache
mkdir -p "$work/victim" && echo precious >"$work/victim/file"
mkdir -p "$work/planted"
bash -c 'ln -s "$1/victim" "$2/checkpoint.tmp.$$"; ln -s "$1/victim" "$2/checkpoint.old.zzz"; shift 2; exec "$@"' _ \
  "$work" "$work/planted" "$keel" train "${common[@]}" --steps 3 --out "$work/planted" >"$work/planted.log" 2>&1 \
  || { echo "FAIL: the run with planted links: $(tail -n 2 "$work/planted.log")"; fail=1; }
[ "$(cat "$work/victim/file" 2>/dev/null)" = precious ] || { echo "FAIL: the folder a planted link points to was emptied"; fail=1; }
left=$(cd "$work/planted" && ls -A | grep -v -x -e checkpoint -e keel.lock -e metrics.jsonl -e tokens.cache)
[ -z "$left" ] || { echo "FAIL: planted links or leftovers remain: $left"; fail=1; }
cp "$work/planted/tokens.cache" "$work/cache.good"
node -e 'const fs=require("fs"); const b=fs.readFileSync(process.argv[1]); b.writeInt32LE(7777777, 64 + 40); fs.writeFileSync(process.argv[1], b)' "$work/planted/tokens.cache"
# 3. --resume OUT, with a damaged cache: reported, made again, the run continues
if ! "$keel" train --resume "$work/planted" --steps 5 >"$work/resume.log" 2>&1; then
  echo "FAIL: --resume OUT: $(tail -n 2 "$work/resume.log")"; fail=1
elif ! grep -q "tokens.cache is damaged (its checksum does not match its ids)" "$work/resume.log"; then
  echo "FAIL: a damaged tokens.cache was not reported: $(head -n 3 "$work/resume.log")"; fail=1
else
  echo "ok   --resume OUT continued to step 5; $(grep -o 'tokens.cache is damaged ([^)]*)' "$work/resume.log")"
fi
cmp -s "$work/cache.good" "$work/planted/tokens.cache" || { echo "FAIL: the remade tokens.cache differs from the first"; fail=1; }
[ $fail -eq 0 ] && echo "run folder: a second run refused by pid, the first intact; planted links removed without touching their targets; --resume OUT continues; a damaged cache is remade"
exit $fail
