"""Copies a checkpoint folder with every float32 weight moved one ulp up or down (seeded, reproducible).

Usage: python3 perturb_weights.py SRC DST SEED

The copies are realizations of the same model for a float32 comparison that one sample cannot
settle: on the fixture's model the float64 logits themselves move by 4.5e-6 to 1.1e-5 (relative)
when every weight moves by one float32 ulp, a few positions carrying it, so any float32 run's error
on a handful of ids is a draw of that size (docs/h200-log.md, "The PEFT logits check pooled").
scripts/peft_check.py pools keel's and PEFT's errors over such copies.  Zeros and non-float32
tensors are copied as they are; DST is replaced.  Pure Python: no numpy or torch needed.
"""
import array
import json
import os
import random
import shutil
import struct
import sys

if len(sys.argv) != 4:
    sys.exit(__doc__.strip().split("\n\n")[1])
src, dst, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
if not os.path.isdir(src):
    sys.exit(f"perturb_weights.py: {src}: not a folder")
rng = random.Random(seed)
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst)
moved = 0
for f in sorted(os.listdir(dst)):
    if not f.endswith(".safetensors"):
        continue
    p = os.path.join(dst, f)
    b = bytearray(open(p, "rb").read())
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    for name in sorted(head):
        t = head[name]
        if name == "__metadata__" or t["dtype"] != "F32":
            continue
        s, e = t["data_offsets"]
        a = array.array("i")  # the float32 bits; +-1 on them is one ulp (away from or toward zero)
        a.frombytes(bytes(b[8 + n + s:8 + n + e]))
        if sys.byteorder != "little":
            a.byteswap()
        for i in range(len(a)):
            if a[i] & 0x7FFFFFFF and (a[i] & 0x7F800000) != 0x7F800000:  # not zero, inf or NaN
                up = rng.random() < 0.5 and a[i] & 0x7FFFFFFF != 0x7F7FFFFF  # never to infinity
                a[i] += 1 if up else -1
                moved += 1
        if sys.byteorder != "little":
            a.byteswap()
        b[8 + n + s:8 + n + e] = a.tobytes()
    tmp = p + ".tmp"
    with open(tmp, "wb") as out:
        out.write(b)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, p)
print(f"{dst}: {moved} float32 values moved one ulp (seed {seed})")
