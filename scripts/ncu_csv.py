"""What the ncu scripts (ncu_table.py, ncu_step_table.py, ncu_sass_mix.py) share: their command line,
FILE.csv then an optional count, ncu's way of writing numbers, and its rows of one metric each."""
import csv
import sys


def number(text):
    """ncu's '1,234.5' as 1234.5; None where the text is not a number"""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def rows_and_count(usage, default_count):
    """The rows of the CSV file argv[1] names and argv[2] as a count (default_count without it);
    exits with the usage line, or the file's name and what went wrong reading it."""
    if len(sys.argv) < 2:
        sys.exit(f"usage: {usage}")
    try:
        count = int(sys.argv[2]) if len(sys.argv) > 2 else default_count
    except ValueError:
        sys.exit(f"usage: {usage} (the count is a whole number, not '{sys.argv[2]}')")
    try:
        with open(sys.argv[1], newline="") as f:
            return list(csv.reader(f)), count
    except OSError as e:
        sys.exit(f"{sys.argv[1]}: {e.strerror}")


def metric_rows(usage, default_count):
    """The metric rows of `ncu --csv` output (FILE.csv: argv[1]) after its header, the header's
    columns by name (ID, Kernel Name, Metric Name, Metric Unit, Metric Value) and the count; exits
    naming the file when it holds no such rows."""
    rows, count = rows_and_count(usage, default_count)
    rows = [r for r in rows if len(r) > 10]
    if not rows or "Kernel Name" not in rows[0]:
        sys.exit(f"{sys.argv[1]}: no ncu CSV rows (did ncu run? see its log)")
    head = rows[0]
    at = {name: head.index(name) for name in ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value")}
    return rows[1:], at, count
