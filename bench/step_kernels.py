#!/usr/bin/env python3
"""step_kernels.py -- the GPU time of each kernel of one decode step, from Nsight Compute.

`comet bench` prints a per-op table in which every op is waited for on its own (launch and
synchronization included). Inside the CUDA graph the kernels overlap their launches, so that
table cannot say how much of a step is kernel time and how much is gaps between kernels. This
script reads `ncu --csv --metrics gpu__time_duration.sum` output of a `comet bench` run and
reports the last decode step's kernels (from the last embed_kernel launch to the end of the
run, which `--decode-tokens` steps end with) grouped by kernel, template arguments and grid, with their share, and the gap
left against a measured step time.

Usage (GPU machine, repo root):
  ncu --csv --metrics gpu__time_duration.sum build-gpu/comet bench --synthetic llama3-8b \
      --device cuda --reps 1 --decode-tokens 4 > ncu.csv
  python3 bench/step_kernels.py ncu.csv [--step-ms 3.214]

--step-ms: the step time of a run without the profiler (comet bench's "ms / decode step"),
to print the time not spent in kernels. Output: a Markdown table on stdout. Exit 1 when the
CSV has no kernel rows or no embed_kernel launch.
"""
import argparse
import csv
import re
import sys


def short_name(name):
    """The kernel's name without template arguments, namespaces and parameter lists."""
    n = re.sub(r"\((anonymous namespace|<unnamed>)\)", "", name)
    depth, out = 0, []
    for ch in n:  # drop <...> and (...) at any nesting: templates and parameter lists
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    n = "".join(out).strip()
    n = n.split("::")[-1]
    return n.split()[-1] if n else name


def read_rows(path):
    """(launch id, kernel name, duration in us) per kernel launch, in launch order."""
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu's own messages start with ==PROF==
    rows = {}
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "")
        v = float(r["Metric Value"].replace(",", ""))
        scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}.get(unit)
        if scale is None:
            sys.exit(f"step_kernels.py: unknown unit '{unit}' in {path}")
        rows[int(r["ID"])] = (r["Kernel Name"], v * scale, r.get("Grid Size", ""))
    return [(i, *rows[i]) for i in sorted(rows)]


def group_key(name, grid):
    """short name, its template arguments (modes, tiles) and the grid: one GEMM shape or one
    RMSNorm-quantize mode a row"""
    m = re.search(r"<(.*)>\s*\(", name)
    targs = re.sub(r"\([^)]*\)", "", m.group(1)).replace(" ", "") if m else ""
    return f"{short_name(name)}<{targs}> {grid}" if targs else f"{short_name(name)} {grid}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--step-ms", type=float, default=None)
    a = ap.parse_args()
    rows = read_rows(a.csv)
    if not rows:
        sys.exit(f"step_kernels.py: no gpu__time_duration rows in {a.csv}")
    starts = [k for k, r in enumerate(rows) if short_name(r[1]) == "embed_kernel"]
    if not starts:
        sys.exit(f"step_kernels.py: no embed_kernel launch in {a.csv}: not a comet run?")
    step = rows[starts[-1]:]
    by = {}
    for _, name, us, grid in step:
        n = group_key(name, grid)
        c, t = by.get(n, (0, 0.0))
        by[n] = (c + 1, t + us)
    total = sum(t for _, t in by.values())
    print(f"One decode step, kernel by kernel (Nsight Compute, each kernel alone): "
          f"{len(step)} launches, {total / 1e3:.3f} ms of kernel time\n")
    print("| kernel | launches | us in all | us a launch | share |")
    print("|---|---:|---:|---:|---:|")
    for n, (c, t) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"| {n} | {c} | {t:,.1f} | {t / c:.2f} | {100 * t / total:.1f}% |")
    if a.step_ms:
        gap = a.step_ms * 1e3 - total
        print(f"\nMeasured step {a.step_ms:.3f} ms (graph, no profiler): kernels "
              f"{total / 1e3:.3f} ms, the rest {gap / 1e3:.3f} ms "
              f"({100 * gap / (a.step_ms * 1e3):.1f}%): launch gaps and tails, less what "
              f"overlaps")


if __name__ == "__main__":
    main()
