"""plot.py RESULTS.md OUT.png [FLOOR.log] — speedup of the W4Ax GEMM vs M from a bench_gemm
results table.

Plots, for the 12.5 % INT8 rows, the geometric mean over the eight LLaMA-3 shapes of the
speedup over cuBLAS FP16 and over cuBLASLt INT8, plus the per-shape minimum over FP16. With
FLOOR.log (the output of bench/gemm/floor.cu), also the decode floor: cuBLAS FP16's time over
that of a kernel that only reads the W4 weights, at M = 1 and 16 -- no W4 kernel can be
faster than that line in this timing harness.
Test tooling only (matplotlib), never part of the engine."""
import math
import sys
import textwrap
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def main():
    src, dst = sys.argv[1], sys.argv[2]
    x16, x8 = defaultdict(list), defaultdict(list)
    gpu = ""
    for line in open(src):
        if line.startswith("GPU:"):
            gpu = line.strip()
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 13 or not cells[0].startswith("LLaMA-3") or cells[5] != "12.5":
            continue
        m = int(cells[4])
        x16[m].append(float(cells[11]))
        x8[m].append(float(cells[12]))
    floor = None
    if len(sys.argv) > 3:
        for line in open(sys.argv[3]):
            if line.startswith("geomean of fp16 / floor"):
                parts = line.split(":")  # "... shapes: M = 1: 3.27, M = 16: 3.25"
                floor = (float(parts[2].split(",")[0]), float(parts[3]))
    ms = sorted(x16)
    gm = lambda v: math.exp(sum(math.log(a) for a in v) / len(v))
    plt.figure(figsize=(7, 4.2))
    plt.plot(ms, [gm(x16[m]) for m in ms], "o-", label="vs cuBLAS FP16 (geomean of 8 shapes)")
    plt.plot(ms, [min(x16[m]) for m in ms], "v:", label="vs cuBLAS FP16 (worst shape)")
    plt.plot(ms, [gm(x8[m]) for m in ms], "s-", label="vs cuBLASLt INT8 (geomean)")
    if floor:
        plt.plot([1, 16], list(floor), "k--", lw=1.2,
                 label="reading the W4 weights alone, vs FP16 (floor.cu)")
    plt.axhline(1.0, color="gray", lw=0.8)
    plt.xscale("log", base=2)
    plt.xlabel("M (tokens)")
    plt.ylabel("speedup")
    plt.title("comet W4Ax GEMM, LLaMA-3-8B/70B linears, 12.5% INT8 blocks", fontsize=10)
    plt.figtext(0.01, 0.005, "\n".join(textwrap.wrap(gpu, 150)), fontsize=6)
    plt.legend(fontsize=8)
    plt.grid(alpha=0.3)
    plt.tight_layout(rect=(0, 0.03, 1, 1))
    plt.savefig(dst, dpi=110)


if __name__ == "__main__":
    main()
