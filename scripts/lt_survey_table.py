#!/usr/bin/env python3
"""The table of a KEEL_CUDA_LT_SURVEY=1 run's stderr: per product shape, the time of cuBLASLt's
heuristic's first answer, of the answer the product took (LT_PREFS in src/backends/cuda/cuda_lt.cu,
or the first), and of the fastest, with its configuration: the measurement behind LT_PREFS.
Usage: scripts/lt_survey_table.py SURVEY.txt"""
import collections
import re
import sys

LINE = re.compile(r"lt-survey (.*?): #(\d+) (.*) (-?[\d.]+) us( \(taken\))?$")


def main(path):
    shapes = collections.OrderedDict()  # shape -> [(answer, configuration, us, taken)]
    for line in open(path):
        m = LINE.match(line.strip())
        if m:
            shapes.setdefault(m.group(1), []).append((int(m.group(2)), m.group(3), float(m.group(4)), bool(m.group(5))))
    if not shapes:
        sys.exit(f"{path}: no 'lt-survey' lines (run keel with KEEL_CUDA_GRAPH=0 KEEL_CUDA_LT_SURVEY=1)")
    total = [0.0, 0.0, 0.0]
    for shape, answers in shapes.items():
        timed = [a for a in answers if a[2] > 0]
        if not timed:
            print(f"{shape:58s} no answer ran")
            continue
        first = answers[0]
        taken = next((a for a in answers if a[3]), first)
        best = min(timed, key=lambda a: a[2])
        for i, a in enumerate((first, taken, best)):
            total[i] += a[2]
        print(f"{shape:58s} first {first[2]:8.1f}  taken #{taken[0]} {taken[2]:8.1f}  fastest #{best[0]} "
              f"{best[2]:8.1f} ({first[2] / best[2]:.3f}x the first)")
        if best[0] != 0:
            print(f"{'':58s} fastest: {best[1]}")
            print(f"{'':58s} first:   {first[1]}")
    print(f"sum over shapes (one call each): first {total[0]:.1f} us, taken {total[1]:.1f} us, fastest {total[2]:.1f} us")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: scripts/lt_survey_table.py SURVEY.txt (a KEEL_CUDA_LT_SURVEY=1 run's stderr)")
    main(sys.argv[1])
