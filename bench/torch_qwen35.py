"""The PyTorch peer of `keel bench train`: float32 training steps (forward, cross-entropy,
backward, AdamW) of transformers' own Qwen3.5 (Qwen3_5ForCausalLM) on the configuration keel
passes (--config: a folder with config.json), on the GPU, TF32 off everywhere; with --precision
bf16 the forward and the loss run under torch.autocast(bfloat16) (float32 weights, gradients and
AdamW, bf16 matrix products: PyTorch's mixed precision, keel's --precision bf16 policy).

Prints progress lines and one last line: RESULT {"step_s": ..., "tokens_per_s": ..., "peak_bytes": ...}
(median step time after the warm-up steps; peak = torch.cuda.max_memory_allocated).
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
import transformers
from transformers import AutoConfig, Qwen3_5ForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("--config", required=True)
ap.add_argument("--batch", type=int, default=4)
ap.add_argument("--window", type=int, default=1024)
ap.add_argument("--steps", type=int, default=5)
ap.add_argument("--warmup", type=int, default=2)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--precision", choices=["f32", "bf16"], default="f32")
args = ap.parse_args()

# float32 means float32: no TF32 in matrix products or convolutions
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
torch.set_float32_matmul_precision("highest")
assert torch.cuda.is_available(), "PyTorch sees no CUDA device"
dev = torch.device("cuda")
torch.manual_seed(args.seed)

cfg = AutoConfig.from_pretrained(args.config)
model = Qwen3_5ForCausalLM(cfg).to(device=dev, dtype=torch.float32)
model.train()
n_params = sum(p.numel() for p in model.parameters())
try:
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mq
    fast = getattr(mq, "is_fast_path_available", None)
except Exception:
    fast = None
print(f"torch {torch.__version__}, transformers {transformers.__version__}, {torch.cuda.get_device_name()}, "
      f"{n_params} parameters, attention {cfg._attn_implementation}, fla/causal-conv1d fast path: {fast}", flush=True)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
B, T, V = args.batch, args.window, cfg.vocab_size
torch.cuda.reset_peak_memory_stats()
times, first_loss = [], None
for step in range(args.warmup + args.steps):
    ids = torch.randint(0, V, (B, T), device=dev)
    tgt = torch.randint(0, V, (B, T), device=dev)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
        logits = model(input_ids=ids, use_cache=False).logits
        loss = F.cross_entropy(logits.view(-1, V), tgt.view(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    lv = loss.item()
    first_loss = lv if first_loss is None else first_loss
    print(f"pytorch step {step + 1}{' (warm-up)' if step < args.warmup else ''}: {dt:.3f} s, loss {lv:.4f}", flush=True)
    if step >= args.warmup:
        times.append(dt)
step_s = statistics.median(times)
print("RESULT " + json.dumps({"step_s": step_s, "tokens_per_s": B * T / step_s, "peak_bytes": torch.cuda.max_memory_allocated(),
                             "first_loss": first_loss}), flush=True)
