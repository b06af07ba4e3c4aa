"""plot_ablate.py ABLATE.md OUT.png -- where the prefill wgmma kernel's time goes, from the
prefill table that bench/gemm/ablate.sh prints: for each ablation (a stage left out), the
geometric mean over the table's rows of its time relative to the full kernel, as bars.

Reads the rows of the "### prefill" table: `| shape | M | us (ratio) | ... |`, the header
naming each column `ablate=A`. Labels come from LEFT_OUT below (gemm_w4ax.h documents them).
"""
import math
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LEFT_OUT = {
    0: "nothing (full kernel)",
    1: "promotion",
    2: "wgmma",
    3: "wgmma + promotion",
    4: "activation-scale loads",
    8: "half the token bytes",
    11: "wgmma + promotion,\nhalf the token bytes",
    16: "token + weight copies",
    17: "copies + promotion",
    32: "int32 -> fp32 conversion",
    64: "scale product sa x sw",
    96: "conversion + product",
}


def read(path):
    text = open(path).read()
    if "### prefill" not in text:
        sys.exit(f"{path}: no '### prefill' table")
    lines = text.split("### prefill", 1)[1].splitlines()
    header, rows = None, []
    for line in lines[1:]:
        if line.startswith("###"):
            break
        if line.startswith("| shape"):
            header = [int(c.split("=")[1]) for c in re.findall(r"ablate=\d+", line)]
        elif line.startswith("| LLaMA"):
            rows.append([float(x) for x in re.findall(r"\(([0-9.]+)\)", line)])
    if not header or not rows or any(len(r) != len(header) for r in rows):
        sys.exit(f"{path}: malformed prefill table")
    return header, rows


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot_ablate.py ABLATE.md OUT.png")
    header, rows = read(sys.argv[1])
    geo = [math.exp(sum(math.log(r[i]) for r in rows) / len(rows)) for i in range(len(header))]
    order = sorted(range(len(header)), key=lambda i: -geo[i])
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(header) + 1.2))
    ys = range(len(order))
    ax.barh(ys, [geo[i] for i in order], color=["#555" if header[i] == 0 else "#3a7" for i in order])
    ax.set_yticks(list(ys), [LEFT_OUT.get(header[i], f"ablate={header[i]}") for i in order], fontsize=8)
    for y, i in zip(ys, order):
        ax.text(geo[i] + 0.01, y, f"{geo[i]:.2f}", va="center", fontsize=8)
    ax.set_xlim(0, 1.15)
    ax.set_xlabel(f"time vs the full kernel (geomean over {len(rows)} LLaMA-3-8B cases, M = 2048 and 8192)")
    ax.set_title("W4Ax prefill kernel (wgmma, H200): time with one stage left out", fontsize=10)
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=120)


if __name__ == "__main__":
    main()
