#!/usr/bin/env python3
"""Where a kernel's issue slots go, from ncu's per-instruction page of a `--set full` report
(`ncu -i REPORT --page source --csv --print-source sass > FILE.csv`): per kernel, its warp
instructions executed, its stall samples by reason, and per opcode (the SASS mnemonic without its
predicate and suffixes) its share of the samples and of the instructions executed. With --phases,
also the same per phase: the instructions between two barriers (BAR) in address order, so that a
kernel's time can be told apart by the code between its __syncthreads (a loop's body is the phases
inside it; the opcodes say which code a phase is).
Usage: ncu_sass_mix.py FILE.csv [N_OPCODES] [--phases]"""
import collections
import re
import sys

from ncu_csv import number as ncu_number
from ncu_csv import rows_and_count

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def number(text):
    """an empty or non-numeric cell counts 0"""
    return ncu_number(text) or 0.0


def kernels_of(rows):
    """(name, header, instruction rows) for each kernel: a 'Kernel Name' row, a header, its rows.
    ncu may list a kernel twice; the first listing is kept."""
    out, seen, i = [], set(), 0
    while i < len(rows):
        if rows[i] and rows[i][0] == "Kernel Name" and i + 1 < len(rows):
            name, head, body = rows[i][1], rows[i + 1], []
            i += 2
            while i < len(rows) and not (rows[i] and rows[i][0] == "Kernel Name"):
                if len(rows[i]) == len(head):
                    body.append(rows[i])
                i += 1
            if name not in seen and SAMPLES in head and EXECUTED in head and "Source" in head:
                seen.add(name)
                out.append((name, head, body))
        else:
            i += 1
    return out


def opcode(sass):
    """'@!P0 IMAD.WIDE.U32 R2, ...' -> 'IMAD'"""
    text = re.sub(r"^@!?U?P[T0-9]+\s+", "", sass.strip())
    return text.split(" ")[0].split(".")[0] or "?"


def phases(body, at, samples, executed, n_ops):
    """the instructions from one BAR to the next (the BAR itself closes a phase): each phase with at
    least 1% of the samples, its share of samples and instructions, top stall and opcodes"""
    parts, cur = [], []
    for r in body:
        cur.append(r)
        if opcode(r[at["Source"]]) == "BAR":
            parts.append(cur)
            cur = []
    if cur:
        parts.append(cur)
    stall_cols = [h for h in at if h.startswith("stall_") and "Not Issued" not in h]
    for i, part in enumerate(parts):
        ps = sum(number(r[at[SAMPLES]]) for r in part)
        if ps < 0.01 * samples:
            continue
        pe = sum(number(r[at[EXECUTED]]) for r in part)
        reasons = sorted(((h[6:], sum(number(r[at[h]]) for r in part)) for h in stall_cols), key=lambda x: -x[1])[:3]
        ops = collections.defaultdict(float)
        for r in part:
            ops[opcode(r[at["Source"]])] += number(r[at[SAMPLES]])
        addr = part[0][at["Address"]] if "Address" in at else str(i)
        print(f"  phase {i} at {addr} ({len(part)} instructions): samples {ps / samples * 100:.1f}%, "
              f"executed {pe / executed * 100:.1f}%; stalls " + " ".join(f"{k} {v / ps * 100:.0f}%" for k, v in reasons)
              + "; opcodes " + " ".join(f"{k} {v / ps * 100:.0f}%" for k, v in sorted(ops.items(), key=lambda x: -x[1])[:n_ops]))


def main():
    want_phases = "--phases" in sys.argv
    if want_phases:
        sys.argv.remove("--phases")
    rows, n_ops = rows_and_count("ncu_sass_mix.py FILE.csv [N_OPCODES] [--phases]", 10)
    kernels = kernels_of(rows)
    if not kernels:
        sys.exit(f"{sys.argv[1]}: no kernel with per-instruction samples (ncu --set full, then --page source --csv)")
    for name, head, body in kernels:
        at = {h: j for j, h in enumerate(head)}
        samples = sum(number(r[at[SAMPLES]]) for r in body)
        executed = sum(number(r[at[EXECUTED]]) for r in body)
        reasons = {h[6:]: sum(number(r[at[h]]) for r in body)
                   for h in head if h.startswith("stall_") and "Not Issued" not in h}
        ops = collections.defaultdict(lambda: [0.0, 0.0])
        for r in body:
            o = ops[opcode(r[at["Source"]])]
            o[0] += number(r[at[SAMPLES]])
            o[1] += number(r[at[EXECUTED]])
        short = name[: name.rfind("(")] if name.endswith(")") else name  # without the argument list
        print(f"{short.replace('void ', '')}: {executed:.4g} warp instructions, {samples:.0f} samples")
        if samples <= 0 or executed <= 0:
            print("  no samples")
            continue
        top = sorted(reasons.items(), key=lambda x: -x[1])[:6]
        print("  stalls: " + "  ".join(f"{k} {v / samples * 100:.0f}%" for k, v in top))
        print("  opcode (samples / executed): " + "  ".join(
            f"{k} {v[0] / samples * 100:.0f}/{v[1] / executed * 100:.0f}%"
            for k, v in sorted(ops.items(), key=lambda x: -x[1][0])[:n_ops]))
        if want_phases:
            phases(body, at, samples, executed, min(n_ops, 6))


if __name__ == "__main__":
    main()
