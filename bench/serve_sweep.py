#!/usr/bin/env python3
"""serve_sweep.py - request-rate sweep against `comet serve` with the official openai client.

Starts `comet serve` on 127.0.0.1 (or uses --url), then for each request rate sends
--requests streaming chat completions with Poisson arrivals (seeded), each with a prompt
from a fixed list and max_tokens output tokens (ignore nothing: greedy, so lengths vary
only by EOS). Per request: TTFT (arrival to first content token), TPOT ((last - first) /
(tokens - 1)), end-to-end latency. Per rate: completed requests, output tokens/s over the
wall time of the rate's run, request throughput, TTFT/TPOT/E2E p50 and p99. Writes a
Markdown table to bench/results/<date>-cpu-serve.md (date, CPU, commit, command).

Usage: python3 bench/serve_sweep.py [--rates 0.25,0.5,1,2] [--requests 16] [--max-tokens 32]
"""
import argparse
import datetime
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

import openai

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Give three tips for learning to cook.",
    "Explain what a prime number is.",
    "Name four animals that live in the Arctic.",
    "Why is the sky blue? Answer briefly.",
    "Suggest a name for a small bakery.",
    "What is 12 times 7?",
]


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def one_request(client, model, prompt, max_tokens, out):
    t0 = time.perf_counter()
    first = last = None
    n = 0
    usage = None
    try:
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
            temperature=0, stream=True, stream_options={"include_usage": True})
        for ch in stream:
            if ch.usage is not None:
                usage = ch.usage
            if ch.choices and ch.choices[0].delta.content:
                now = time.perf_counter()
                if first is None:
                    first = now
                last = now
    except Exception as e:  # counted as a failed request
        out.append({"error": repr(e)})
        return
    n = usage.completion_tokens if usage else 0
    out.append({"ttft": (first - t0) if first else None,
                "tpot": (last - first) / (n - 1) if first and n > 1 else None,
                "e2e": time.perf_counter() - t0, "tokens": n})


def run_rate(client, model, rate, n_req, max_tokens, seed):
    rng = random.Random(seed)
    results, threads = [], []
    t_start = time.perf_counter()
    t_next = t_start
    for i in range(n_req):
        now = time.perf_counter()
        if t_next > now:
            time.sleep(t_next - now)
        th = threading.Thread(target=one_request,
                              args=(client, model, PROMPTS[i % len(PROMPTS)], max_tokens, results))
        th.start()
        threads.append(th)
        t_next += rng.expovariate(rate)
    for th in threads:
        th.join(timeout=1800)
    wall = time.perf_counter() - t_start
    ok = [r for r in results if "error" not in r]
    toks = sum(r["tokens"] for r in ok)
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    tpot = [r["tpot"] for r in ok if r["tpot"] is not None]
    e2e = [r["e2e"] for r in ok]
    return {"rate": rate, "ok": len(ok), "failed": len(results) - len(ok) + (n_req - len(results)),
            "wall": wall, "tok_s": toks / wall, "req_s": len(ok) / wall, "tokens": toks,
            "ttft50": pct(ttft, 50), "ttft99": pct(ttft, 99), "tpot50": pct(tpot, 50),
            "tpot99": pct(tpot, 99), "e2e50": pct(e2e, 50), "e2e99": pct(e2e, 99)}


def cpu_name():
    try:
        for ln in open("/proc/cpuinfo"):
            if ln.startswith("model name"):
                return ln.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.path.join(root, "build", "comet"))
    ap.add_argument("--model", default=os.path.join(root, "models",
                                                    "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--url", help="use a running server (http://host:port/v1) instead")
    ap.add_argument("--rates", default="0.25,0.5,1,2")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0, help="server CPU threads (0 = all)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    server = None
    server_cmd = ""
    if args.url:
        url, model = args.url, None
    else:
        cmd = [args.bin, "serve", "--model", args.model, "--model-id", "bench", "--port", "0",
               "--max-seqs", "32", "--kv-pages", "256", "--threads", str(args.threads)]
        server_cmd = " ".join(cmd[1:]).replace(root + "/", "")
        server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True)
        line = ""
        deadline = time.time() + 120
        while time.time() < deadline:
            line = server.stdout.readline()
            if line.startswith("listening on") or server.poll() is not None:
                break
        m = re.match(r"listening on ([^:]+):(\d+)", line)
        if not m:
            sys.exit(f"serve_sweep: the server did not start ({line!r})")
        url, model = f"http://127.0.0.1:{m.group(2)}/v1", "bench"
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=1800)
    load_start = os.getloadavg()[0]
    if model is None:
        model = client.models.list().data[0].id
    try:
        one_request(client, model, "Hello", 4, [])  # warm-up
        rows = [run_rate(client, model, float(r), args.requests, args.max_tokens, args.seed)
                for r in args.rates.split(",")]
    finally:
        if server:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()

    load_end = os.getloadavg()[0]
    date = datetime.datetime.utcnow().strftime("%Y-%m-%d")
    try:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = "unknown"
    out = args.out or os.path.join(root, "bench", "results", f"{date}-cpu-serve.md")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    cmdline = "python3 bench/serve_sweep.py " + " ".join(sys.argv[1:])
    lines = [
        f"# comet serve: request-rate sweep on the CPU backend ({date})",
        "",
        f"- date: {datetime.datetime.utcnow().strftime('%Y-%m-%d %H:%M UTC')}",
        f"- CPU: {cpu_name()}, {os.cpu_count()} logical cores; 1-min load average "
        f"{load_start:.1f} at the start, {load_end:.1f} at the end (other jobs included)",
        f"- commit: {commit}",
        f"- command: `{cmdline.strip()}`",
        f"- server: `comet {server_cmd}`" if server_cmd else f"- server: {url}",
        f"- model: {os.path.basename(args.model)} (dequantized to FP32, CPU FP32 forward)",
        f"- workload: {args.requests} streaming chat requests per rate, Poisson arrivals "
        f"(seed {args.seed}), greedy, max_tokens {args.max_tokens}, 8 short prompts",
        "- client: official `openai` Python package, one thread per request",
        "",
        "| rate (req/s) | ok | failed | wall s | out tok/s | req/s | TTFT p50 s | TTFT p99 s "
        "| TPOT p50 ms | TPOT p99 ms | E2E p50 s | E2E p99 s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['rate']:g} | {r['ok']} | {r['failed']} | {r['wall']:.1f} | {r['tok_s']:.1f} "
            f"| {r['req_s']:.2f} | {r['ttft50']:.2f} | {r['ttft99']:.2f} "
            f"| {r['tpot50'] * 1e3:.0f} | {r['tpot99'] * 1e3:.0f} | {r['e2e50']:.2f} "
            f"| {r['e2e99']:.2f} |")
    lines.append("")
    with open(out, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(lines))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
