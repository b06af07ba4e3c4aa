#!/usr/bin/env python3
"""plot_serving.py - the serving-throughput rows (JSON lines) as a Markdown table and a PNG.

Reads the rows that bench/serving_gpu.sh collects (`comet bench --throughput --json`,
bench/serve_load.py --json, bench/llamacpp_rows.py --json; one JSON object a line, later
rows of the same engine, variant, mode, model, lengths, concurrency and rate replacing
earlier ones) and writes

  --md FILE   a Markdown report: the --title, the --meta lines (date, GPU, commit, commands),
              one table of the throughput rows (engine, mode, model, lengths, concurrency,
              output and total tok/s, TTFT/TPOT p50/p99, mean batch, KV capacity, peak device
              memory, preemptions, status; a row that did not run says why: "does not fit",
              "skipped: time budget", ...) and one of llama-bench's rows;
  --png FILE  output tok/s against concurrency, one panel per model and input/output length:
              comet W4AxKV4 (offline, and online with all requests at once, dashed), comet FP16
              (offline) and llama.cpp Q4_0 (llama-batched-bench). Needs matplotlib (the GPU
              machine's image has it; here: pip install matplotlib in a virtual environment).

Usage:
  python3 bench/plot_serving.py serving.jsonl --md serving.md --png docs/serving_throughput.png \
      --title "Serving throughput, H200" --meta "date: ..." --meta "GPU: ..."
"""
import argparse
import json
import re
import sys

# a row replaces an earlier one with the same values of these (and of "test", llama-bench's)
KEY = ("engine", "variant", "mode", "model", "input_len", "output_len", "concurrency", "rate")


def load(paths):
    rows = {}
    order = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    r = json.loads(line)
                except ValueError as e:
                    sys.exit("plot_serving.py: %s:%d: not JSON: %s" % (p, n, e))
                if not isinstance(r, dict):
                    sys.exit("plot_serving.py: %s:%d: not a JSON object" % (p, n))
                k = tuple(str(r.get(x)) for x in KEY) + (str(r.get("test")),)
                if k not in rows:
                    order.append(k)
                rows[k] = r
    return [rows[k] for k in order]


def num(v, nd=0):
    if v is None or v == "":
        return "-"
    if isinstance(v, (int, float)):
        return "{:,.{}f}".format(v, nd)
    return str(v)


def label(r):
    e = r.get("engine", "?")
    v = r.get("variant") or ""
    return ("%s %s" % (e, v)).strip()


def natural(x):
    """A sort key that orders digit runs by value: llama3-8b before llama3-70b."""
    return [(0, int(t), "") if t.isdigit() else (1, 0, t)
            for t in re.split(r"(\d+)", str(x)) if t]


def sort_key(r):
    return (natural(r.get("model")), int(r.get("input_len") or 0), int(r.get("output_len") or 0),
            label(r), str(r.get("mode")), int(r.get("concurrency") or 0), str(r.get("rate")))


