"""Checks keel's LoRA adapters against PEFT, the peer that defines the format.

Usage: python3 peft_check.py BASE ADAPTER KEEL_LOGITS MERGED FIXTURE OUT_DIR [BASE_i:KEEL_LOGITS_i ...]
  BASE         the checkpoint the adapter was trained on (the fixture's causal-f32-sharded)
  ADAPTER      the folder keel train --lora-rank wrote (adapter_config.json, adapter_model.safetensors)
  KEEL_LOGITS  keel info BASE --adapter ADAPTER --dump-logits FILE: keel's float32 input ids and logits
  BASE_i:KEEL_LOGITS_i  more realizations of the float32 comparison: BASE with every weight one ulp
               off (scripts/perturb_weights.py BASE BASE_i i) and keel's dump on it, with the same ADAPTER
  MERGED       keel merge BASE ADAPTER MERGED: a full checkpoint
  FIXTURE      the fixture folder (its reference.safetensors gives the inputs)
  OUT_DIR      written: a check-reference folder for keel check-reference OUT_DIR --adapter ADAPTER:
               reference.safetensors (PEFT in float64: logits, loss, hidden states, the adapter
               factors' gradients), peer-f32.json (PEFT's own float32 errors), base -> BASE

Checks, one line each, then 'N passed, N failed':
  PeftModel.from_pretrained(base, ADAPTER) loads it with no missing and no unexpected adapter keys;
  keel's float32 logits (the adapter beside the weights) against PEFT's float64 ones on the same ids:
  no worse than the peer, as keel check-reference judges float32 values: within PEFT's own float32
  run's worst value error (logits and hidden states) against that float64 run, on the device keel's
  dump ran on (the cpu), each error pooled over the realizations given (the relative error of all of
  them at once, as check-reference pools seeds): one sample of a few hundred ids is a draw, the
  model's float64 logits moving by about 1e-5 when its weights move by one ulp. Float32 against
  float32 would say more about the peer than about keel. The check's power is shown on the first
  realization's ids: the float64 logits of the adapter 1% off (lora_B x 1.01) must be outside that
  tolerance, or the check fails;
  transformers loads MERGED with no missing or unexpected keys, and its logits (float64 run) match
  PEFT's unmerged float64 logits within 1e-6 (the merge's one rounding to float32).
"""
import json
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
import transformers
import peft
from peft import PeftModel
from transformers import Qwen3_5ForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "tools"))
from make_fixtures import f64_module  # noqa: E402  (the peer's modeling code with float64 upcasts)

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
if len(sys.argv) < 7 or any(":" not in a for a in sys.argv[7:]):
    sys.exit(__doc__.split("\n\n")[1])
base_dir, adapter_dir, keel_logits, merged_dir, fixture, out_dir = sys.argv[1:7]
realizations = [(base_dir, keel_logits)] + [tuple(a.split(":", 1)) for a in sys.argv[7:]]
passed = failed = 0


def report(name, ok, detail):
    global passed, failed
    passed += ok
    failed += not ok
    print(f"{name:62s} {'OK' if ok else 'FAIL'}  {detail}")


def rel(x, r):
    x, r = x.double().cpu(), r.double().cpu()
    return float((x - r).norm() / r.norm()) if float(r.norm()) > 0 else float((x - r).norm())


def keel_name(peft_name):
    # base_model.model.model.layers.0.mlp.up_proj.lora_A.default.weight -> model.layers.0.mlp.up_proj.lora_A.weight
    n = peft_name[len("base_model.model."):] if peft_name.startswith("base_model.model.") else peft_name
    return n.replace(".default.", ".")


def peft_model(cls, dtype, device, base_path=None):
    base = cls.from_pretrained(base_path or base_dir, dtype=dtype, attn_implementation="eager")
    m = PeftModel.from_pretrained(base, adapter_dir, is_trainable=True)
    return m.to(device=device, dtype=dtype).train(False)  # eval mode: no dropout


# 1. PEFT loads the adapter: every adapter tensor of the model is in the file and nothing else
m = peft_model(Qwen3_5ForCausalLM, torch.float32, "cpu")
stored = set(load_file(os.path.join(adapter_dir, "adapter_model.safetensors")).keys())
want = {k.replace(".default.", ".") for k, _ in m.named_parameters() if "lora_" in k}
missing, unexpected = sorted(want - stored), sorted(stored - want)
report("PeftModel.from_pretrained loads keel's adapter", not missing and not unexpected and len(want) > 0,
       f"{len(stored)} tensors; missing {missing[:3] or 'none'}, unexpected {unexpected[:3] or 'none'} "
       f"(peft {peft.__version__})")
