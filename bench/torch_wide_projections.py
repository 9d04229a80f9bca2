#!/usr/bin/env python3
"""The projections that share an input, as one wide product or as one product each (the measurement
behind docs/h200-log.md's "Fused projection weights ... are not built"): cuBLAS through PyTorch, bf16 operands,
batch 8 x 1024 tokens of Qwen3.5-0.8B's hidden 1024, each timed as 20 launches captured in a CUDA
graph (as keel's step runs), forward (x W^T), the weight gradient (dy^T x, float32 out) and the
input gradient (dy W). Needs a CUDA GPU and PyTorch; prints one line a group."""
import time

import torch


def timed(f, n=20):
    """Microseconds a call of f, from n calls captured in a CUDA graph and replayed 5 times."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            f()
    g.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / (5 * n) * 1e6


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    x = torch.randn(8192, 1024, device="cuda", dtype=torch.bfloat16)
    groups = {  # the output widths of the projections that read one input, at the 0.8B shape
        "deltanet (in_proj_qkv, z, b, a)": [6144, 2048, 16, 16],
        "attention (q_proj with its gate, k_proj, v_proj)": [4096, 512, 512],
        "mlp (gate_proj, up_proj)": [3584, 3584],
    }
    for name, outs in groups.items():
        ws = [torch.randn(n, 1024, device="cuda", dtype=torch.bfloat16) for n in outs]
        wide = torch.cat(ws, 0)
        dys = [torch.randn(8192, n, device="cuda", dtype=torch.bfloat16) for n in outs]
        dy_wide = torch.cat(dys, 1)
        fwd = sum(timed(lambda w=w: x @ w.t()) for w in ws), timed(lambda: x @ wide.t())
        dw = sum(timed(lambda d=d: (d.t() @ x).float()) for d in dys), timed(lambda: (dy_wide.t() @ x).float())
        dx = sum(timed(lambda d=d, w=w: d @ w) for d, w in zip(dys, ws)), timed(lambda: dy_wide @ wide)
        print(f"{name} {outs}: forward separate {fwd[0]:.1f} us, wide {fwd[1]:.1f} us; "
              f"dW separate {dw[0]:.1f}, wide {dw[1]:.1f}; dx separate {dx[0]:.1f}, wide {dx[1]:.1f}")


if __name__ == "__main__":
    main()
