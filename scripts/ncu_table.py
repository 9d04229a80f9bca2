#!/usr/bin/env python3
"""One line a profiled kernel from `ncu --csv` output: its time, the other metrics asked for, and
the largest stall reasons (smsp__average_warps_issue_stalled_*_per_issue_active: cycles a warp
spends stalled for that reason per instruction issued). Usage: ncu_table.py FILE.csv [N_STALLS]"""
import collections

from ncu_csv import metric_rows, number

STALL = "smsp__average_warps_issue_stalled_"


def main():
    rows, at, n_stalls = metric_rows("ncu_table.py FILE.csv [N_STALLS]", 4)
    kernels = collections.OrderedDict()
    for r in rows:
        key = (r[at["ID"]], r[at["Kernel Name"]].split("(")[0].replace("void ", ""))
        kernels.setdefault(key, {})[r[at["Metric Name"]]] = (r[at["Metric Value"]], r[at["Metric Unit"]])
    for (kid, name), m in kernels.items():
        t = m.get("gpu__time_duration.sum")
        time = f"{number(t[0]) / 1000:9.1f} us" if t and t[1] == "ns" and number(t[0]) is not None else "        ?   "
        other = []
        for metric, (value, unit) in m.items():
            if metric.startswith(STALL) or metric == "gpu__time_duration.sum":
                continue
            short = metric.split("__", 1)[-1].split(".")[0]
            other.append(f"{short}={value}{'%' if unit == '%' else ''}")
        stalls = sorted(((number(v), k[len(STALL):].replace("_per_issue_active.ratio", ""))
                         for k, (v, _) in m.items() if k.startswith(STALL) and number(v) is not None), reverse=True)
        top = " ".join(f"{reason}:{value:.2f}" for value, reason in stalls[:n_stalls])
        print(f"{kid:>4} {name[:32]:32s} {time} {' '.join(other)}  stalls {top}")


if __name__ == "__main__":
    main()
