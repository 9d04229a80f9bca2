#!/usr/bin/env bash
# Installs transformers.js (npm @huggingface/transformers 4.3.2, pinned with its dependencies'
# integrity hashes by tests/chat/package-lock.json) for checking keel's chat template rendering
# against its apply_chat_template. Setup only: nothing is downloaded when the checks run; install
# scripts are skipped (only the tokenizer and the Jinja engine are used, offline).
set -euo pipefail
cd "$(dirname "$0")/../tests/chat"
want=4.3.2
have=$(node -p 'require("./node_modules/@huggingface/transformers/package.json").version' 2>/dev/null || true)
if [ "$have" = "$want" ]; then exit 0; fi
command -v npm >/dev/null || { echo "setup-transformersjs: npm is needed (Debian package npm)" >&2; exit 1; }
echo "setup-transformersjs: installing @huggingface/transformers@$want into tests/chat/node_modules"
npm ci --no-audit --no-fund --ignore-scripts --loglevel=error >/dev/null
