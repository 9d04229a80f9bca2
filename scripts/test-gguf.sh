#!/usr/bin/env bash
# keel export gguf against llama.cpp itself (node-llama-cpp 3.21.1's prebuilt libraries, installed
# by scripts/setup-llama.sh): for two checkpoints keel trained briefly on Moby Dick,
#   - a Qwen3.5-shape model (the tiny preset's layers, key and value heads of 16 so that llama.cpp
#     can run it, 2 key heads for 4 value heads so the value-head reordering is exercised) with
#     the Qwen3 tokenizer's 151,669-token vocabulary,
#   - the demo's byte-vocabulary model (the small preset),
# every export type is loaded in llama.cpp and compared with keel on a 64-token input:
#   f32        next-token probabilities within 1e-4 at every position, the same 32 greedy tokens
#   f16, bf16  probabilities within 4 units of the type's rounding (llama.cpp rounds the activations
#              to the weights' type in its products): 2e-3 for f16 (u = 2^-11), 1.6e-2 for bf16
#              (u = 2^-8); a tighter bf16 limit passes or fails with the particular trained model
#   q8_0       the same 16 greedy tokens, perplexity within 2%
# and the byte model's greedy text equals `keel generate`'s; a PEFT adapter merged on export (--adapter)
# agrees with the merge computed independently in node; a DoRA adapter is refused; what llama.cpp
# cannot run (the transformers fixture: key heads of 16, value heads of 24; another layer kind) or
# what keel cannot export faithfully (a large vocabulary with no tokenizer) is refused by name.
# Usage: test-gguf.sh KEEL TEXT QWEN3_TOKENIZER_DIR FIXTURE_DIR WORKDIR
set -euo pipefail
keel=$1 text=$2 qwen3=$3 fixture=$4 work=$5
here=$(cd "$(dirname "$0")/.." && pwd)
check=$here/tests/gguf/llama_check.mjs
[ -d "$here/tests/gguf/node_modules/node-llama-cpp" ] || { echo "test-gguf: llama.cpp is not installed (run scripts/setup-llama.sh)"; exit 1; }
rm -rf "$work" && mkdir -p "$work"
fail=0 extra=()

# 1. the Qwen3-vocabulary model (tests/gguf/tiny-qwen3-vocab.json: the tiny preset's config with
#    linear_value_head_dim 16 and vocab_size 151669, the Qwen3 tokenizer's ids 0..151668)
"$keel" train --init "$here/tests/gguf/tiny-qwen3-vocab.json" --tokenizer "$qwen3/tokenizer.json" --data "$text" --out "$work/q" \
  --steps 30 --window 64 --batch 4 --lr 1e-2 --lr-min 1e-3 --warmup 5 --eval-every 30 --seed 3 >"$work/q.log"
# 2. the demo's byte model
"$keel" train --preset small --data "$text" --out "$work/b" --steps 40 --window 64 --batch 8 --lr 3e-3 --warmup 5 \
  --eval-every 40 --seed 3 >"$work/b.log"

run_model() { # name checkpoint prompt-ids tokenizer-args...
  local name=$1 ck=$2 ids=$3; shift 3
  local out; out=$("$keel" generate --model "$ck" "$@" --prompt-ids "$ids" --temperature 0 --max-tokens 32 --print-ids \
                   --dump-logits "$work/$name.logits.safetensors")
  local greedy; greedy=$(cut -d, -f65- <<<"$out")
  for spec in f32:1e-4:32:0.02 f16:2e-3:32:0.02 bf16:1.6e-2:32:0.02 q8_0:1:16:0.02; do
    IFS=: read -r type ptol gn ppl <<<"$spec"
    "$keel" export gguf "$ck" "$work/$name-$type.gguf" --type "$type" "$@" >/dev/null || { echo "FAIL: export $name $type"; fail=1; continue; }
    node "$check" --gguf "$work/$name-$type.gguf" --keel "$work/$name.logits.safetensors" --keel-greedy "$greedy" \
      --prob-tol "$ptol" --greedy-n "$gn" --ppl-tol "$ppl" --label "$name $type" --text-out "$work/$name-$type.txt" ${extra[@]+"${extra[@]}"} || fail=1
  done
}
qids=$("$keel" tokenize --tokenizer "$qwen3/tokenizer.json" --ids --file "$text" | tr -s ' \n' ',' | cut -d, -f1001-1064)
# keel train put the tokenizer files in the checkpoint: the GGUF's chat template and end of
# sequence must be tokenizer_config.json's
extra=(--tokenizer-config "$qwen3/tokenizer_config.json")
run_model qwen3-vocab "$work/q/checkpoint" "$qids"
extra=()
bids=$(head -c 4000 "$text" | tail -c 64 | od -An -v -tu1 | tr -s ' \n' ',' | sed 's/^,//; s/,$//')
run_model bytes "$work/b/checkpoint" "$bids"

