#!/usr/bin/env bash
# Hostile or mistaken files: each is refused with a message naming it and a non-zero exit, and
# nothing hangs (each command runs under a 20 s timeout; the code before this test hung on a FIFO,
# opened a shard path outside the checkpoint, and printed `loss nan` with exit 0):
#   a FIFO as config.json / as a shard / as tokenizer.json   -> "a FIFO, not a regular file"
#   a shard name in weight_map that leaves the folder        -> "a path outside the checkpoint folder"
#   NaN weights under keel eval                               -> "non-finite weights", exit 1
#   --trace-step past --steps                                 -> "is after the run's last step"
#   tokenizer.json ids 7.5, 1e8, 1e300, or an id given twice    -> named, refused
#   trainer_state.json counters negative, huge or fractional   -> named, refused
#   generate without a prompt, on NaN weights, huge --max-tokens -> refused (it crashed or read garbage)
#   save / info on NaN weights, info on an unexpected tensor     -> named, exit 1 (save: --allow-nonfinite)
#   config sizes that overflow, batch x window too large        -> the field named
#   crafted traces for keel diff (a 2^30 count, a bad op)       -> refused before allocating
#   NaN / negative / huge flag values                          -> the flag named
#   bench tokenize with a file name holding shell syntax       -> runs nothing
#   a pre-tokenizer regex hitting PCRE2's match limit           -> the text piece and the limits named
# Usage: test-hostile-files.sh KEEL FIXTURE_DIR TEXT WORKDIR
set -uo pipefail
keel=$1 fixture=$2 text=$3 work=$4
rm -rf "$work" && mkdir -p "$work"
fail=0
expect() { # name pattern command...
  local name=$1 pat=$2; shift 2
  local out rc
  out=$(timeout 20 "$@" 2>&1); rc=$?
  if [ $rc -eq 124 ]; then echo "FAIL $name: hung (timeout)"; fail=1
  elif [ $rc -eq 0 ]; then echo "FAIL $name: exit 0"; fail=1
  elif ! grep -qF -- "$pat" <<<"$out"; then echo "FAIL $name: no '$pat' in: $out"; fail=1
  else echo "ok   $name: $(grep -F -- "$pat" <<<"$out" | head -n1)"; fi
}
cp -r "$fixture" "$work/fifo-config" && chmod -R u+w "$work/fifo-config" && rm "$work/fifo-config/config.json" && mkfifo "$work/fifo-config/config.json"
expect fifo-config "a FIFO, not a regular file" "$keel" info "$work/fifo-config"
cp -r "$fixture" "$work/fifo-shard" && chmod -R u+w "$work/fifo-shard" && rm "$work/fifo-shard/model-00002-of-00006.safetensors" \
  && mkfifo "$work/fifo-shard/model-00002-of-00006.safetensors"
expect fifo-shard "a FIFO, not a regular file" "$keel" info "$work/fifo-shard"
mkfifo "$work/tokenizer.json"
expect fifo-tokenizer "a FIFO, not a regular file" "$keel" tokenize --tokenizer "$work/tokenizer.json" hello
cp -r "$fixture" "$work/escape" && chmod -R u+w "$work/escape"
sed -i '0,/"model-00001-of-00006.safetensors"/s//"..\/..\/..\/etc\/passwd"/' "$work/escape/model.safetensors.index.json"
expect shard-escape "a path outside the checkpoint folder" "$keel" info "$work/escape"
"$keel" init --preset small "$work/nan" >/dev/null
node -e 'const fs=require("fs"); const f=process.argv[1]; const b=fs.readFileSync(f); const n=Number(b.readBigUInt64LE(0));
  const h=JSON.parse(b.subarray(8,8+n)); const t=h["model.norm.weight"]; b.writeFloatLE(NaN, 8+n+t.data_offsets[0]); fs.writeFileSync(f,b)' \
  "$work/nan/model.safetensors"
