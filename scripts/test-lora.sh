#!/usr/bin/env bash
# keel train --lora-rank on the transformers fixture's model: (1) PEFT's format (adapter_config.json,
# adapter_model.safetensors with base_model.model.<module>.lora_A/B.weight names), no full
# checkpoint written; (2) a run stopped after 6 steps and resumed to 12 ends byte-identical to the
# straight run (factors and AdamW moments), and so do recompute full, and --nproc 2 against
# --accum 2 (dropout masks follow the global micro-batch); (3) a bf16 base trains with recompute
# full and off bitwise alike; (4) keel eval --adapter (unmerged) and keel eval of keel merge's
# checkpoint give the same loss, below the base's; (5) broken adapters are refused by name.
# Usage: test-lora.sh KEEL TINY_FIXTURE_DIR TEXT WORKDIR
set -euo pipefail
keel=$1 fx=$2 text=$3 work=$4
base=$fx/causal-f32-sharded
rm -rf "$work" && mkdir -p "$work"
common=(--model "$base" --data "$text" --window 32 --batch 2 --steps 12 --warmup 2 --eval-every 6 --lr 1e-2 --seed 3
        --lora-rank 4 --lora-alpha 8 --lora-dropout 0.1)
"$keel" train "${common[@]}" --out "$work/a" >/dev/null
"$keel" train "${common[@]}" --out "$work/b" --stop-at 6 >/dev/null
"$keel" train --resume "$work/b/checkpoint" --out "$work/c" >/dev/null
"$keel" train "${common[@]}" --out "$work/r" --recompute full --threads 1 >/dev/null
fail=0
ck=$work/a/checkpoint
for f in adapter_config.json adapter_model.safetensors optimizer.safetensors trainer_state.json; do
  [ -s "$ck/$f" ] || { echo "FAIL: $ck/$f missing"; fail=1; }
done
[ ! -e "$ck/model.safetensors" ] || { echo "FAIL: a LoRA run wrote the full weights"; fail=1; }
grep -q '"peft_type":[[:space:]]*"LORA"' "$ck/adapter_config.json" && grep -q '"r":[[:space:]]*4,' "$ck/adapter_config.json" \
  && grep -q '"lora_alpha":[[:space:]]*8,' "$ck/adapter_config.json" || { echo "FAIL: adapter_config.json: $(cat "$ck/adapter_config.json")"; fail=1; }
# (not `head | grep -q` under pipefail: grep's early exit can kill head with SIGPIPE, a failure now and then)
grep -aq '"base_model.model.model.layers.0.linear_attn.in_proj_qkv.lora_A.weight"' <(head -c 20000 "$ck/adapter_model.safetensors") \
  || { echo "FAIL: PEFT's tensor names are not in adapter_model.safetensors"; fail=1; }
for f in adapter_model.safetensors optimizer.safetensors; do
  cmp "$ck/$f" "$work/c/checkpoint/$f" || { echo "FAIL: resumed $f differs"; fail=1; }
  cmp "$ck/$f" "$work/r/checkpoint/$f" || { echo "FAIL: $f with recompute full (1 thread) differs"; fail=1; }
done
# data parallel: 2 ranks of batch 1 = one process with --accum 2 of batch 1, bitwise
dp=(--model "$base" --data "$text" --window 32 --batch 1 --steps 4 --eval-every 0 --lr 1e-2 --lora-rank 4 --lora-dropout 0.2)
"$keel" train "${dp[@]}" --accum 2 --out "$work/acc" >/dev/null
"$keel" train "${dp[@]}" --nproc 2 --out "$work/dp" >/dev/null
cmp "$work/acc/checkpoint/adapter_model.safetensors" "$work/dp/checkpoint/adapter_model.safetensors" || { echo "FAIL: --nproc 2 differs from --accum 2"; fail=1; }
# a bf16 base: recompute full and off alike
bf=(--model "$base" --data "$text" --window 32 --batch 2 --steps 4 --eval-every 0 --lr 1e-2 --lora-rank 4 --base-dtype bf16)
"$keel" train "${bf[@]}" --out "$work/bf-off" >/dev/null
"$keel" train "${bf[@]}" --out "$work/bf-full" --recompute full >/dev/null
cmp "$work/bf-off/checkpoint/adapter_model.safetensors" "$work/bf-full/checkpoint/adapter_model.safetensors" || { echo "FAIL: bf16 base, recompute full differs"; fail=1; }
# eval: unmerged adapter = merged checkpoint, both better than the base
"$keel" merge "$base" "$ck" "$work/merged" >/dev/null
head -c 40000 "$text" >"$work/eval.txt"
loss() { "$keel" eval "$@" --data "$work/eval.txt" --window 32 --batch 8 | grep -o 'loss [0-9.]*' | cut -d' ' -f2; }
l_base=$(loss --model "$base") l_ad=$(loss --model "$base" --adapter "$ck") l_m=$(loss --model "$work/merged")
[ "$l_ad" = "$l_m" ] || { echo "FAIL: eval --adapter $l_ad but the merged checkpoint $l_m"; fail=1; }
awk -v b="$l_base" -v a="$l_ad" 'BEGIN { exit !(a < b - 0.1) }' || { echo "FAIL: the adapter did not lower the loss ($l_base -> $l_ad)"; fail=1; }
# broken adapters: refused by name, non-zero exit
mkdir -p "$work/bad" && cp "$ck/adapter_config.json" "$work/bad/"
head -c 1000 "$ck/adapter_model.safetensors" >"$work/bad/adapter_model.safetensors"
for cmd in "eval --model $base --data $text --adapter $work/bad" "merge $base $work/bad $work/merged-bad"; do
  if out=$("$keel" $cmd 2>&1); then echo "FAIL: keel $cmd accepted a truncated adapter"; fail=1
  elif ! grep -q "adapter_model.safetensors" <<<"$out"; then echo "FAIL: keel $cmd: the message does not name the file: $out"; fail=1; fi
done
[ ! -e "$work/merged-bad" ] || { echo "FAIL: a failed merge left $work/merged-bad"; fail=1; }
if out=$("$keel" train --resume "$work/b/checkpoint" --out "$work/d" --lora-rank 8 2>&1) || ! grep -q -- "--lora-rank cannot change" <<<"$out"; then
  echo "FAIL: --resume with another --lora-rank was not refused by name: $out"; fail=1
fi
[ $fail -eq 0 ] && echo "LoRA: PEFT format; resume, recompute, --nproc 2 and a bf16 base bitwise; eval loss base $l_base -> adapter $l_ad = merged $l_m"
exit $fail
