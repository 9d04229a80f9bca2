#!/usr/bin/env python3
"""Writes the fuzzers' seed corpora (tests/fuzz/seeds/<target>/): small valid inputs each fuzzer
mutates. Run from the repository root after a build (it reads a trace keel wrote and the Qwen3
tokenizer the assets fetch); the seeds are committed, so this runs only to remake them."""
import json, os, struct, sys

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
out = os.path.join(root, "tests", "fuzz", "seeds")

def put(target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())

# safetensors: two small images
def st(header, payload):
    h = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(h)) + h + payload
put("safetensors", "f32-bf16", st({"__metadata__": {"format": "pt"}, "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
                                     "b": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]}}, bytes(range(32))))
put("safetensors", "f16-i64", st({"w": {"dtype": "F16", "shape": [], "data_offsets": [0, 2]}, "v": {"dtype": "I64", "shape": [1], "data_offsets": [8, 16]}}, bytes(16)))

# config.json: the fixture's two layouts
for ck in ("causal-f32-sharded", "multimodal-bf16"):
    with open(os.path.join(root, "tests/fixtures/qwen35-tiny", ck, "config.json")) as f:
        put("config", ck, f.read())

# tokenizer.json: Qwen3's, cut to its first 400 tokens (byte level: the 256 byte tokens are among
# them), the merges among those, and its added tokens renumbered after them
with open(os.path.join(root, "assets/qwen3/tokenizer.json")) as f:
    tok = json.load(f)
keep = {s: i for s, i in tok["model"]["vocab"].items() if i < 400}
merges = []
for m in tok["model"]["merges"]:
    a, b = m if isinstance(m, list) else m.split(" ", 1)
    if a in keep and b in keep and a + b in keep:
        merges.append(m)
tok["model"]["vocab"] = keep
tok["model"]["merges"] = merges
tok["added_tokens"] = [dict(t, id=400 + k) for k, t in enumerate(tok["added_tokens"][:6])]
put("tokenizer", "qwen3-400", json.dumps(tok, ensure_ascii=False))
tok["normalizer"] = None
tok["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
put("tokenizer", "gpt2-style", json.dumps(tok, ensure_ascii=False))

# trace: the first records of a trace keel wrote (check-reference --trace in the test suite)
with open(os.path.join(root, "build/trace-off.bin"), "rb") as f:
    b = f.read()
NAME = 112
pos, recs = 16, []
version = b[7] - ord("0")  # 2: a data stride; 3: and the kernels' description (256 bytes)
for _ in range(4):
    start = pos
    pos += NAME
    op, ty, ns = struct.unpack_from("<QQQ", b, pos); pos += 24
    pos += 64 + ns * (8 + NAME) + 8 + 8 + 24
    if version >= 3: pos += 256
    nd, = struct.unpack_from("<Q", b, pos); pos += 8
    if version >= 2: pos += 8
    pos += 8 * nd
    recs.append(b[start:pos])
put("trace", "first4", b[:8] + struct.pack("<Q", len(recs)) + b"".join(recs))

# trainer_state.json: what keel train writes (counters and the recorded options)
state = {"step": 6, "position": 12, "tokens": 192, "seed": 1, "window": 16, "batch": 2, "accum": 1, "world": 1,
         "vocabulary": "bytes",
         "options": {"data": ["t.txt"], "tokenizer": None, "eval_fraction": 0.05, "window": 16, "batch": 2, "accum": 1,
                     "steps": 6, "lr": 0.001, "lr_min": 0.0001, "warmup": 10, "weight_decay": 0.1, "clip": 1,
                     "freeze": None, "seed": "1", "out_dir": "W", "eval_every": 0, "eval_batches": 8, "save_every": 1,
                     "backend": "cpu", "threads": 2, "recompute": "off", "nproc": 1}}
put("trainer_state", "run", json.dumps(state, indent=1))
print("seeds written under", out)
