#!/usr/bin/env python3
"""llamacpp_rows.py - llama.cpp's benchmark outputs as comet's serving-benchmark rows.

Reads what `llama-bench -o json` or `llama-batched-bench` (its Markdown table or
`--output-format jsonl`) printed and appends one JSON object a measured row to --json, in
the fields the serving benchmarks share (bench/serve_load.py, `comet bench --throughput`):

  llama-batched-bench, one row per (PP, TG, B): engine "llama.cpp", mode "batched",
    input_len PP, output_len TG, concurrency B, requests B,
    output_tok_s = B*TG / T (output tokens over the whole run, prefill included: the same
    definition as comet's offline and online output tok/s), total_tok_s = S (prompt and
    output tokens over T), tg_tok_s = S_TG (generation alone, B*TG / T_TG: the figure
    llama.cpp reports), pp_tok_s = S_PP, wall_s = T, ttft_p50_ms = ttft_p99_ms = T_PP (all
    prompts are processed before the first token of any sequence), tpot_p50_ms =
    tpot_p99_ms = T_TG / TG (every sequence advances one token a step), mean_batch = B.
  llama-bench, one row per test: mode "llama-bench", test "pp512" / "tg128" /
    "pp512+tg128", tok_s (the mean over repetitions), tok_s_stddev, n_prompt, n_gen.

Every row also carries the --tag fields (model, variant, gpu, commit, date, command,
device_used_peak: what the caller passes as key=value; a value of digits becomes a number). It prints each row as a line of a Markdown table on stdout.
It refuses an input in which it finds no row (a failed run prints none): exit 1.

Usage:
  llama-batched-bench ... > bb.txt; python3 bench/llamacpp_rows.py batched bb.txt \
      --json rows.jsonl --tag model=llama3-8b --tag variant=Q4_0
  llama-bench ... -o json > lb.json; python3 bench/llamacpp_rows.py bench lb.json --json rows.jsonl
"""
import argparse
import json
import re
import sys

BATCHED_COLS = ["PP", "TG", "B", "N_KV", "T_PP s", "S_PP t/s", "T_TG s", "S_TG t/s", "T s",
                "S t/s"]


def parse_batched(text):
    """(PP, TG, B, N_KV, T_PP, S_PP, T_TG, S_TG, T, S) tuples from llama-batched-bench's
    Markdown table or JSONL lines, in the order printed."""
    out = []
    header = None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("{") and '"speed_tg"' in s:
            d = json.loads(s)
            out.append((d["pp"], d["tg"], d["pl"], d["n_kv"], d["t_pp"], d["speed_pp"],
                        d["t_tg"], d["speed_tg"], d["t"], d["speed"]))
            continue
        if not s.startswith("|"):
            continue
        cells = [c.strip() for c in s.strip("|").split("|")]
        if cells[:3] == ["PP", "TG", "B"]:
            if cells != BATCHED_COLS:
                raise ValueError("llama-batched-bench table has unexpected columns: %s" % cells)
            header = cells
            continue
        if header is None or set(s) <= set("|-: "):
            continue
        if len(cells) != len(header):
            raise ValueError("llama-batched-bench row has %d cells, not %d: %r"
                             % (len(cells), len(header), s))
        v = [float(c) for c in cells]
        out.append((int(v[0]), int(v[1]), int(v[2]), int(v[3])) + tuple(v[4:]))
    return out


def batched_rows(text, tags):
    rows = []
    for pp, tg, b, n_kv, t_pp, s_pp, t_tg, s_tg, t, s in parse_batched(text):
        r = dict(tags)
        r.update({
            "engine": "llama.cpp", "mode": "batched", "status": "ok",
            "input_len": pp, "output_len": tg, "concurrency": b, "requests": b, "n_kv": n_kv,
            "output_tok_s": b * tg / t if t > 0 else None, "total_tok_s": s,
            "tg_tok_s": s_tg, "pp_tok_s": s_pp, "wall_s": t,
            "ttft_p50_ms": 1e3 * t_pp, "ttft_p99_ms": 1e3 * t_pp,
            "tpot_p50_ms": 1e3 * t_tg / tg if tg else None,
            "tpot_p99_ms": 1e3 * t_tg / tg if tg else None,
            "mean_batch": b,
        })
        rows.append(r)
    return rows