head -c 4000 "$text" >"$work/short.txt"
expect nan-eval "non-finite weights" "$keel" eval --model "$work/nan" --data "$work/short.txt" --window 32 --batch 4
expect trace-step "is after the run's last step" "$keel" train --preset small --data "$text" --out "$work/t" --steps 2 --trace "$work/t.trace" --trace-step 5
# a tokenizer.json's ids: an integer in [0, entries), one string each (a float id was truncated, a
# huge one allocated gigabytes, 1e300 was an undefined conversion, a second string shared an id)
qwen3=$(cd "$(dirname "$0")/.." && pwd)/assets/qwen3/tokenizer.json
for spec in "float:7.5:ids must be integers" "huge:100000000:ids must be integers" "e300:1e300:ids must be integers" "dup:0:is given to both"; do
  IFS=: read -r name val pat <<<"$spec"
  node -e 'const fs=require("fs"); const t=JSON.parse(fs.readFileSync(process.argv[1])); t.model.vocab["a"]=Number(process.argv[2]);
    fs.writeFileSync(process.argv[3], JSON.stringify(t))' "$qwen3" "$val" "$work/tok-$name.json"
  expect "tokenizer-id-$name" "$pat" "$keel" tokenize --tokenizer "$work/tok-$name.json" hello
done
# a pre-tokenizer pattern that backtracks without end: PCRE2's match limit, reported with the text
node -e 'const fs=require("fs"); const t=JSON.parse(fs.readFileSync(process.argv[1]));
  const walk=(o)=>{ if (o && typeof o==="object") { if (o.type==="Split" && o.pattern && o.pattern.Regex) o.pattern.Regex="(a|aa)+$"; for (const k in o) walk(o[k]); } };
  walk(t.pre_tokenizer); fs.writeFileSync(process.argv[2], JSON.stringify(t))' "$qwen3" "$work/tok-backtrack.json"
printf 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa!' >"$work/backtrack.txt"
expect pcre2-match-limit "match limit exceeded (match limit" "$keel" tokenize --tokenizer "$work/tok-backtrack.json" --file "$work/backtrack.txt"
# trainer_state.json counters out of range (a negative position was a use-after-free, a negative
# step a negative learning rate)
"$keel" train --preset tiny --data "$work/short.txt" --window 16 --batch 2 --steps 2 --out "$work/st" >/dev/null 2>&1
for spec in "position:-3" "step:-1" "tokens:1e300" "position:2.5"; do
  IFS=: read -r key val <<<"$spec"
  cp -r "$work/st/checkpoint" "$work/st-$key"
  node -e 'const fs=require("fs"); const f=process.argv[1]; const j=JSON.parse(fs.readFileSync(f)); j[process.argv[2]]=Number(process.argv[3]);
    fs.writeFileSync(f, JSON.stringify(j))' "$work/st-$key/trainer_state.json" "$key" "$val"
  expect "state-$key-$val" "\"$key\" must be an integer >= 0" "$keel" train --resume "$work/st-$key" --out "$work/st-out-$key" --steps 4
done
# keel generate: no prompt; NaN weights (sampling read before its buffer); an absurd --max-tokens
expect generate-no-prompt "give the prompt" "$keel" generate --model "$fixture" --max-tokens 4
expect generate-nan "are not finite" "$keel" generate --model "$work/nan" --prompt "a" --max-tokens 4
expect generate-nan-greedy "are not finite" "$keel" generate --model "$work/nan" --prompt "a" --max-tokens 4 --temperature 0
expect generate-max-tokens "--max-tokens" "$keel" generate --model "$fixture" --prompt "a" --max-tokens 99999999999
expect generate-top-p-nan "--top-p" "$keel" generate --model "$fixture" --prompt "a" --top-p nan
# keel save and keel info on NaN weights; info on a checkpoint with a tensor of the wrong shape
expect save-nan "non-finite values" "$keel" save "$work/nan" "$work/nan-saved"
[ -e "$work/nan-saved" ] && { echo "FAIL save-nan: wrote $work/nan-saved anyway"; fail=1; }
"$keel" save "$work/nan" "$work/nan-saved" --allow-nonfinite >/dev/null 2>&1 || { echo "FAIL save-nan: --allow-nonfinite did not write"; fail=1; }
expect info-nan "non-finite values" "$keel" info "$work/nan"
cp -r "$work/nan" "$work/shape" && node -e 'const fs=require("fs"); const f=process.argv[1]; const b=fs.readFileSync(f);
  const n=Number(b.readBigUInt64LE(0)); const h=JSON.parse(b.subarray(8,8+n)); const t=h["model.norm.weight"];
  const s=JSON.stringify(h).replace(`"shape":[${t.shape[0]}]`, `"shape":[1,${t.shape[0]}]`);
  const hb=Buffer.from(s.padEnd(n, " ")); if (hb.length!==n) process.exit(1); hb.copy(b,8); fs.writeFileSync(f,b)' "$work/shape/model.safetensors"
