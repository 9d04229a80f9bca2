"""Checks that transformers loads the checkpoints keel writes, with the same logits.

Usage: python3 hf_load_check.py DATA_DIR
DATA_DIR holds (made by scripts/gpu-prepare.sh):
  fixture/{causal-f32-sharded,multimodal-bf16,reference.safetensors}   the shared fixture
  saved/{text-f32,multimodal-bf16,text-bf16}                           keel save of the fixture
  init/tiny + init/tiny-logits.safetensors                              keel init, and keel's own logits
Prints one line per check and a last line 'N passed, N failed'.
"""
import json
import sys

import torch
from safetensors.torch import load_file
from transformers import Qwen3_5ForCausalLM, Qwen3_5ForConditionalGeneration

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = "cuda" if torch.cuda.is_available() else "cpu"
data = sys.argv[1]
passed = failed = 0


def load(d):
    cfg = json.load(open(f"{d}/config.json"))
    cls = Qwen3_5ForConditionalGeneration if "text_config" in cfg else Qwen3_5ForCausalLM
    m, info = cls.from_pretrained(d, dtype=torch.float64, output_loading_info=True)
    bad = sorted(k for k in list(info["missing_keys"]) + list(info["unexpected_keys"]) if not k.startswith("mtp."))
    return m.to(dev).eval(), bad


def logits(m, ids):
    with torch.no_grad():
        return m(input_ids=ids.to(dev).long(), use_cache=False).logits.double().cpu()


def report(name, ok, detail):
    global passed, failed
    passed += ok
    failed += not ok
    print(f"{name:58s} {'OK' if ok else 'FAIL'}  {detail}")


ref = load_file(f"{data}/fixture/reference.safetensors")
ids, want = ref["input_ids"], ref["logits"]
for orig, saved in [("causal-f32-sharded", "text-f32"), ("multimodal-bf16", "multimodal-bf16"), ("causal-f32-sharded", "text-bf16")]:
    mo, bo = load(f"{data}/fixture/{orig}")
    ms, bs = load(f"{data}/saved/{saved}")
    lo, ls = logits(mo, ids), logits(ms, ids)
    rel = float((ls - want).norm() / want.norm())
    same = torch.equal(lo, ls)
    report(f"transformers loads keel save -> {saved}", not bs, f"missing/unexpected keys: {bs or 'none'}")
    # the fixture's weights are bf16-representable, so every save here is exact: identical logits
    report(f"  logits identical to transformers on {orig}", same, f"max |diff| {float((lo - ls).abs().max()):.3e}, rel err vs float64 reference {rel:.2e}")

mi, bi = load(f"{data}/init/tiny")
dump = load_file(f"{data}/init/tiny-logits.safetensors")
li = logits(mi, dump["input_ids"])
kl = dump["logits"].double()
rel = float((li - kl).norm() / li.norm())
report("transformers loads keel init --preset tiny", not bi, f"missing/unexpected keys: {bi or 'none'}")
report("  keel's cpu float32 logits vs transformers float64", rel < 2e-5, f"rel err {rel:.2e} (tolerance 2e-5)")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