def markdown(rows, title, meta):
    out = ["# " + title, ""] if title else []
    out += ["- " + m for m in meta]
    if meta:
        out.append("")
    tp = sorted([r for r in rows if r.get("mode") != "llama-bench"], key=sort_key)
    if tp:
        out += ["| engine | mode | model | in/out | C | rate | N | output tok/s | total tok/s "
                "| TTFT p50 / p99 ms | TPOT p50 / p99 ms | mean batch | KV capacity tokens "
                "| peak device GiB | preemptions | status |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in tp:
            dev = r.get("device_used_peak")
            out.append("| %s | %s | %s | %s/%s | %s | %s | %s | %s | %s | %s / %s | %s / %s | %s "
                       "| %s | %s | %s | %s |" % (
                           label(r), r.get("mode", "-"), r.get("model", "-"),
                           r.get("input_len", "-"), r.get("output_len", "-"),
                           r.get("concurrency", "-"), r.get("rate", "-") or "-",
                           r.get("requests", "-"), num(r.get("output_tok_s")),
                           num(r.get("total_tok_s")), num(r.get("ttft_p50_ms")),
                           num(r.get("ttft_p99_ms")), num(r.get("tpot_p50_ms"), 2),
                           num(r.get("tpot_p99_ms"), 2), num(r.get("mean_batch"), 1),
                           num(r.get("kv_pool_tokens")),
                           num(dev / 2**30, 1) if isinstance(dev, (int, float)) else "-",
                           num(r.get("preemptions")), r.get("status", "ok")))
        out.append("")
    lb = [r for r in rows if r.get("mode") == "llama-bench"]
    if lb:
        out += ["llama-bench (llama.cpp CUDA, Q4_0, flash attention, all layers on the GPU):", "",
                "| model | test | tok/s | stddev | repetitions | command |", "|---|---|---|---|---|---|"]
        for r in lb:
            out.append("| %s | %s | %s | %s | %s | `%s` |" % (
                r.get("model", "-"), r.get("test", "-"), num(r.get("tok_s"), 1),
                num(r.get("tok_s_stddev"), 1), r.get("reps", "-"), r.get("command", "-")))
        out.append("")
    cmds = []
    for r in rows:
        c = r.get("command")
        if c and c not in cmds and r.get("mode") != "llama-bench":
            cmds.append(c)
    if cmds:
        out += ["Commands (as run):", ""] + ["- `%s`" % c for c in cmds] + [""]
    return "\n".join(out)


SERIES = [  # (label, predicate, style)
    ("comet W4AxKV4 (offline)",
     lambda r: r.get("engine") == "comet" and r.get("variant") != "FP16" and r.get("mode") == "offline",
     dict(color="tab:blue", marker="o", linestyle="-")),
    ("comet W4AxKV4 (online, all at once)",
     lambda r: r.get("engine") == "comet" and r.get("variant") != "FP16" and r.get("mode") == "online"
     and str(r.get("rate")) == "inf",
     dict(color="tab:blue", marker="s", linestyle="--")),
    ("comet FP16 (offline)",
     lambda r: r.get("engine") == "comet" and r.get("variant") == "FP16" and r.get("mode") == "offline",
     dict(color="tab:orange", marker="^", linestyle="-")),
    ("llama.cpp CUDA Q4_0 (batched-bench)",
     lambda r: r.get("engine") == "llama.cpp" and r.get("mode") == "batched",
     dict(color="tab:green", marker="D", linestyle="-")),
]


def plot(rows, path, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_serving.py: matplotlib is missing (pip install matplotlib): no %s" % path)
    tp = [r for r in rows if r.get("mode") != "llama-bench"]
    panels = sorted({(str(r.get("model")), int(r.get("input_len") or 0),
                      int(r.get("output_len") or 0)) for r in tp},
                    key=lambda p: (natural(p[0]), p[1], p[2]))
    if not panels:
        sys.exit("plot_serving.py: no throughput rows to plot")
    ncol = min(3, len(panels))
    nrow = (len(panels) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 4.0 * nrow), squeeze=False)
    for ax, (model, il, ol) in zip(axes.flat, panels):
        mine = [r for r in tp if str(r.get("model")) == model and r.get("input_len") == il
                and r.get("output_len") == ol]
        notes = {}  # (series, status) -> concurrencies
        for name, pred, style in SERIES:
            pts = sorted((int(r["concurrency"]), float(r["output_tok_s"])) for r in mine
                         if pred(r) and r.get("status", "ok") == "ok"
                         and r.get("output_tok_s") is not None and r.get("concurrency"))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=name, **style)
            for r in mine:
                if pred(r) and r.get("status", "ok") != "ok":
                    notes.setdefault((name.split(" (")[0], r.get("status")), []).append(
                        str(r.get("concurrency")))
        ax.set_xscale("log", base=2)
        xs = sorted({int(r["concurrency"]) for r in mine
                     if str(r.get("concurrency", "")).isdigit() and r.get("status", "ok") == "ok"})
        if xs:
            ax.set_xticks(xs)
            ax.set_xticklabels([str(x) for x in xs])
            ax.minorticks_off()
        ax.set_xlabel("concurrency (sequences)")
        ax.set_ylabel("output tok/s")
        ax.set_title("%s, %d/%d tokens" % (model, il, ol))
        ax.grid(True, which="both", alpha=0.3)
        if notes:
            lines = ["%s, C=%s: %s" % (n, ",".join(sorted(set(cs), key=natural)), st)
                     for (n, st), cs in sorted(notes.items())]
            ax.text(0.98, 0.02, "\n".join(lines[:6]), transform=ax.transAxes, ha="right",
                    va="bottom", fontsize=7, color="gray")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print("plot_serving.py: wrote %s (%d panels)" % (path, len(panels)), file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("jsonl", nargs="+", help="row files (JSON lines)")
    ap.add_argument("--md", help="write the Markdown report here")
    ap.add_argument("--png", help="write the plot here")
    ap.add_argument("--title", default="")
    ap.add_argument("--meta", action="append", default=[], help="a line under the title")
    a = ap.parse_args()
    if not a.md and not a.png:
        ap.error("nothing to do: give --md and/or --png")
    rows = load(a.jsonl)
    if not rows:
        sys.exit("plot_serving.py: no rows in %s" % ", ".join(a.jsonl))
    if a.md:
        with open(a.md, "w", encoding="utf-8") as f:
            f.write(markdown(rows, a.title, a.meta))
        print("plot_serving.py: wrote %s (%d rows)" % (a.md, len(rows)), file=sys.stderr)
    if a.png:
        plot(rows, a.png, a.title)


if __name__ == "__main__":
    main()
