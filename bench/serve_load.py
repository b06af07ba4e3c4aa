#!/usr/bin/env python3
"""serve_load.py - online serving throughput of `comet serve`: concurrent streaming requests
over HTTP, all at once or at fixed request rates, with token-id prompts.

Python's standard library only (threads and http.client), so it runs wherever python3 does,
the GPU machine included. It starts `comet serve` with the given arguments (adding --host
127.0.0.1 --port 0 and reading "listening on HOST:PORT" from its stdout) or uses a running
server (--url). For each workload in the grid lengths x concurrencies x rates it sends N
requests to POST /v1/completions:

  {"model": ID, "prompt": [I random token ids], "max_tokens": O, "temperature": 0,
   "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}}

(ignore_eos is vLLM's extension, which comet's server takes: every request generates
exactly O tokens). Prompt ids are uniform in --token-range, drawn from a generator seeded by
--seed and the request's index, so runs repeat and no two prompts share a prefix. Arrivals:
rate "inf" sends all N at once; a number R sends them as a Poisson process of R requests/s
(seeded). At most C requests are in flight (a client-side limit, as vLLM's
--max-concurrency); N defaults to max(C, --min-requests). A concurrency of "max" is, per
length, the most sequences the server's KV pool holds in whole pages (the pool from the
memory plan `comet serve` logs at start, else from its KV pages in /metrics).

Per request: TTFT = send to the first streamed text, E2E = send to the end of the stream,
TPOT = (E2E - TTFT) / (tokens - 1) with tokens = the usage chunk's completion_tokens (the
definition of vLLM's benchmark_serving). Per run: output tok/s = output tokens / wall time
(first send to last end), total tok/s = (prompt + output tokens) / wall time, TTFT, TPOT and
E2E p50/p99, failed requests; from GET /metrics, polled every --poll-s during the run: mean
running batch (comet_requests_running averaged over the samples while requests are in
flight), peak KV pages used, peak waiting requests, preemptions during the run, and the last
value of every other comet_* gauge; with nvidia-smi present, the GPU's peak memory used.

Output: one Markdown row per run on stdout, one JSON object per run appended to --json (the
fields bench/llamacpp_rows.py and `comet bench --throughput` share: engine, mode, model,
variant, input_len, output_len, concurrency, requests, output_tok_s, total_tok_s,
ttft_p50_ms, ttft_p99_ms, tpot_p50_ms, tpot_p99_ms, mean_batch, device_used_peak, wall_s,
preemptions, status, ..., and the server's kv_pool_tokens and weights_gib when it logs
them). A run in which a request fails gets status "failed N of M" and
its figures over the requests that finished. --deadline-s stops starting runs once that many
seconds have passed since the start (the GPU call's time guard); runs skipped so are printed.

bench/serve_sweep.py (the `openai` client, chat requests with text prompts, CPU) stays for
the chat route; this script is the throughput benchmark (issue 43).

Usage:
  python3 bench/serve_load.py --comet build-gpu/comet \
      --serve="--synthetic llama3-8b --device cuda --max-seqs 256" \
      --lengths 128/128,1000/1000 --concurrency 1,16,64,256 --json out.jsonl --tag model=llama3-8b
  python3 bench/serve_load.py --url http://127.0.0.1:8000 --lengths 32/16 --concurrency 4 \
      --rates inf,2,8 --requests 16
"""
import argparse
import datetime
import http.client
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import tempfile
import time
import urllib.parse


def pct(xs, p):
    """The p-th percentile of xs with linear interpolation (numpy's default); None if empty."""
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class Server:
    """Where requests go: host, port, model id, an optional API key."""

    def __init__(self, host, port, model, api_key=None, timeout=3600):
        self.host, self.port, self.model, self.api_key = host, port, model, api_key
        self.timeout = timeout

    def conn(self):
        return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)

    def headers(self):
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = "Bearer " + self.api_key
        return h

    def get(self, path):
        c = self.conn()
        try:
            c.request("GET", path, headers=self.headers())
            r = c.getresponse()
            body = r.read().decode("utf-8", "replace")
            return r.status, body
        finally:
            c.close()