def bench_rows(text, tags):
    """Rows from `llama-bench -o json` (a JSON array) or `-o jsonl` (one object a line)."""
    s = text.strip()
    if not s:
        return []
    if s.startswith("["):
        tests = json.loads(s)
    else:
        tests = [json.loads(x) for x in s.splitlines() if x.strip().startswith("{")]
    rows = []
    for t in tests:
        n_p, n_g, depth = t.get("n_prompt", 0), t.get("n_gen", 0), t.get("n_depth", 0)
        name = "+".join(x for x in (("pp%d" % n_p) if n_p else "", ("tg%d" % n_g) if n_g else "")
                        if x)
        if depth:
            name += " @ d%d" % depth
        r = dict(tags)
        r.update({
            "engine": "llama.cpp", "mode": "llama-bench", "status": "ok", "test": name,
            "n_prompt": n_p, "n_gen": n_g, "n_depth": depth, "tok_s": t["avg_ts"],
            "tok_s_stddev": t.get("stddev_ts"), "flash_attn": t.get("flash_attn"),
            "n_gpu_layers": t.get("n_gpu_layers"), "type_k": t.get("type_k"),
            "gpu_info": t.get("gpu_info"), "model_type": t.get("model_type"),
            "model_size": t.get("model_size"), "reps": len(t.get("samples_ts") or []),
        })
        rows.append(r)
    return rows


def fmt(v, nd=1):
    if v is None:
        return "-"
    if isinstance(v, float):
        return "{:,.{}f}".format(v, nd)
    return str(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kind", choices=["batched", "bench"],
                    help="batched: llama-batched-bench output; bench: llama-bench -o json")
    ap.add_argument("input", help="the captured output ('-' for stdin)")
    ap.add_argument("--json", help="append the rows to this JSON-lines file")
    ap.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE",
                    help="a field added to every row (repeatable)")
    a = ap.parse_args()
    tags = {}
    for t in a.tag:
        if "=" not in t:
            ap.error("--tag wants KEY=VALUE, got %r" % t)
        k, v = t.split("=", 1)
        tags[k] = int(v) if re.fullmatch(r"-?\d+", v) else v  # device_used_peak=BYTES etc.
    text = sys.stdin.read() if a.input == "-" else open(a.input, encoding="utf-8",
                                                         errors="replace").read()
    try:
        rows = batched_rows(text, tags) if a.kind == "batched" else bench_rows(text, tags)
    except (ValueError, KeyError) as e:
        sys.exit("llamacpp_rows.py: %s: cannot parse: %s" % (a.input, e))
    if not rows:
        sys.exit("llamacpp_rows.py: %s: no result rows (did the run fail?)" % a.input)
    if a.json:
        with open(a.json, "a", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, sort_keys=True) + "\n")
    for r in rows:
        if a.kind == "batched":
            print("| llama.cpp %s | %s | %d/%d | %d | %s | %s | %s | %s | %s |" % (
                r.get("variant", "Q4_0"), r.get("model", "?"), r["input_len"], r["output_len"],
                r["concurrency"], fmt(r["output_tok_s"]), fmt(r["tg_tok_s"]),
                fmt(r["total_tok_s"]), fmt(r["ttft_p50_ms"]), fmt(r["tpot_p50_ms"], 2)))
        else:
            print("| llama.cpp %s | %s | %s | %s ± %s |" % (
                r.get("variant", "Q4_0"), r.get("model", "?"), r["test"], fmt(r["tok_s"], 2),
                fmt(r["tok_s_stddev"], 2)))


if __name__ == "__main__":
    main()
