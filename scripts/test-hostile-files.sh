#!/usr/bin/env bash
# Hostile or mistaken files: each is refused with a message naming it and a non-zero exit, and
# nothing hangs (each command runs under a 20 s timeout; the code before this test hung on a FIFO,
# opened a shard path outside the checkpoint, and printed `loss nan` with exit 0):
#   a FIFO as config.json / as a shard / as tokenizer.json   -> "a FIFO, not a regular file"
#   a shard name in weight_map that leaves the folder        -> "a path outside the checkpoint folder"
#   NaN weights under keel eval                               -> "non-finite weights", exit 1
#   --trace-step past --steps                                 -> "is after the run's last step"
#   tokenizer.json ids 7.5, 1e8, 1e300, or an id given twice    -> named, refused
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
qwen3=$(dirname "$0")/../assets/qwen3/tokenizer.json
for spec in "float:7.5:ids must be integers" "huge:100000000:ids must be integers" "e300:1e300:ids must be integers" "dup:0:is given to both"; do
  IFS=: read -r name val pat <<<"$spec"
  node -e 'const fs=require("fs"); const t=JSON.parse(fs.readFileSync(process.argv[1])); t.model.vocab["a"]=Number(process.argv[2]);
    fs.writeFileSync(process.argv[3], JSON.stringify(t))' "$qwen3" "$val" "$work/tok-$name.json"
  expect "tokenizer-id-$name" "$pat" "$keel" tokenize --tokenizer "$work/tok-$name.json" hello
done
[ $fail -eq 0 ] && echo "hostile files: every case refused by name, none hung"
exit $fail
