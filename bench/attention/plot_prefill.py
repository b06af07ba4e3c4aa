#!/usr/bin/env python3
"""plot_prefill.py RESULTS.md OUT.png — the prefill-attention plan by prompt length, as a plot.

Reads the table "Key splits and the kernel by prompt length" of a prefill-attention results
file (bench/results/2026-12-07-h100-prefill-attention.md: one layer's time in us for each
kernel and split count, the plan's picks in bold) and draws, for the INT4 cache with groups
of 16 and with one pair a head vector (int4/128), the time of the earlier plan's pick, the
time of the current plan's pick (the bold cell) and the FP16 cache's best, against T; and,
where the file has the section "The plan on the GPU", the plan's times measured with the plan
running (its table "One layer", up to 1024 tokens). Needs matplotlib.
"""
import re
import sys

# columns of the table, after T
COLS = ["mma3_1", "mma3_2", "mma2_1", "mma2_2", "mma2_3", "g128_1", "g128_2", "fp16_1", "fp16_2"]
# the earlier plan's pick a row (results file: 2 splits at 128, 3 at 256, 2 at 384 and 512,
# 1 from 768; int4/16 on attn_mma3_kernel). At 256 its cells are not in the table but in the
# text: attn_mma3_kernel 82.77 us, int4/128 82.86 us with three splits.
EARLIER = {128: ("mma3_2", "g128_2"), 384: ("mma3_2", "g128_2"), 512: ("mma3_2", "g128_2"),
           768: ("mma3_1", "g128_1"), 1024: ("mma3_1", "g128_1")}
EARLIER_256 = (82.77, 82.86)


def table_rows(text, start):
    """(T, cells) of the Markdown table that follows offset start in text: its rows that begin
    with a number, up to the first line after them that is not a table line."""
    rows = []
    for line in text[start:].splitlines():
        m = re.match(r"^\| (\d+) \|(.*)\|$", line)
        if not m:
            if rows and not line.startswith("|"):
                break
            continue
        rows.append((int(m.group(1)), [c.strip() for c in m.group(2).split("|")]))
    return rows


def read_table(text):
    rows = {}
    for t, cells in table_rows(text, text.index("## Key splits and the kernel by prompt length")):
        if len(cells) != len(COLS):
            sys.exit("plot_prefill.py: row %s has %d cells, want %d" % (t, len(cells), len(COLS)))
        vals, bold = {}, set()
        for name, c in zip(COLS, cells):
            if c.startswith("**"):
                bold.add(name)
            vals[name] = float(c.strip("*").replace(",", ""))
        rows[t] = (vals, bold)
    if not rows:
        sys.exit("plot_prefill.py: no table rows")
    return rows


def read_measured(text):
    """{T: (int4/16 us, int4/128 us)} from the table "One layer" of "The plan on the GPU"."""
    if "## The plan on the GPU" not in text:
        return {}
    start = text.index("### One layer", text.index("## The plan on the GPU"))
    num = lambda c: float(c.split(" (")[0].replace(",", ""))
    return {t: (num(cells[0]), num(cells[3])) for t, cells in table_rows(text, start)}


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot_prefill.py RESULTS.md OUT.png")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    text = open(sys.argv[1], encoding="utf-8").read()
    rows = read_table(text)
    measured = read_measured(text)
    T = sorted(rows)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, (fmt, idx, label) in zip(
        axes, [("int4/16", 0, "INT4, groups of 16 (comet quantize)"),
               ("int4/128", 1, "INT4, one pair a head vector (synthetic 8B)")]):
        earlier = [EARLIER_256[idx] if t == 256 else rows[t][0][EARLIER[t][idx]] for t in T]
        prefix = "g128" if idx else None
        now = []
        for t in T:
            vals, bold = rows[t]
            pick = [c for c in bold if c.startswith("g128") == bool(prefix)]
            if len(pick) != 1:
                sys.exit("plot_prefill.py: T %d: want one bold %s cell, got %s" % (t, fmt, pick))
            now.append(vals[pick[0]])
        fp16 = [min(rows[t][0]["fp16_1"], rows[t][0]["fp16_2"]) for t in T]
        ax.plot(T, earlier, "o-", label="earlier plan (splits from the fp32 grid)")
        ax.plot(T, now, "s-", label="whole-wave plan (main)")
        ax.plot(T, fp16, "^--", color="gray", label="FP16 cache, best split")
        meas = [(t, v[idx]) for t, v in sorted(measured.items()) if t <= T[-1]]
        if meas:
            ax.plot([t for t, _ in meas], [v for _, v in meas], "kx", markersize=9,
                    label="whole-wave plan, measured running (session 11)")
        for t, a, b in zip(T, earlier, now):
            if a / b > 1.05:
                ax.annotate("%.2fx" % (a / b), (t, b), textcoords="offset points", xytext=(0, -14),
                            ha="center", fontsize=8)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("prompt tokens T (one sequence)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("us a layer (LLaMA-3-8B: H 32, Hkv 8, D 128)")
    axes[0].legend(fontsize=8)
    fig.suptitle("Prefill attention on one H100: key splits and kernel by prompt length "
                 "(bench_attention, same run)", fontsize=11)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