nonzero = sum(int(p.abs().sum() > 0) for k, p in m.named_parameters() if "lora_B" in k)
report("  the trained lora_B factors are not zero", nonzero == len([k for k in want if "lora_B" in k]),
       f"{nonzero} of {len([k for k in want if 'lora_B' in k])} non-zero")

# 2. keel's float32 logits against PEFT's float64 ones on the same ids, judged as keel check-reference
# judges float32 values: no worse than the peer's own float32 run on that device kind (keel info ran on
# the cpu), whose worst error over the logits and hidden states is the tolerance. Each error is pooled
# over the realizations (the model with its weights one ulp off, perturb_weights.py): on one sample of 96
# ids keel's and PEFT's errors both moved either side of a bound from one trained adapter to the next
# (docs/h200-log.md, "The PEFT logits check pooled").
dev = "cuda" if torch.cuda.is_available() else "cpu"
F64 = f64_module().Qwen3_5ForCausalLM


def values(model, device, ids):
    out = model(input_ids=ids.to(device), output_hidden_states=True, use_cache=False)
    return [("logits", out.logits.detach().double().cpu())] + [
        (f"hidden.{i}", h.detach().double().cpu()) for i, h in enumerate(out.hidden_states)]


sq = lambda x: float((x.double() * x.double()).sum())
peer_num, peer_den, keel_num, keel_den = {}, {}, 0.0, 0.0
for n_r, (b_dir, dump_path) in enumerate(realizations):
    dump = load_file(dump_path)
    r_ids = dump["input_ids"].long()
    with torch.no_grad():
        v64 = dict(values(peft_model(F64, torch.float64, "cpu", b_dir), "cpu", r_ids))
        v32 = dict(values(peft_model(Qwen3_5ForCausalLM, torch.float32, "cpu", b_dir), "cpu", r_ids))
    for k in v64:
        peer_num[k] = peer_num.get(k, 0.0) + sq(v32[k] - v64[k])
        peer_den[k] = peer_den.get(k, 0.0) + sq(v64[k])
    e_k, e_p = sq(dump["logits"].double() - v64["logits"]), sq(v32["logits"] - v64["logits"])
    keel_num, keel_den = keel_num + e_k, keel_den + sq(v64["logits"])
    if len(realizations) > 1:
        print(f"  realization {n_r} ({os.path.basename(os.path.normpath(b_dir))}, {r_ids.numel()} ids): keel's "
              f"logits {(e_k / sq(v64['logits'])) ** 0.5:.2e}, PEFT float32's {(e_p / sq(v64['logits'])) ** 0.5:.2e}")
    if n_r == 0:
        ids, l64 = r_ids, v64["logits"]
        keel0 = dump["logits"]
peer_cpu = {k: (peer_num[k] / peer_den[k]) ** 0.5 if peer_den[k] > 0 else peer_num[k] ** 0.5 for k in peer_num}
with torch.no_grad():
    m64 = peft_model(F64, torch.float64, "cpu")
    l32 = None
    if dev == "cuda":  # printed beside: the peer's float32 on the GPU, not keel's device here
        l32 = peft_model(Qwen3_5ForCausalLM, torch.float32, dev)(input_ids=ids.to(dev), use_cache=False).logits
    # the check's power: the same float64 model with every lora_B 1% larger (the adapter's scale off by 1%)
    for k, p in m64.named_parameters():
        if "lora_B" in k:
            p.mul_(1.01)
    l64_off = m64(input_ids=ids, use_cache=False).logits.double().cpu()
tol = max(peer_cpu.values())
worst = max(peer_cpu, key=peer_cpu.get)
e = (keel_num / keel_den) ** 0.5
e_off = rel(l64_off, l64)
pooled = f"pooled over {len(realizations)} realizations, " if len(realizations) > 1 else ""
report("  keel's float32 logits (adapter unmerged) vs PEFT float64", e <= tol,
       f"rel err {e:.2e}, {pooled}{ids.numel()} ids each (tolerance {tol:.2e}: PEFT's own float32 on cpu, worst "
       f"value, {worst}; its logits {peer_cpu['logits']:.2e}" +
       (f"; PEFT float32 on cuda: logits {rel(l32, l64):.2e}, keel vs it {rel(keel0, l32):.2e}, the first "
        "realization" if l32 is not None else "") + ")")
