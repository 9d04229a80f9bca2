#!/usr/bin/env bash
# Fine-tuning on conversations: a tiny model with Qwen3's vocabulary (tests/gguf/tiny-qwen3-vocab.json)
# and Qwen3's tokenizer and chat template beside it, trained on "messages" data (a sum asked, then
# asked again plus one; a system prompt in a third of them): the conversations are detected and
# rendered, the loss counts only the assistant's turns, whose held-out loss falls; keel eval reports
# the same masked loss; keel generate --chat answers and stops at the end of the turn; a
# conversation without an assistant turn is refused by file and line.
# Usage: test-chat-train.sh KEEL REPO_DIR ASSETS_DIR WORKDIR
set -euo pipefail
keel=$1 repo=$2 assets=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
awk 'BEGIN { srand(3); for (i = 0; i < 2000; i++) { a = int(rand() * 50); b = int(rand() * 50);
  if (i % 3 == 0) printf "{\"messages\": [{\"role\": \"system\", \"content\": \"You add numbers.\"}, {\"role\": \"user\", \"content\": \"%d+%d?\"}, {\"role\": \"assistant\", \"content\": \"%d\"}]}\n", a, b, a + b;
  else printf "{\"messages\": [{\"role\": \"user\", \"content\": \"%d+%d?\"}, {\"role\": \"assistant\", \"content\": \"%d\"}, {\"role\": \"user\", \"content\": \"and %d+1?\"}, {\"role\": \"assistant\", \"content\": \"%d\"}]}\n", a, b, a + b, a + b, a + b + 1 } }' >"$work/chat.jsonl"
"$keel" init --config "$repo/tests/gguf/tiny-qwen3-vocab.json" "$work/base" >/dev/null
cp "$assets/qwen3/tokenizer.json" "$assets/qwen3/tokenizer_config.json" "$work/base/"
fail=0
out=$("$keel" train --model "$work/base" --data "$work/chat.jsonl" --out "$work/run" --steps 40 --window 64 --batch 8 --lr 3e-3 --eval-every 40)
grep -q "2000 conversations" <<<"$out" || { echo "FAIL: the conversations were not detected: $out"; fail=1; }
first=$(grep -o '"eval_loss": [0-9.e-]*' "$work/run/metrics.jsonl" | head -n1 | cut -d' ' -f2)
last=$(grep -o '"eval_loss": [0-9.e-]*' "$work/run/metrics.jsonl" | tail -n1 | cut -d' ' -f2)
awk -v f="$first" -v l="$last" 'BEGIN { exit !(l < f / 2) }' || { echo "FAIL: the assistant turns' eval loss did not fall ($first -> $last)"; fail=1; }
ev=$("$keel" eval --model "$work/run/checkpoint" --data "$work/chat.jsonl" --window 64 --batch 8)
grep -q "the loss counts the completions and the assistant's turns" <<<"$ev" || { echo "FAIL: keel eval: $ev"; fail=1; }
ans=$("$keel" generate --model "$work/run/checkpoint" --chat --prompt "12+30?" --temperature 0 --max-tokens 40)
[ -n "$ans" ] || { echo "FAIL: generate --chat printed nothing"; fail=1; }
echo '{"messages": [{"role": "user", "content": "no answer"}]}' >"$work/bad.jsonl"
if out=$("$keel" train --model "$work/base" --data "$work/bad.jsonl" --out "$work/bad" --steps 1 --window 8 --batch 1 2>&1) \
   || ! grep -q 'bad.jsonl:1: expected a JSON object with "messages"' <<<"$out"; then
  echo "FAIL: a conversation without an assistant turn was not refused by file and line: $out"; fail=1
fi
[ $fail -eq 0 ] && echo "chat: 2000 conversations, assistant-only eval loss $first -> $last; generate --chat answered: $(tr '\n' ' ' <<<"$ans" | cut -c1-60)"
exit $fail
