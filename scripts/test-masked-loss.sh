#!/usr/bin/env bash
# prompt/completion data and the masked loss, on the transformers fixture's model: (1) the format is
# detected, only the completions (and the end-of-text after each) are counted, and the held-out
# loss on them falls; (2) the loss is the mean over the counted targets of the whole global batch:
# --batch 2 and --batch 1 --accum 2 (the same windows) give the same first-step loss to float32
# rounding, although their two windows count different numbers of targets (a mean per micro-batch
# would not), and --nproc 2 equals --accum 2 bitwise; (3) bad lines are named by file and line, or
# counted with --skip-bad-lines; conversations for a model without a tokenizer (bytes) are refused
# by name; keel eval reports the completions' loss. Usage: test-masked-loss.sh KEEL TINY_FIXTURE_DIR WORKDIR
set -euo pipefail
keel=$1 fx=$2 work=$3
base=$fx/causal-f32-sharded
rm -rf "$work" && mkdir -p "$work"
# a+b= with the sum said 1 to 6 times: completions of very different lengths, so that windows count
# very different numbers of targets
awk 'BEGIN { srand(7); for (i = 0; i < 3000; i++) { a = int(rand() * 50); b = int(rand() * 50); r = 1 + int(rand() * 6);
             c = a + b; for (k = 1; k < r; k++) c = c " " (a + b);
             printf "{\"prompt\": \"%d+%d=\", \"completion\": \"%s\"}\n", a, b, c } }' >"$work/pc.jsonl"
fail=0
out=$("$keel" train --model "$base" --data "$work/pc.jsonl" --out "$work/a" --steps 40 --window 64 --batch 4 --lr 3e-3 --eval-every 40)
grep -q "3000 prompt/completion examples" <<<"$out" || { echo "FAIL: the format was not detected: $out"; fail=1; }
counted=$(grep -o 'the loss counts [0-9]* of the [0-9]*' <<<"$out" | awk '{print $4, $7}')
read -r c n <<<"$counted"
awk -v c="$c" -v n="$n" 'BEGIN { exit !(c > 0 && c < 0.8 * n) }' || { echo "FAIL: counted $c of $n targets"; fail=1; }
first=$(grep -o '"eval_loss": [0-9.e-]*' "$work/a/metrics.jsonl" | head -n1 | cut -d' ' -f2)
last=$(grep -o '"eval_loss": [0-9.e-]*' "$work/a/metrics.jsonl" | tail -n1 | cut -d' ' -f2)
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < f - 2) }' || { echo "FAIL: the completions' eval loss did not fall ($first -> $last)"; fail=1; }
grep -q '"tokens_trained": ' "$work/a/metrics.jsonl" || { echo "FAIL: metrics.jsonl has no tokens_trained"; fail=1; }
# one global batch, three ways
common=(--model "$base" --data "$work/pc.jsonl" --steps 3 --window 24 --lr 3e-3 --eval-every 0 --seed 5)
"$keel" train "${common[@]}" --batch 2 --out "$work/b2" >/dev/null
"$keel" train "${common[@]}" --batch 1 --accum 2 --out "$work/acc" >/dev/null
"$keel" train "${common[@]}" --batch 1 --nproc 2 --out "$work/dp" >/dev/null
l1() { grep -o '"step": 1, "tokens": [0-9]*, "loss": [0-9.e-]*' "$1/metrics.jsonl" | awk '{print $NF}'; }
awk -v a="$(l1 "$work/b2")" -v b="$(l1 "$work/acc")" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 2e-6 * a) }' \
  || { echo "FAIL: first-step loss --batch 2 $(l1 "$work/b2") vs --batch 1 --accum 2 $(l1 "$work/acc")"; fail=1; }
cmp "$work/acc/checkpoint/model.safetensors" "$work/dp/checkpoint/model.safetensors" || { echo "FAIL: --nproc 2 differs from --accum 2"; fail=1; }
diff <(grep -o '"loss": [0-9.e-]*' "$work/acc/metrics.jsonl") <(grep -o '"loss": [0-9.e-]*' "$work/dp/metrics.jsonl") >/dev/null \
  || { echo "FAIL: --nproc 2 and --accum 2 log different losses"; fail=1; }
# bad input
{ head -n 5 "$work/pc.jsonl"; echo '{"prompt": "1+1="}'; echo 'not json'; tail -n 400 "$work/pc.jsonl"; } >"$work/bad.jsonl"
if out=$("$keel" train --model "$base" --data "$work/bad.jsonl" --out "$work/bad" --steps 1 --window 16 --batch 1 2>&1) \
   || ! grep -q 'bad.jsonl:6: expected a JSON object with "prompt" and "completion" strings' <<<"$out"; then
  echo "FAIL: a line without a completion was not refused by file and line: $out"; fail=1
fi
out=$("$keel" train --model "$base" --data "$work/bad.jsonl" --out "$work/bad" --steps 1 --window 16 --batch 1 --skip-bad-lines 2>&1) \
  && grep -q "2 bad lines skipped" <<<"$out" || { echo "FAIL: --skip-bad-lines: $out"; fail=1; }
echo '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}' >"$work/chat.jsonl"
if out=$("$keel" train --model "$base" --data "$work/chat.jsonl" --out "$work/chat" --steps 1 --window 4 --batch 1 2>&1) \
   || ! grep -q 'chat.jsonl:1: conversations ("messages") need the model'"'"'s tokenizer and its chat template' <<<"$out"; then
  echo "FAIL: conversations for a model without a tokenizer were not refused by name: $out"; fail=1
fi
out=$("$keel" eval --model "$work/a/checkpoint" --data "$work/pc.jsonl" --window 64 --batch 4)
grep -q "the loss counts the completions" <<<"$out" || { echo "FAIL: keel eval: $out"; fail=1; }
[ $fail -eq 0 ] && echo "masked loss: $c of $n targets counted; completions' eval loss $first -> $last; one global batch, three ways: first-step loss $(l1 "$work/b2") / $(l1 "$work/acc"), --nproc 2 = --accum 2 bitwise"
exit $fail
