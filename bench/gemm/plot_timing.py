"""plot_timing.py OUT.png LABEL=RESULTS.md ... [--floor LABEL=FLOOR.md ...] — the W4Ax GEMM's
speedup over cuBLAS FP16 against M, one line per timing method (bench_gemm with per-call
events, --graph, --graph --pdl), each the geometric mean over the eight LLaMA-3 shapes at
12.5 % INT8 blocks, from bench_gemm --out tables of one session. Each --floor file (the output
of bench/gemm/floor.cu, plain or --graph) adds its decode floor at M = 1 and 16: cuBLAS FP16's
time over that of a kernel that only reads the W4 weights, timed the same way.
Test tooling only (matplotlib), never part of the engine."""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from plot import gm, read_floor, read_table  # bench/gemm/plot.py: the same tables


def geomeans(path):
    _, x16, _ = read_table(path)
    return {m: gm(v) for m, v in sorted(x16.items())}


def floor_points(path):
    f = read_floor(path)
    if f is None:
        raise SystemExit(f"{path}: no geomean line")
    return {1: f[0], 16: f[1]}


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    out, args = sys.argv[1], sys.argv[2:]
    fig, ax = plt.subplots(figsize=(8, 5))
    floor = False
    colors = ["tab:gray", "tab:blue", "tab:red", "tab:green"]  # the n-th table and the n-th floor share one
    n = {False: 0, True: 0}
    for a in args:
        if a == "--floor":
            floor = True
            continue
        label, path = a.split("=", 1)
        c = colors[n[floor] % len(colors)]
        n[floor] += 1
        if floor:
            pts = floor_points(path)
            ax.plot(list(pts), list(pts.values()), "s--", color=c, alpha=0.6, label=f"decode floor, {label}")
        else:
            g = geomeans(path)
            ax.plot(list(g), list(g.values()), "o-", color=c, label=label)
    ax.axhline(3.3, color="k", lw=0.8, ls=":", label="issue target M <= 16 (3.3x)")
    ax.axhline(1.0, color="k", lw=0.6)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M (tokens per call)")
    ax.set_ylabel("speedup over cuBLAS FP16 (geomean, 8 LLaMA-3 shapes)")
    ax.set_title("W4Ax GEMM on the H200 by timing method, 12.5 % INT8 blocks")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