# 3. the byte model's greedy text: keel generate's, and llama.cpp's (f32) detokenized
prompt="Call me Ishmael. "
"$keel" generate --model "$work/b/checkpoint" --prompt "$prompt" --temperature 0 --max-tokens 48 >"$work/keel-text.txt"
pids=$(printf '%s' "$prompt" | od -An -v -tu1 | tr -s ' \n' ',' | sed 's/^,//; s/,$//')
"$keel" generate --model "$work/b/checkpoint" --prompt-ids "$pids" --temperature 0 --max-tokens 48 --print-ids \
  --dump-logits "$work/prompt.logits.safetensors" >"$work/keel-ids.txt"
node "$check" --gguf "$work/bytes-f32.gguf" --keel "$work/prompt.logits.safetensors" --greedy-n 48 \
  --keel-greedy "$(cut -d, -f$((${#prompt} + 1))- "$work/keel-ids.txt")" --text-out "$work/llama-text.txt" --label "bytes f32 text" || fail=1
if cmp -s <(printf '%s\n' "$(cat "$work/llama-text.txt")") "$work/keel-text.txt"; then
  echo "bytes f32: greedy text identical to keel generate's: $(head -c 80 "$work/keel-text.txt" | tr '\n' ' ')"
else
  echo "FAIL: greedy text differs"; echo "  keel:      $(cat "$work/keel-text.txt")"; echo "  llama.cpp: $(cat "$work/llama-text.txt")"; fail=1
fi

# 4. --adapter: a random PEFT adapter merged by keel into the byte model, against the merge computed
#    independently in node (float64, tests/gguf/make_adapter.mjs) and run by keel
node "$here/tests/gguf/make_adapter.mjs" "$work/b/checkpoint" "$work/adapter" "$work/merged" 11 >/dev/null
out=$("$keel" generate --model "$work/merged" --prompt-ids "$bids" --temperature 0 --max-tokens 32 --print-ids --dump-logits "$work/merged.logits.safetensors")
"$keel" export gguf "$work/b/checkpoint" "$work/adapter.gguf" --type f32 --adapter "$work/adapter" >/dev/null || { echo "FAIL: export --adapter"; fail=1; }
node "$check" --gguf "$work/adapter.gguf" --keel "$work/merged.logits.safetensors" --keel-greedy "$(cut -d, -f65- <<<"$out")" \
  --label "bytes f32 + adapter vs the merged checkpoint" || fail=1
node -e 'const fs=require("fs"); const c=JSON.parse(fs.readFileSync(process.argv[1])); c.use_dora=true; fs.writeFileSync(process.argv[2], JSON.stringify(c))' \
  "$work/adapter/adapter_config.json" "$work/dora.json"
mkdir -p "$work/dora" && cp "$work/adapter/adapter_model.safetensors" "$work/dora/" && mv "$work/dora.json" "$work/dora/adapter_config.json"
if "$keel" export gguf "$work/b/checkpoint" "$work/dora.gguf" --adapter "$work/dora" 2>"$work/dora.txt" || ! grep -q use_dora "$work/dora.txt"; then
  echo "FAIL: a DoRA adapter was not refused by name: $(cat "$work/dora.txt")"; fail=1
else echo "refused as expected: $(cat "$work/dora.txt")"; fi

# 5. what llama.cpp cannot run, or what keel cannot export faithfully, is refused by name, and
#    nothing is written: the transformers fixture (key heads of 16, value heads of 24), a layer
#    kind Qwen3.5 does not have, a vocabulary of 151,669 with no tokenizer files
mkdir -p "$work/badlayer"
sed 's/"full_attention"/"sliding_attention"/' "$work/b/checkpoint/config.json" >"$work/badlayer/config.json"
cp "$work/b/checkpoint/model.safetensors" "$work/badlayer/"
"$keel" init --config "$here/tests/gguf/tiny-qwen3-vocab.json" "$work/notok" >/dev/null
for spec in "$fixture|linear_key_head_dim == linear_value_head_dim" "$work/badlayer|sliding_attention" "$work/notok|no tokenizer.json"; do
  src=${spec%%|*} want=${spec#*|}
  if "$keel" export gguf "$src" "$work/refused.gguf" 2>"$work/refused.txt"; then echo "FAIL: $src was exported"; fail=1
  elif ! grep -qF "$want" "$work/refused.txt" || ls "$work"/refused.gguf* >/dev/null 2>&1; then
    echo "FAIL: refusal of $src does not name '$want', or left a file: $(cat "$work/refused.txt")"; fail=1
  else echo "refused as expected: $(cat "$work/refused.txt")"; fi
done
[ $fail -eq 0 ] && echo "gguf: every export loads in llama.cpp and agrees with keel"
exit $fail
