#!/usr/bin/env bash
# keel tokenize --chat against transformers.js's apply_chat_template + tokenize (npm
# @huggingface/transformers 4.3.2, tests/chat/render.mjs) with Qwen3's tokenizer.json and
# tokenizer_config.json (its chat template): every conversation of tests/chat/conversations.jsonl
# (system prompt or not, multi-turn, empty content, unicode, special-token-like text, thinking
# blocks, reasoning_content, enable_thinking, tool turns) must give the same text and the same ids.
# tests/chat/python-semantics.jsonl holds conversations where transformers.js's Jinja departs from
# Python's (its lstrip/rstrip ignore their argument): there keel must differ from transformers.js
# exactly there, giving Python's result (checked against Python transformers by
# scripts/gpu-check.sh chat, where it is installed).
# Usage: test-chat-template.sh KEEL ASSETS_DIR
set -euo pipefail
keel=$1 assets=$2
here=$(cd "$(dirname "$0")/../tests/chat" && pwd)
tok=$assets/qwen3
work=$(mktemp -d /tmp/keel-chat.XXXXXX)
trap 'rm -rf "$work"' EXIT
fail=0
for f in conversations python-semantics; do
  node "$here/render.mjs" "$tok" "$here/$f.jsonl" >"$work/$f.tjs"
  "$keel" tokenize --tokenizer "$tok/tokenizer.json" --chat "$here/$f.jsonl" >"$work/$f.keel"
done
node - "$work" <<'JS' || fail=1
const fs = require("fs");
const w = process.argv[2];
const read = (f) => fs.readFileSync(`${w}/${f}`, "utf8").trim().split("\n").map((l) => JSON.parse(l));
let bad = 0;
const a = read("conversations.tjs"), b = read("conversations.keel");
if (a.length !== b.length || a.length < 30) { console.log(`FAIL: ${a.length} conversations from transformers.js, ${b.length} from keel (30 or more wanted)`); bad++; }
for (let i = 0; i < Math.min(a.length, b.length); i++) {
  const same = a[i].text === b[i].text && JSON.stringify(a[i].ids) === JSON.stringify(b[i].ids);
  if (!same) { bad++; console.log(`FAIL: conversation ${a[i].line}: transformers.js ${JSON.stringify(a[i].text)} vs keel ${JSON.stringify(b[i].text)}`); }
}
const pa = read("python-semantics.tjs"), pb = read("python-semantics.keel");
for (let i = 0; i < pa.length; i++) {
  // keel keeps what Python's str.lstrip('\n') keeps: transformers.js strips every leading space
  if (pa[i].text === pb[i].text) { bad++; console.log(`FAIL: python-semantics ${pa[i].line}: keel renders as transformers.js, not as Python`); }
  const norm = (s) => s.replace(/\n[ \t]+/g, "\n").replace(/<think>\n[ \t]+/g, "<think>\n");
  if (norm(pa[i].text) !== norm(pb[i].text)) { bad++; console.log(`FAIL: python-semantics ${pa[i].line}: differs beyond the leading spaces: ${JSON.stringify(pb[i].text)}`); }
}
console.log(bad ? `${bad} differences` : `${a.length} conversations: keel's text and ids identical to transformers.js apply_chat_template; ${pa.length} where transformers.js's lstrip departs from Python's: keel keeps Python's`);
process.exit(bad ? 1 : 0);
JS
exit $fail
