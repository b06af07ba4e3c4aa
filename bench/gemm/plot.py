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


def gm(values):
    return math.exp(sum(math.log(a) for a in values) / len(values))


def read_table(path):
    """The GPU line and, per M, the × FP16 and × INT8 ratios of the 12.5 % INT8 rows of the
    eight LLaMA-3 shapes in a bench_gemm --out table: (gpu, {M: [x16]}, {M: [x8]})."""
    x16, x8 = defaultdict(list), defaultdict(list)
    gpu = ""
    for line in open(path):
        if line.startswith("GPU:"):
            gpu = line.strip()
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 13 or not cells[0].startswith("LLaMA-3") or cells[5] != "12.5":
            continue
        m = int(cells[4])
        x16[m].append(float(cells[11]))
        x8[m].append(float(cells[12]))
    return gpu, x16, x8


def read_floor(path):
    """The decode floor of a floor.cu output at M = 1 and 16, (f1, f16); None without one."""
    for line in open(path):
        if line.startswith("geomean of fp16 / floor"):
            parts = line.split(":")  # "... shapes: M = 1: 3.27, M = 16: 3.25"
            return float(parts[2].split(",")[0]), float(parts[3])
    return None


def main():
    src, dst = sys.argv[1], sys.argv[2]
    gpu, x16, x8 = read_table(src)
    floor = read_floor(sys.argv[3]) if len(sys.argv) > 3 else None
    ms = sorted(x16)
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
