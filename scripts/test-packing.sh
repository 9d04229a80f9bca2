#!/usr/bin/env bash
# Packing with document boundaries through keel train and keel eval, on the transformers fixture's
# model (bytes: it has no tokenizer): (1) JSON Lines data is packed by default and says so; --no-pack
# gives one example a window, so more windows; (2) --overlong truncate, split and drop count the
# examples longer than the window, split keeps more of them (more windows than truncate), drop
# fewer, and a bad value is refused naming the flag; (3) --doc-boundaries off keeps the one token
# stream (no packing line), on packs plain text files too; (4) keel eval packs the same way; (5) a
# packed run resumed from its checkpoint continues bitwise, and its loss falls.
# Usage: test-packing.sh KEEL TINY_FIXTURE_DIR TEXT_FILE WORKDIR
set -euo pipefail
keel=$1 fx=$2 text=$3 work=$4
base=$fx/causal-f32-sharded
rm -rf "$work" && mkdir -p "$work"
# short examples (a+b= and the sum), and every 50th a long one (its sum said 40 times, > 64 bytes)
awk 'BEGIN { srand(11); for (i = 0; i < 1500; i++) { a = int(rand() * 50); b = int(rand() * 50); r = i % 50 ? 1 + int(rand() * 3) : 40;
             c = a + b; for (k = 1; k < r; k++) c = c " " (a + b);
             printf "{\"prompt\": \"%d+%d=\", \"completion\": \"%s\"}\n", a, b, c } }' >"$work/pc.jsonl"
fail=0
windows() { grep -o 'examples [a-z ]* [0-9]* windows of' <<<"$1" | awk '{print $(NF-2)}'; }
common=(--model "$base" --data "$work/pc.jsonl" --window 64 --batch 2 --lr 3e-3 --eval-every 0)
out=$("$keel" train "${common[@]}" --steps 1 --out "$work/p")
grep -q "document boundaries on: [0-9]* examples packed into [0-9]* windows of 64" <<<"$out" \
  || { echo "FAIL: .jsonl data was not packed by default: $out"; fail=1; }
long=$(grep -o '[0-9]* longer than the window truncated' <<<"$out" | cut -d' ' -f1)
[ -n "$long" ] && [ "$long" -gt 0 ] || { echo "FAIL: the long examples were not counted: $out"; fail=1; }
packed=$(windows "$out")
out=$("$keel" train "${common[@]}" --steps 1 --out "$work/np" --no-pack)
unpacked=$(windows "$out")
grep -q "document boundaries on: $unpacked examples in $unpacked windows" <<<"$out" || { echo "FAIL: --no-pack is not one example a window: $out"; fail=1; }
[ -n "$packed" ] && [ "$packed" -lt "$unpacked" ] || { echo "FAIL: packing used $packed windows, --no-pack $unpacked"; fail=1; }
out=$("$keel" train "${common[@]}" --steps 1 --out "$work/sp" --overlong split)
split=$(windows "$out")
grep -q "$long longer than the window split" <<<"$out" || { echo "FAIL: --overlong split: $out"; fail=1; }
out=$("$keel" train "${common[@]}" --steps 1 --out "$work/dr" --overlong drop)
drop=$(windows "$out")
grep -q "$long longer than the window dropped" <<<"$out" || { echo "FAIL: --overlong drop: $out"; fail=1; }
[ "$split" -gt "$packed" ] && [ "$drop" -lt "$packed" ] || { echo "FAIL: windows split $split, truncate $packed, drop $drop"; fail=1; }
if out=$("$keel" train "${common[@]}" --steps 1 --out "$work/bad" --overlong cut 2>&1) || ! grep -q -- "--overlong 'cut': expected truncate, split or drop" <<<"$out"; then
  echo "FAIL: a bad --overlong was not refused by name: $out"; fail=1
fi
if out=$("$keel" train "${common[@]}" --steps 1 --out "$work/bad" --doc-boundaries maybe 2>&1) || ! grep -q -- "--doc-boundaries 'maybe'" <<<"$out"; then
  echo "FAIL: a bad --doc-boundaries was not refused by name: $out"; fail=1
fi
out=$("$keel" train "${common[@]}" --steps 1 --out "$work/off" --doc-boundaries off)
grep -q "document boundaries" <<<"$out" && { echo "FAIL: --doc-boundaries off still packed: $out"; fail=1; }
# plain text: off by default; on packs the files (each one example, split to windows)
mkdir -p "$work/texts" && head -c 3000 "$text" >"$work/texts/a.txt" && tail -c 5000 "$text" >"$work/texts/b.txt" && echo "Call me Ishmael." >"$work/texts/c.txt"
out=$("$keel" train --model "$base" --data "$work/texts" --window 64 --batch 2 --steps 1 --eval-fraction 0 --eval-every 0 --out "$work/t0")
grep -q "document boundaries" <<<"$out" && { echo "FAIL: plain text was packed by default: $out"; fail=1; }
out=$("$keel" train --model "$base" --data "$work/texts" --window 64 --batch 2 --steps 1 --eval-fraction 0 --eval-every 0 --out "$work/t1" --doc-boundaries on --overlong split)
tw=$(windows "$out")
bytes=$(cat "$work/texts/"*.txt | wc -c)
grep -q "3 examples packed into" <<<"$out" && [ "$tw" -ge $(((bytes - 3) / 64)) ] && [ "$tw" -le $((bytes / 64 + 3)) ] \
  || { echo "FAIL: --doc-boundaries on for text ($bytes bytes): $out"; fail=1; }
# keel eval: the same packing, of every example (nothing is held out there)
out=$("$keel" eval --model "$base" --data "$work/pc.jsonl" --window 64 --batch 4)
grep -q "document boundaries on: 1500 examples packed into [0-9]* windows of 64" <<<"$out" || { echo "FAIL: keel eval did not pack: $out"; fail=1; }
# a packed run: stopped at 10 and resumed = 20 straight, bitwise; the loss falls
"$keel" train "${common[@]}" --steps 20 --out "$work/full" --save-every 10 >/dev/null
"$keel" train "${common[@]}" --steps 20 --out "$work/half" --stop-at 10 >/dev/null
"$keel" train --resume "$work/half" >/dev/null
cmp "$work/full/checkpoint/model.safetensors" "$work/half/checkpoint/model.safetensors" || { echo "FAIL: packed resume differs"; fail=1; }
first=$(grep -o '"loss": [0-9.e-]*' "$work/full/metrics.jsonl" | head -n1 | cut -d' ' -f2)
last=$(grep -o '"loss": [0-9.e-]*' "$work/full/metrics.jsonl" | tail -n1 | cut -d' ' -f2)
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < f) }' || { echo "FAIL: the packed run's loss did not fall ($first -> $last)"; fail=1; }
[ $fail -eq 0 ] && echo "packing: $packed windows packed, $unpacked one example a window, split $split, drop $drop; resume bitwise; loss $first -> $last"
exit $fail
