#!/usr/bin/env python3
"""Where one training step's GPU time goes, kernel by kernel, from `ncu --csv` over a whole run with
the metrics gpu__time_duration.sum, dram__bytes_read.sum and dram__bytes_write.sum (every kernel,
KEEL_CUDA_GRAPH=0: the `step-kernels` stage of scripts/gpu-check.sh). The step is the kernels after
the second-to-last AdamW launch up to the last one (k_adamw ends every step). One line a kernel
(template arguments kept, cuBLAS's names shortened): its total time, launches, time a launch and the
DRAM bytes it moved over its time; then the step's sum and the kernels under 12 us a launch.
Unlike KEEL_CUDA_PROFILE (an event pair around every node, run one by one: about 7 us a node of its
own), ncu times each kernel alone, after flushing the caches (its default): a kernel's time is if
anything more than in the step, and its DRAM bytes leave out writes still in the L2 when it ends.
Usage: ncu_step_table.py FILE.csv [LINES]"""
import collections
import sys

from ncu_csv import metric_rows, number

SCALE = {"ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
         "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}


def short(name):
    base = name.split("(")[0].replace("void ", "").strip()
    if base.startswith(("nvjet", "sm90", "cutlass")) or "gemm" in base.lower():
        return "cuBLAS " + base[:48]
    return base[:64]


def main():
    rows, at, lines = metric_rows("ncu_step_table.py FILE.csv [LINES]", 60)
    kernels = {}
    for r in rows:
        k = kernels.setdefault(int(r[at["ID"]]), {"name": r[at["Kernel Name"]], "us": 0.0, "bytes": 0.0})
        v, unit, metric = number(r[at["Metric Value"]]), r[at["Metric Unit"]], r[at["Metric Name"]]
        if v is None:
            continue
        if metric == "gpu__time_duration.sum":
            k["us"] = v * SCALE.get(unit, 1e-3)
        elif metric.startswith("dram__bytes_"):
            k["bytes"] += v * SCALE.get(unit, 1.0)
    ids = sorted(kernels)
    ends = [i for i in ids if kernels[i]["name"].startswith("k_adamw")]
    if len(ends) < 2:
        sys.exit(f"{sys.argv[1]}: {len(ends)} AdamW launches; a whole step needs two (run two steps or more)")
    step = [kernels[i] for i in ids if ends[-2] < i <= ends[-1]]
    by = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for k in step:
        a = by[short(k["name"])]
        a[0] += 1
        a[1] += k["us"]
        a[2] += k["bytes"]
    total = sum(k["us"] for k in step)
    print(f"one step: {len(step)} kernels, {total / 1000:.2f} ms of kernel time")
    print(f"{'ms':>8} {'launches':>8} {'us each':>9} {'GB/s':>7}  kernel")
    for name, (n, us, b) in sorted(by.items(), key=lambda x: -x[1][1])[:lines]:
        print(f"{us / 1000:8.2f} {n:8d} {us / n:9.1f} {b / us / 1e3 if us else 0:7.0f}  {name}")
    small = [(n, us) for n, us, _ in by.values() if us / n < 12]
    print(f"kernels under 12 us a launch: {sum(n for n, _ in small)} launches, {sum(us for _, us in small) / 1000:.2f} ms")


if __name__ == "__main__":
    main()