report("  the same check fails an adapter 1% off (lora_B x 1.01)", e_off > tol,
       f"rel err {e_off:.2e} against the tolerance {tol:.2e}" + (f" ({e_off / tol:.0f}x)" if tol > 0 else ""))

# 3. keel merge's checkpoint in transformers: the keys, and the logits of the merged weights (float64
# run) against PEFT's unmerged float64 ones: only the merge's one rounding to float32 between them
mm, info = Qwen3_5ForCausalLM.from_pretrained(merged_dir, dtype=torch.float32, attn_implementation="eager",
                                              output_loading_info=True)
bad = sorted(k for k in list(info["missing_keys"]) + list(info["unexpected_keys"]) if not k.startswith("mtp."))
report("transformers loads keel merge's checkpoint", not bad, f"missing/unexpected keys: {bad or 'none'}")
mm64 = F64.from_pretrained(merged_dir, dtype=torch.float64, attn_implementation="eager").eval()
with torch.no_grad():
    lm64 = mm64(input_ids=ids, use_cache=False).logits.double().cpu()
    lm32 = mm.to(dev).eval()(input_ids=ids.to(dev), use_cache=False).logits.double().cpu()
e = rel(lm64, l64)
report("  its logits (float64 run) vs PEFT unmerged float64", e <= 1e-6,
       f"rel err {e:.2e} (tolerance 1e-6: the weights' rounding to float32); its float32 run vs PEFT float64: "
       f"{rel(lm32, l64):.2e}")

# 4. the float64 reference for keel check-reference --adapter, and PEFT's own float32 errors
ref_in = load_file(os.path.join(fixture, "reference.safetensors"))
ids, tgt = ref_in["input_ids"].long(), ref_in["targets"].long()


def run(cls, dtype, device):
    m = peft_model(cls, dtype, device)
    out = m(input_ids=ids.to(device), output_hidden_states=True, use_cache=False)
    V = out.logits.shape[-1]
    loss = F.cross_entropy(out.logits.reshape(-1, V), tgt.to(device).reshape(-1))
    loss.backward()
    res = {"logits": out.logits.detach().cpu().contiguous(), "loss": loss.detach().reshape(1).cpu()}
    for i, h in enumerate(out.hidden_states):
        res[f"hidden.{i}"] = h.detach().cpu().contiguous()
    for name, p in m.named_parameters():
        if "lora_" in name and p.grad is not None:
            res[f"grad.{keel_name(name)}"] = p.grad.detach().cpu().contiguous()
    return res


ref = run(F64, torch.float64, "cpu")
os.makedirs(out_dir, exist_ok=True)
save_file(dict(ref, input_ids=ref_in["input_ids"], targets=ref_in["targets"]),
          os.path.join(out_dir, "reference.safetensors"))
link = os.path.join(out_dir, "base")
if not os.path.exists(link):
    os.symlink(os.path.abspath(base_dir), link)
peer = {"what": "PEFT + transformers float32 on the fixture with keel's adapter, against its float64 run",
        "transformers": transformers.__version__, "peft": peft.__version__, "torch": torch.__version__}
for device in ["cpu"] + (["cuda"] if torch.cuda.is_available() else []):
    r32 = run(Qwen3_5ForCausalLM, torch.float32, device)
    err = {k: rel(r32[k], ref[k]) for k in ref}
    vals = [v for k, v in err.items() if not k.startswith("grad.")]
    grads = [v for k, v in err.items() if k.startswith("grad.")]
    peer[device] = {"worst_value": max(vals), "worst_gradient": max(grads), "errors": err}
    print(f"PEFT float32 on {device} vs float64: worst value {max(vals):.3e}, worst gradient {max(grads):.3e}")
json.dump(peer, open(os.path.join(out_dir, "peer-f32.json"), "w"), indent=1)
report("reference for keel check-reference --adapter written", len([k for k in ref if k.startswith("grad.")]) > 0,
       f"{out_dir}: {len(ref)} tensors, {len([k for k in ref if k.startswith('grad.')])} adapter gradients")
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