"$keel" info "$work/shape" >/dev/null 2>&1 || true
node -e 'const fs=require("fs"); const f=process.argv[1]; const b=fs.readFileSync(f); const n=Number(b.readBigUInt64LE(0));
  const h=JSON.parse(b.subarray(8,8+n)); const end=b.length-8-n; h["model.extra.weight"]={dtype:"F32", shape:[0], data_offsets:[end,end]};
  const s=JSON.stringify(h); const hb=Buffer.from(s); const out=Buffer.alloc(8); out.writeBigUInt64LE(BigInt(hb.length));
  fs.writeFileSync(f, Buffer.concat([out, hb, b.subarray(8+n)]))' "$work/shape/model.safetensors"
expect info-unexpected "unexpected tensor 'model.extra.weight'" "$keel" info "$work/shape"
# config dimensions whose products overflow, or absurd sizes, refused naming the field
cp -r "$fixture" "$work/cfg-overflow" && chmod -R u+w "$work/cfg-overflow"
node -e 'const fs=require("fs"); const f=process.argv[1]; const j=JSON.parse(fs.readFileSync(f)); j.vocab_size=4611686018427387;
  j.hidden_size=4611686018427; fs.writeFileSync(f, JSON.stringify(j))' "$work/cfg-overflow/config.json"
expect config-overflow "is larger than keel supports" "$keel" info "$work/cfg-overflow"
node -e 'const fs=require("fs"); const f=process.argv[1]; const j=JSON.parse(fs.readFileSync(f)); j.vocab_size=100000;
  j.hidden_size=1024; j.num_attention_heads=4194304; j.num_key_value_heads=4194304; j.head_dim=4194304; fs.writeFileSync(f, JSON.stringify(j))' "$work/cfg-overflow/config.json"
expect config-heads "num_attention_heads x head_dim" "$keel" info "$work/cfg-overflow"
expect batch-window "tokens per micro-batch" "$keel" train --preset tiny --data "$work/short.txt" --out "$work/bw" --batch 1048576 --window 16777216
# keel diff on crafted traces: a huge record count in a small file; an op number outside the table
"$keel" check-reference "$(dirname "$fixture")" --checkpoint "$(basename "$fixture")" --trace "$work/real.trace" >/dev/null 2>&1
node -e 'const fs=require("fs"); const b=fs.readFileSync(process.argv[1]); const s=Buffer.from(b.subarray(0, 3000)); s.writeBigUInt64LE(1n<<30n, 8);
  fs.writeFileSync(process.argv[2], s); const c=Buffer.from(b); c.writeBigUInt64LE(100000n, 16+112); fs.writeFileSync(process.argv[3], c)'   "$work/real.trace" "$work/count.trace" "$work/op.trace"
expect trace-count "a file of 3000 bytes holds at most" "$keel" diff "$work/count.trace" "$work/real.trace"
expect trace-op "outside keel's tables" "$keel" diff "$work/op.trace" "$work/real.trace"
# flags: NaN and out-of-range values, too many threads
expect flag-clip-nan "--clip" "$keel" train --preset tiny --data "$work/short.txt" --out "$work/f" --clip nan
expect flag-tolerance "--tolerance" "$keel" diff "$work/real.trace" "$work/real.trace" --tolerance -1
expect flag-threads "--threads" "$keel" eval --model "$fixture" --data "$work/short.txt" --threads 10000
# keel bench tokenize: a file name is an argument, never shell text
mkdir -p "$work/bt" && ln -sfn "$(cd "$(dirname "$0")/.." && pwd)/bench" "$work/bt/bench"
evil="x';touch pwned;echo '.txt"
cp "$work/short.txt" "$work/bt/$evil"
(cd "$work/bt" && timeout 60 "$keel" bench tokenize --tokenizer "$qwen3" --text "$evil" --reps 1 >/dev/null 2>&1)
if [ -e "$work/bt/pwned" ]; then echo "FAIL bench-tokenize: a crafted file name ran a command"; fail=1; else echo "ok   bench-tokenize: the crafted file name ran nothing"; fi
[ $fail -eq 0 ] && echo "hostile files: every case refused by name, none hung"
exit $fail
