#!/usr/bin/env bash
# Installs llama.cpp for checking keel's GGUF export: the npm package node-llama-cpp 3.21.1 and its
# prebuilt CPU libraries for linux-x64 (whose model list has qwen35), pinned with their integrity
# hashes by tests/gguf/package-lock.json. Setup only: nothing is downloaded or built when the
# checks run (install scripts are skipped; the prebuilt binaries are used as shipped).
set -euo pipefail
cd "$(dirname "$0")/../tests/gguf"
want=3.21.1
have=$(node -p 'require("./node_modules/node-llama-cpp/package.json").version' 2>/dev/null || true)
if [ "$have" = "$want" ] && [ -d node_modules/@node-llama-cpp/linux-x64/bins ]; then exit 0; fi
command -v npm >/dev/null || { echo "setup-llama: npm is needed (Debian package npm)" >&2; exit 1; }
case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) ;;
  *) echo "setup-llama: node-llama-cpp's prebuilt libraries are pinned for linux-x64; this is $(uname -s)-$(uname -m)" >&2; exit 1 ;;
esac
echo "setup-llama: installing node-llama-cpp@$want (prebuilt llama.cpp, CPU) into tests/gguf/node_modules"
npm ci --no-audit --no-fund --omit=optional --ignore-scripts --loglevel=error >/dev/null
