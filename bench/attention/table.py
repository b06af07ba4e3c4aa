#!/usr/bin/env python3
"""table.py - the Markdown report of the attention benchmark (bench/attention/run.sh): the JSON
lines of bench_attention (comet) and sdpa_torch.py (PyTorch SDPA) as one decode table and one
prefill table, rows per shape (each comet KV format, then torch), with the date, GPU, commit
and commands, the formulas, and a summary against issue 41's attention goals. Standard
library only.

Usage: table.py --comet comet.jsonl --torch torch.jsonl --out attention.md
         [--commit C] [--cmd "command" ...] [--comet-rc N] [--torch-rc N]
A missing or empty input gives a report that says so (the other side's rows still appear).
"""
import argparse
import datetime
import json
import os
import sys


def read_jsonl(path):
    """(env line or None, result lines, lines that were not JSON) of one run's stdout."""
    env, rows, junk = None, [], []
    if not path or not os.path.exists(path):
        return env, rows, junk
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                junk.append(line)
                continue
            if obj.get("type") == "env":
                env = obj
            elif obj.get("type") == "result":
                rows.append(obj)
    return env, rows, junk


def fmt(x, digits=1):
    return "" if x is None else f"{x:,.{digits}f}"


def impl_name(r):
    if r["src"] == "comet":
        return f"comet {r['kv'].upper()}" if r["kv"] == "fp16" else f"comet {r['kv']}"
    return f"torch SDPA FP16 ({r['backend']})" if r.get("backend") else "torch SDPA FP16"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--comet", required=True)
    ap.add_argument("--torch", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--cmd", action="append", default=[])
    ap.add_argument("--comet-rc", default="?")
    ap.add_argument("--torch-rc", default="?")
    a = ap.parse_args()

    cenv, crows, cjunk = read_jsonl(a.comet)
    tenv, trows, tjunk = read_jsonl(a.torch)
    env = cenv or tenv or {}
    peak_gbs = env.get("peak_gbs")
    peak_tflops = env.get("peak_tflops")
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    L = []
    L.append(f"# Attention benchmark: {env.get('gpu', 'unknown GPU')}, {now}")
    L.append("")
    L.append(f"- GPU: {env.get('gpu', '?')}, {env.get('sm', '?')} SMs, "
             f"{env.get('mem_total_gb', '?')} GB"
             + (f"; CUDA runtime {cenv['cuda_runtime']}, driver {cenv['cuda_driver']}"
                if cenv else "")
             + (f"; torch {tenv['torch']} (CUDA {tenv['cuda']}, cuDNN {tenv['cudnn']})"
                if tenv else ""))
    L.append(f"- commit: {a.commit}")
    for c in a.cmd:
        L.append(f"- command: `{c}`")
    L.append(f"- exit status: bench_attention {a.comet_rc}, sdpa_torch.py {a.torch_rc}")
    if cenv and tenv and cenv.get("gpu") != tenv.get("gpu"):
        L.append(f"- WARNING: the two runs saw different GPUs ({cenv.get('gpu')} and "
                 f"{tenv.get('gpu')})")
    if env:
        L.append(f"- shape: {env.get('model')} heads, H {env.get('H')}, Hkv {env.get('Hkv')}, "
                 f"D {env.get('D')}; one layer; comet page size {cenv.get('P') if cenv else '?'}"
                 f" tokens; peaks {fmt(peak_gbs, 0)} GB/s and {fmt(peak_tflops, 0)} TFLOPS "
                 "(dense FP16 tensor cores)")
    rot = sorted({(r["kv"], r.get("rotate")) for r in crows if r.get("status") == "ok"})
    if rot:
        L.append("- comet KV formats (rotation): "
                 + ", ".join(f"{k} ({ro})" for k, ro in rot)
                 + "; int4/G: INT4 codes with an fp16 (scale, zero) pair per G channels")
    L.append("- decode bytes read = B * Hkv * L * 2 * (codes + scale pairs a slot and head) + "
             "page ids (comet: INT4 D/2 + 4 D/G, INT8 D + 4 D/G, FP16 2 D bytes, page ids "
             "B * ceil(L/P) * 4; torch: B * Hkv * L * 2 * D * 2); q and out not counted. "
             "GB/s = bytes / time")
    L.append("- prefill FLOPs = 4 * (T * T / 2) * D * H (causal; the FlashAttention "
             "convention); TFLOPS = FLOPs / time")
    L.append("- time: median over intervals of back-to-back calls queued behind a spin kernel "
             "(bench_attention.cu, sdpa_torch.py); small decode shapes rotate through copies of "
             "the cache (at least 256 MB) so that L2 does not hold them")
    L.append("- \"vs comet FP16\": comet FP16's time / this row's time (above 1: faster)")
    for name, junk in (("bench_attention", cjunk), ("sdpa_torch.py", tjunk)):
        if junk:
            L.append(f"- {name} printed {len(junk)} non-JSON lines on stdout (first: "
                     f"`{junk[0][:120]}`)")
    if not crows:
        L.append("- **no comet results** (see attention_comet.log)")
    if not trows:
        L.append("- **no torch results** (see attention_torch.log)")
    L.append("")

    rows = crows + trows
    order = []  # impl names in the order they first appear, comet before torch
    for r in rows:
        key = (r["src"], r["kv"])
        if key not in order:
            order.append(key)

    def note(r):
        if r.get("status") != "ok":
            return f"{r.get('status')}: {r.get('reason', '')}"
        parts = []
        if r.get("check", "ok") != "ok":
            parts.append(f"**{r['check']}**")
        if r["src"] == "comet" and r.get("splits", 1) > 1:
            parts.append(f"{r['splits']} splits")
        return ", ".join(parts)

    def fp16_us(shape_rows):
        for r in shape_rows:
            if r["src"] == "comet" and r["kv"] == "fp16" and r.get("status") == "ok":
                return r["us"]
        return None

    def shape_table(title, shape_cols, cols, rows_, key, cells):
        """A section: the title, a table of columns shape_cols, impl, cols, "vs comet FP16",
        note, and one row a measurement of rows_, shapes key(r) in sorted order and comet
        before torch within one: the shape's values, the impl, cells(r) (one string a col;
        blank where the row did not run), the speed against comet FP16's, the note."""
        L.append(f"## {title}")
        L.append("")
        L.append("| " + " | ".join(shape_cols + ["impl"] + cols + ["vs comet FP16", "note"]) + " |")
        L.append("|" + "---:|" * len(shape_cols) + "---|" + "---:|" * (len(cols) + 1) + "---|")
        for shape in sorted({key(r) for r in rows_}):
            srows = [r for r in rows_ if key(r) == shape]
            srows.sort(key=lambda r: order.index((r["src"], r["kv"])))
            ref = fp16_us(srows)
            for r in srows:
                ok = r.get("status") == "ok"
                ratio = f"{ref / r['us']:.2f}x" if ok and ref and r["us"] > 0 else ""
                vals = cells(r) if ok else [""] * len(cols)
                L.append("| " + " | ".join([str(v) for v in shape] + [impl_name(r)] + vals +
                                           [ratio, note(r)]) + " |")
        L.append("")

    summary = []
    dec = [r for r in rows if r["mode"] == "decode"]
    if dec:
        shape_table("Decode attention (one query token a sequence, B sequences of L keys)",
                    ["B", "L"], ["us", "MB read", "GB/s", "% of peak"], dec,
                    lambda r: (r["B"], r["L"]),
                    lambda r: [fmt(r.get("us"), 2), fmt(r["bytes"] / 1e6, 1),
                               fmt(r.get("gbs"), 0), fmt(r.get("pct_peak"), 1)])
        goal = [r for r in dec if r["src"] == "comet" and r["kv"].startswith("int4")
                and r.get("status") == "ok" and r["B"] >= 16 and r["L"] >= 8192]
        for kv in sorted({r["kv"] for r in goal}):
            g = [r for r in goal if r["kv"] == kv]
            pct = [r["pct_peak"] for r in g]
            ratios = []
            for r in g:
                ref = fp16_us([x for x in dec if (x["B"], x["L"]) == (r["B"], r["L"])])
                if ref:
                    ratios.append(ref / r["us"])
            line = (f"- comet {kv} decode, B >= 16 and L >= 8K ({len(g)} shapes): "
                    f"{min(pct):.1f} to {max(pct):.1f} % of {fmt(peak_gbs, 0)} GB/s "
                    "(goal >= 80 % of 4.3 TB/s)")
            if ratios:
                line += (f"; {min(ratios):.2f}x to {max(ratios):.2f}x comet FP16's speed "
                         "(goal >= 3x)")
            summary.append(line)

    pre = [r for r in rows if r["mode"] == "prefill"]
    if pre:
        shape_table("Prefill attention (one sequence of T tokens, causal, keys from the paged "
                    "cache for comet)", ["T"], ["us", "TFLOPS", "% of TC peak"], pre,
                    lambda r: (r["T"],),
                    lambda r: [fmt(r.get("us"), 1), fmt(r.get("tflops"), 2),
                               fmt(r.get("pct_tc"), 1)])
        for kv in [k for s, k in order if s == "comet"]:
            g = [r for r in pre if r["src"] == "comet" and r["kv"] == kv
                 and r.get("status") == "ok" and r["T"] >= 2048]
            if g:
                summary.append(f"- comet {kv} prefill, T >= 2K: "
                               f"{min(r['pct_tc'] for r in g):.1f} to "
                               f"{max(r['pct_tc'] for r in g):.1f} % of the dense FP16 "
                               "tensor-core peak (goal >= 50 %)")
    mix = [r for r in rows if r["mode"] == "mixed"]
    if mix:
        shape_table("Mixed steps (B decode sequences of L keys and one prefill chunk of T "
                    "tokens, one call)", ["B", "L", "T"], ["us", "GB/s", "TFLOPS"], mix,
                    lambda r: (r["B"], r["L"], r["T"]),
                    lambda r: [fmt(r.get("us"), 1), fmt(r.get("gbs"), 0),
                               fmt(r.get("tflops"), 2)])
    bad = [r for r in rows if r.get("check", "ok") != "ok" or r.get("status") == "failed"]
    if bad:
        summary.append(f"- **{len(bad)} rows failed a check or did not run** (see the notes)")
    if summary:
        L.append("## Summary against issue 41's attention goals")
        L.append("")
        L.extend(summary)
        L.append("")

    text = "\n".join(L)
    with open(a.out, "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