def one_request(srv, prompt, max_tokens, res):
    """Stream one completion; fill res with t0, ttft, e2e, tokens (completion_tokens),
    prompt_tokens, or error."""
    body = json.dumps({"model": srv.model, "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}})
    t0 = time.perf_counter()
    res["t0"] = t0
    first = None
    usage = None
    try:
        c = srv.conn()
        c.request("POST", "/v1/completions", body=body, headers=srv.headers())
        r = c.getresponse()
        if r.status != 200:
            res["error"] = "HTTP %d: %s" % (r.status, r.read(300).decode("utf-8", "replace"))
            c.close()
            return
        while True:
            line = r.readline()
            if not line:
                break
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                break
            # parse only what is needed (the client must keep up with thousands of tokens a
            # second): chunks until the first text, the usage chunk, errors
            if first is not None and b'"usage":{' not in data and b'"usage": {' not in data \
                    and b'"error"' not in data:
                continue
            ev = json.loads(data)
            if "error" in ev:
                res["error"] = "stream error: %s" % json.dumps(ev["error"])[:300]
                break
            if ev.get("usage"):
                usage = ev["usage"]
            for ch in ev.get("choices") or []:
                if ch.get("text") and first is None:
                    first = time.perf_counter()
        c.close()
    except (OSError, http.client.HTTPException, ValueError) as e:
        res["error"] = repr(e)
        return
    t1 = time.perf_counter()
    res["e2e"] = t1 - t0
    res["t1"] = t1
    res["ttft"] = (first - t0) if first is not None else None
    if "error" in res:
        return
    if usage is None:
        res["error"] = "no usage chunk in the stream"
        return
    res["tokens"] = usage.get("completion_tokens", 0)
    res["prompt_tokens"] = usage.get("prompt_tokens", 0)
    if res["tokens"] != max_tokens:
        res["error"] = "generated %d tokens, not max_tokens %d" % (res["tokens"], max_tokens)


def parse_metrics(text):
    """Prometheus text -> {name{labels}: value} of the comet_* samples (histograms left out)."""
    out = {}
    for line in text.splitlines():
        if not line.startswith("comet_"):
            continue
        parts = line.rsplit(" ", 1)
        if len(parts) != 2:
            continue
        name = parts[0]
        if name.split("{")[0].endswith(("_bucket", "_sum", "_count")):
            continue
        try:
            out[name] = float(parts[1])
        except ValueError:
            pass
    return out


class Poller(threading.Thread):
    """Samples GET /metrics (and nvidia-smi's memory.used, if present) until stopped."""

    def __init__(self, srv, period, in_flight):
        super().__init__(daemon=True)
        self.srv, self.period, self.in_flight = srv, period, in_flight
        self.stop_ev = threading.Event()
        self.samples = []          # metrics dicts taken while requests were in flight
        self.first = self.last = None
        self.gpu_peak_mib = None
        self.smi = shutil.which("nvidia-smi")

    def sample(self):
        try:
            st, body = self.srv.get("/metrics")
            return parse_metrics(body) if st == 200 else None
        except (OSError, http.client.HTTPException):
            return None

    def gpu_used(self):
        if not self.smi:
            return
        try:
            out = subprocess.run([self.smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                  "-i", os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]],
                                 capture_output=True, text=True, timeout=10).stdout
            v = float(out.strip().splitlines()[0])
            self.gpu_peak_mib = v if self.gpu_peak_mib is None else max(self.gpu_peak_mib, v)
        except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
            pass

    def run(self):
        self.first = self.sample()
        n = 0
        while not self.stop_ev.wait(self.period):
            m = self.sample()
            if m is not None:
                self.last = m
                if self.in_flight():
                    self.samples.append(m)
            if n % max(1, int(1.0 / self.period)) == 0:
                self.gpu_used()
            n += 1

    def finish(self):
        self.stop_ev.set()
        self.join(timeout=30)
        self.last = self.sample() or self.last
        self.gpu_used()


def run_one(srv, input_len, output_len, conc, rate, n_req, args, seed):
    """One workload; returns the per-run figures (a dict)."""
    lo, hi = args.token_lo, args.token_hi
    prompts = []
    for i in range(n_req):
        rng = random.Random(seed * 1000003 + i)
        prompts.append([rng.randrange(lo, hi) for _ in range(input_len)])
    arrive = random.Random(seed)
    results = [dict() for _ in range(n_req)]
    sem = threading.Semaphore(conc)
    active = [0]
    lock = threading.Lock()

    def worker(i):
        try:
            with lock:
                active[0] += 1
            one_request(srv, prompts[i], output_len, results[i])
        finally:
            with lock:
                active[0] -= 1
            sem.release()

    poller = Poller(srv, args.poll_s, lambda: active[0] > 0)
    poller.start()
    threads = []
    t_start = time.perf_counter()
    t_next = t_start
    for i in range(n_req):
        if rate != float("inf"):
            now = time.perf_counter()
            if t_next > now:
                time.sleep(t_next - now)
            t_next += arrive.expovariate(rate)
        sem.acquire()
        th = threading.Thread(target=worker, args=(i,), daemon=True)
        th.start()
        threads.append(th)
    for th in threads:
        th.join(timeout=args.request_timeout_s)
    wall = time.perf_counter() - t_start
    poller.finish()

    ok = [r for r in results if "error" not in r and "e2e" in r]
    errors = [r.get("error", "no answer") for r in results if r not in ok]
    out_tok = sum(r["tokens"] for r in ok)
    in_tok = sum(r["prompt_tokens"] for r in ok)
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    tpot = [(r["e2e"] - r["ttft"]) / (r["tokens"] - 1) for r in ok
            if r["ttft"] is not None and r["tokens"] > 1]
    e2e = [r["e2e"] for r in ok]
    running = [s.get("comet_requests_running") for s in poller.samples
               if s.get("comet_requests_running") is not None]
    pages = [s.get("comet_kv_pages_used") for s in poller.samples
             if s.get("comet_kv_pages_used") is not None]
    waiting = [s.get("comet_requests_waiting") for s in poller.samples
               if s.get("comet_requests_waiting") is not None]

    def delta(name):
        if poller.first and poller.last and name in poller.first and name in poller.last:
            return poller.last[name] - poller.first[name]
        return None

    ms = lambda v: None if v is None else 1e3 * v  # noqa: E731
    gauges = {k: v for k, v in (poller.last or {}).items()
              if "{" not in k and not k.endswith("_total")}
    row = {
        "engine": "comet", "mode": "online", "status": "ok" if not errors else
        "failed %d of %d" % (len(errors), n_req),
        "input_len": input_len, "output_len": output_len, "concurrency": conc,
        "rate": "inf" if rate == float("inf") else rate, "requests": n_req,
        "completed": len(ok), "output_tokens": out_tok, "prompt_tokens": in_tok,
        "wall_s": wall, "output_tok_s": out_tok / wall if wall > 0 else None,
        "total_tok_s": (out_tok + in_tok) / wall if wall > 0 else None,
        "req_s": len(ok) / wall if wall > 0 else None,
        "ttft_p50_ms": ms(pct(ttft, 50)), "ttft_p99_ms": ms(pct(ttft, 99)),
        "tpot_p50_ms": ms(pct(tpot, 50)), "tpot_p99_ms": ms(pct(tpot, 99)),
        "e2e_p50_ms": ms(pct(e2e, 50)), "e2e_p99_ms": ms(pct(e2e, 99)),
        "mean_batch": sum(running) / len(running) if running else None,
        "kv_pages_peak": max(pages) if pages else None,
        "waiting_peak": max(waiting) if waiting else None,
        "preemptions": delta("comet_preemptions_total"),
        "device_used_peak": int(poller.gpu_peak_mib * 1048576) if poller.gpu_peak_mib else None,
        "metric_samples": len(poller.samples), "gauges": gauges,
    }
    if errors:
        row["first_error"] = errors[0][:300]
    return row


PAGE_SIZE = 16  # tokens a KV page holds (docs/serving.md), when the server does not log it
MEM_RE = re.compile(r"memory: weights ([\d.]+) GiB, workspace ([\d.]+) GiB, KV pool ([\d.]+) GiB "
                    r"\((\d+) pages of (\d+) = (\d+) tokens\); ([\d.]+) of ([\d.]+) GiB")
MEM_HOST_RE = re.compile(r"memory: workspace ([\d.]+) GiB, KV pool ([\d.]+) GiB "
                         r"\((\d+) pages of (\d+) = (\d+) tokens\)")


def server_memory(log_path):
    """What `comet serve` logged at start about its memory plan: {kv_pool_tokens, page_size,
    weights_gib, workspace_gib, kv_pool_gib, device_used_gib, device_total_gib}; {} if none."""
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return {}
    m = MEM_RE.search(text)
    if m:
        return {"weights_gib": float(m.group(1)), "workspace_gib": float(m.group(2)),
                "kv_pool_gib": float(m.group(3)), "page_size": int(m.group(5)),
                "kv_pool_tokens": int(m.group(6)), "device_used_gib": float(m.group(7)),
                "device_total_gib": float(m.group(8))}
    m = MEM_HOST_RE.search(text)
    if m:
        return {"workspace_gib": float(m.group(1)), "kv_pool_gib": float(m.group(2)),
                "page_size": int(m.group(4)), "kv_pool_tokens": int(m.group(5))}
    return {}


def start_server(args):
    """Start `comet serve`; returns (Popen, host, port, the command line as run). Its stderr
    goes to args.serve_log."""
    cmd = [args.comet, "serve"] + shlex.split(args.serve)
    if "--port" not in cmd:
        cmd += ["--port", "0"]
    if "--host" not in cmd:
        cmd += ["--host", "127.0.0.1"]
    log = open(args.serve_log, "ab")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    log.close()
    seen = []
    deadline = time.time() + args.start_timeout_s
    m = None
    while time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            if p.poll() is not None:
                break
            continue
        seen.append(line.rstrip())
        m = re.match(r"listening on (\S+):(\d+)", line)
        if m:
            break
    if not m:
        p.kill()
        sys.exit("serve_load.py: `%s` did not print 'listening on HOST:PORT' within %d s "
                 "(exit %s); its stdout: %s%s" % (
                     " ".join(cmd), args.start_timeout_s, p.poll(), " | ".join(seen[-5:]),
                     "; stderr in " + args.serve_log))
    # keep draining stdout so the server never blocks on a full pipe
    threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()
    host = m.group(1)
    if host in ("0.0.0.0", "::", "[::]"):
        host = "127.0.0.1"
    return p, host, int(m.group(2)), cmd


def stop_server(p, grace_s):
    """SIGTERM, then SIGKILL after grace_s seconds (the server drains requests in flight)."""
    if p.poll() is not None:
        return
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


class Terminated(Exception):
    """SIGTERM (the GPU call's time guard, `timeout`) reached this script."""


def on_sigterm(signum, frame):
    raise Terminated()


def parse_list(s, what, conv):
    out = []
    for x in s.split(","):
        x = x.strip()
        try:
            v = conv(x)
        except ValueError:
            raise SystemExit("serve_load.py: bad %s %r in %r" % (what, x, s))
        out.append(v)
    if not out:
        raise SystemExit("serve_load.py: empty %s list" % what)
    return out


def length_pair(x):
    m = re.fullmatch(r"(\d+)/(\d+)", x)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise ValueError(x)
    return int(m.group(1)), int(m.group(2))


def rate_value(x):
    if x in ("inf", "all"):
        return float("inf")
    v = float(x)
    if not v > 0:
        raise ValueError(x)
    return v


def positive_int(x):
    v = int(x)
    if v < 1:
        raise ValueError(x)
    return v


def fmt(v, nd=1):
    if v is None:
        return "-"
    return "{:,.{}f}".format(v, nd) if isinstance(v, float) else str(v)


def resolve_concurrency(concs, il, ol, mem, cap):
    """The concurrency list of one length: "max" becomes the most sequences of il + ol tokens
    (whole pages each) the server's KV pool holds (kv_pool_tokens: logged at its start, else
    its pages in /metrics), at most cap; None when unknown."""
    out = []
    for c in concs:
        if c == "max":
            if not mem.get("kv_pool_tokens"):
                out.append(None)
                continue
            page = mem.get("page_size", PAGE_SIZE)
            seq_pages = (il + ol + page - 1) // page
            c = max(1, min(cap, mem["kv_pool_tokens"] // page // seq_pages))
        if c not in out:
            out.append(c)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--url", help="a running server, http://HOST:PORT")
    g.add_argument("--serve", help="arguments of `comet serve` (one string; write --serve=ARGS) "
                   "to start one; --synthetic NAME [--fp16] tags the rows' model and variant")
    ap.add_argument("--comet", default="build/comet", help="the comet binary (with --serve)")
    ap.add_argument("--serve-log", help="append the server's stderr to this file (default: a "
                    "temporary file, removed at the end)")
    ap.add_argument("--start-timeout-s", type=int, default=600)
    ap.add_argument("--api-key", default=os.environ.get("COMET_API_KEY"))
    ap.add_argument("--model-id", help="the request's model field (default: GET /v1/models)")
    ap.add_argument("--lengths", default="128/128", help="input/output lengths, comma-separated")
    ap.add_argument("--concurrency", default="1",
                    help="requests in flight at most, comma-separated; max: the most sequences "
                         "of the length the server's KV pool holds (from its start log), at "
                         "most --max-concurrency")
    ap.add_argument("--max-concurrency", type=int, default=1024,
                    help="the cap of 'max' (default 1024, comet's --max-seqs limit)")
    ap.add_argument("--rates", default="inf", help="requests/s (Poisson) or inf (all at once)")
    ap.add_argument("--requests", type=int, default=0, help="requests a run (default max(C, --min-requests))")
    ap.add_argument("--min-requests", type=int, default=4)
    ap.add_argument("--token-range", default="100:30000",
                    help="prompt token ids are uniform in [LO, HI) (default 100:30000: no special "
                         "tokens of LLaMA-3 or SmolLM2)")
    ap.add_argument("--warmup", type=int, default=1, help="short requests before the runs")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--poll-s", type=float, default=0.25, help="/metrics sampling period")
    ap.add_argument("--request-timeout-s", type=int, default=3600)
    ap.add_argument("--deadline-s", type=float, default=0,
                    help="start no run after this many seconds from the start (0: no limit)")
    ap.add_argument("--json", help="append one JSON object a run to this file")
    ap.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE",
                    help="a field added to every JSON row (model=..., variant=..., gpu=...)")
    args = ap.parse_args()
    t_begin = time.time()

    lengths = parse_list(args.lengths, "length (I/O)", length_pair)
    concs = parse_list(args.concurrency, "concurrency",
                       lambda x: "max" if x == "max" else positive_int(x))
    rates = parse_list(args.rates, "rate", rate_value)
    if args.requests < 0 or args.min_requests < 1 or args.max_concurrency < 1:
        ap.error("--requests must be >= 0, --min-requests and --max-concurrency >= 1")
    m = re.fullmatch(r"(\d+):(\d+)", args.token_range)
    if not m or int(m.group(1)) >= int(m.group(2)):
        ap.error("--token-range wants LO:HI with LO < HI, got %r" % args.token_range)
    args.token_lo, args.token_hi = int(m.group(1)), int(m.group(2))
    if args.poll_s <= 0:
        ap.error("--poll-s must be positive")
    tags = {}
    for t in args.tag:
        if "=" not in t:
            ap.error("--tag wants KEY=VALUE, got %r" % t)
        k, v = t.split("=", 1)
        tags[k] = v
    if args.json:  # refused now, not after the first run's minutes
        try:
            open(args.json, "a", encoding="utf-8").close()
        except OSError as e:
            ap.error("cannot append to --json %s: %s" % (args.json, e.strerror))
    if args.serve:  # what a --synthetic server runs, unless tagged otherwise
        sv = shlex.split(args.serve)
        if "--synthetic" in sv and sv.index("--synthetic") + 1 < len(sv):
            tags.setdefault("model", sv[sv.index("--synthetic") + 1])
            tags.setdefault("variant", "FP16" if "--fp16" in sv else "W4AxKV4")

    proc = None
    server_cmd = None
    tmp_log = None
    if args.url:
        u = urllib.parse.urlparse(args.url if "//" in args.url else "http://" + args.url)
        if not u.hostname:
            ap.error("--url wants http://HOST:PORT, got %r" % args.url)
        host, port = u.hostname, u.port or 80
    else:
        if not os.path.exists(args.comet):
            ap.error("--comet %s does not exist (build comet first)" % args.comet)
        if not args.serve_log:
            fd, tmp_log = tempfile.mkstemp(prefix="serve_load-", suffix=".log")
            os.close(fd)
            args.serve_log = tmp_log
    rows = []
    # a SIGTERM (from `timeout`) unwinds through the finally below, so the server it started
    # never outlives this script holding the GPU's memory
    signal.signal(signal.SIGTERM, on_sigterm)
    grace_s = 60
    try:
        if not args.url:
            proc, host, port, server_cmd = start_server(args)
        srv = Server(host, port, args.model_id, args.api_key)
        mem = server_memory(args.serve_log) if proc else {}
        try:  # the first contact: a server that is not there is one line, not a traceback
            st, body = srv.get("/health")
        except (OSError, http.client.HTTPException) as e:
            raise SystemExit("serve_load.py: cannot reach the server at %s:%s: %s"
                             % (host, port, e))
        if st != 200:
            raise SystemExit("serve_load.py: GET /health at %s:%s answered %d: %s"
                             % (host, port, st, body[:200]))
        if srv.model is None:
            st, body = srv.get("/v1/models")
            if st != 200:
                raise SystemExit("serve_load.py: GET /v1/models answered %d: %s" % (st, body[:200]))
            srv.model = json.loads(body)["data"][0]["id"]
        for i in range(args.warmup):
            res = {}
            one_request(srv, [args.token_lo + i] * 8, 4, res)
            if "error" in res:
                raise SystemExit("serve_load.py: the warm-up request failed: %s" % res["error"])
        if not mem.get("kv_pool_tokens"):  # a server that logs no plan: its pool from /metrics
            st, body = srv.get("/metrics")
            g = parse_metrics(body) if st == 200 else {}
            if "comet_kv_pages_used" in g and "comet_kv_pages_free" in g:
                mem["page_size"] = mem.get("page_size", PAGE_SIZE)
                mem["kv_pool_tokens"] = int(g["comet_kv_pages_used"] + g["comet_kv_pages_free"]) \
                    * mem["page_size"]
        if mem:
            print("server memory plan: %s" % json.dumps(mem, sort_keys=True))
        print("| engine | model | I/O | C | rate | N | out tok/s | total tok/s | TTFT p50/p99 ms "
              "| TPOT p50/p99 ms | mean batch | preempt | status |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        sys.stdout.flush()
        run_i = 0
        for (il, ol) in lengths:
            for c in resolve_concurrency(concs, il, ol, mem, args.max_concurrency):
                for r in rates:
                    run_i += 1
                    base = {"engine": "comet", "mode": "online", "input_len": il,
                            "output_len": ol, "concurrency": c if c else "max",
                            "rate": "inf" if r == float("inf") else r}
                    if c is None:
                        row = dict(base, status="max unknown: the server logged no KV pool size")
                        n = 0
                    else:
                        n = args.requests or max(c, args.min_requests)
                        if args.deadline_s and time.time() - t_begin > args.deadline_s:
                            row = dict(base, requests=n, status="skipped: time budget")
                        else:
                            row = run_one(srv, il, ol, c, r, n, args, args.seed + run_i)
                    for k in ("kv_pool_tokens", "weights_gib", "device_total_gib"):
                        if k in mem:
                            row.setdefault(k, mem[k])
                    row.update(tags)
                    row.setdefault("date", datetime.datetime.now(datetime.timezone.utc)
                                   .strftime("%Y-%m-%dT%H:%M:%SZ"))
                    row["server"] = (" ".join(["comet"] + server_cmd[1:]) if server_cmd
                                     else args.url)
                    row["command"] = "python3 bench/serve_load.py " + " ".join(
                        shlex.quote(a) for a in sys.argv[1:])
                    rows.append(row)
                    if args.json:
                        with open(args.json, "a", encoding="utf-8") as f:
                            f.write(json.dumps(row, sort_keys=True) + "\n")
                    print("| comet %s online | %s | %d/%d | %s | %s | %d | %s | %s | %s/%s | %s/%s "
                          "| %s | %s | %s |" % (
                              row.get("variant", ""), row.get("model", srv.model), il, ol,
                              row["concurrency"], row["rate"], n, fmt(row.get("output_tok_s")),
                              fmt(row.get("total_tok_s")), fmt(row.get("ttft_p50_ms")),
                              fmt(row.get("ttft_p99_ms")), fmt(row.get("tpot_p50_ms"), 2),
                              fmt(row.get("tpot_p99_ms"), 2), fmt(row.get("mean_batch")),
                              fmt(row.get("preemptions"), 0), row["status"]))
                    sys.stdout.flush()
    except Terminated:
        grace_s = 5
        print("serve_load.py: terminated; %d run(s) written" % len(rows), file=sys.stderr)
        raise SystemExit(143)
    finally:
        if proc:
            stop_server(proc, grace_s)
        if tmp_log:
            os.unlink(tmp_log)
    bad = [r for r in rows if r["status"].startswith("failed")]
    if bad:
        print("serve_load.py: %d run(s) had failed requests; first: %s" % (
            len(bad), bad[0].get("first_error")), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
