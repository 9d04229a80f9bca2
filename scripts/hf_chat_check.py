"""keel tokenize --chat against Python transformers' apply_chat_template, the renderer the chat
templates are written for (on the GPU machine, where transformers is installed).

Usage: python3 hf_chat_check.py KEEL TOKENIZER_DIR CONVERSATIONS.jsonl...
For every conversation: transformers renders it (tokenize=False) and tokenizes the text; keel's
text and ids must be identical. Prints one line per file and 'N passed, N failed'.
"""
import json
import subprocess
import sys

from transformers import AutoTokenizer

keel, tok_dir, files = sys.argv[1], sys.argv[2], sys.argv[3:]
tok = AutoTokenizer.from_pretrained(tok_dir)
passed = failed = 0
for f in files:
    out = subprocess.run([keel, "tokenize", "--tokenizer", f"{tok_dir}/tokenizer.json", "--chat", f],
                         capture_output=True, text=True, check=True).stdout.strip().split("\n")
    lines = [l for l in open(f, encoding="utf-8").read().split("\n") if l]
    bad = 0
    for line, got in zip(lines, out):
        c, k = json.loads(line), json.loads(got)
        msgs = c.pop("messages")
        text = tok.apply_chat_template(msgs, tokenize=False, **c)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if text != k["text"] or ids != k["ids"]:
            bad += 1
            print(f"  {f}:{k['line']}: transformers {text!r}\n    keel {k['text']!r}")
    ok = bad == 0 and len(out) == len(lines)
    passed += ok
    failed += not ok
    print(f"{f}: {len(lines)} conversations, {len(lines) - bad} identical to transformers {'OK' if ok else 'FAIL'}")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
