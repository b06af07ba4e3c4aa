#!/usr/bin/env python3
"""test_bench_serving.py - the serving-benchmark scripts of bench/ on a CPU machine.

Checks, each against values it did not compute itself:
  * bench/llamacpp_rows.py on outputs captured from llama.cpp's tools
    (tests/fixtures/llamacpp/: llama-batched-bench's Markdown table and JSONL, llama-bench's
    JSON): the printed figures, output tok/s = B*TG/T, the fields every row shares, and a
    clear refusal of an output without rows or with a changed table;
  * bench/serve_load.py against `comet serve` with the default model and token-id prompts:
    every request generates exactly max_tokens tokens (ignore_eos), the usage counts match
    the requests sent, TTFT <= E2E, the mean running batch stays within the concurrency, a
    Poisson-rate run, and a run whose prompts are out of the vocabulary reported as failed
    (exit 1) with the server's 400;
  * serve_load.py and serving_gpu.sh refusing bad arguments and a server that is not there
    with one line each;
  * bench/plot_serving.py --md on those rows (the PNG only when matplotlib is importable);
  * bench/make_q4_0_gguf.py (only when numpy and the gguf package, or llama.cpp's gguf-py
    on GGUF_PY, are importable): a tiny model read back with the gguf package's own reader:
    tensor types and shapes, the vocabulary, and the Q4_0 scales' magnitude.
Needs COMET_BIN and COMET_SOURCE_DIR (set by CTest). A part whose optional dependency is
missing is reported as skipped, not passed.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SRC = os.path.abspath(os.environ.get("COMET_SOURCE_DIR", "."))
BIN = os.environ.get("COMET_BIN", os.path.join(SRC, "build", "comet"))
MODEL = os.path.join(SRC, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
FIX = os.path.join(SRC, "tests", "fixtures", "llamacpp")
BENCH = os.path.join(SRC, "bench")


def run(args, **kw):
    return subprocess.run([sys.executable] + args, capture_output=True, text=True, timeout=600,
                          **kw)


def read_rows(path):
    with open(path) as f:
        return [json.loads(x) for x in f if x.strip()]


class LlamacppRows(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.out = os.path.join(self.tmp, "rows.jsonl")

    def test_batched_markdown(self):
        p = run([os.path.join(BENCH, "llamacpp_rows.py"), "batched",
                 os.path.join(FIX, "batched-bench.md"), "--json", self.out,
                 "--tag", "model=tiny", "--tag", "gpu=none"])
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = read_rows(self.out)
        self.assertEqual([r["concurrency"] for r in rows], [1, 4, 8])
        r = rows[1]  # |    16 |     16 |    4 |    128 |    0.108 |   590.30 |    0.601 |   106.52 |    0.709 |   180.47 |
        self.assertEqual((r["input_len"], r["output_len"], r["n_kv"]), (16, 16, 128))
        self.assertAlmostEqual(r["tg_tok_s"], 106.52)
        self.assertAlmostEqual(r["pp_tok_s"], 590.30)
        self.assertAlmostEqual(r["total_tok_s"], 180.47)
        self.assertAlmostEqual(r["output_tok_s"], 4 * 16 / 0.709)
        self.assertAlmostEqual(r["ttft_p50_ms"], 108.0)
        self.assertAlmostEqual(r["tpot_p50_ms"], 601.0 / 16)
        self.assertEqual((r["engine"], r["mode"], r["model"], r["gpu"], r["status"]),
                         ("llama.cpp", "batched", "tiny", "none", "ok"))
        self.assertIn("| 16/16 | 4 |", p.stdout)

    def test_batched_jsonl(self):
        p = run([os.path.join(BENCH, "llamacpp_rows.py"), "batched",
                 os.path.join(FIX, "batched-bench.jsonl"), "--json", self.out])
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = read_rows(self.out)
        self.assertEqual([r["concurrency"] for r in rows], [1, 4, 8])
        self.assertAlmostEqual(rows[2]["tg_tok_s"], 175.975983)
        self.assertAlmostEqual(rows[2]["output_tok_s"], 8 * 16 / 0.932676)

    def test_llama_bench(self):
        p = run([os.path.join(BENCH, "llamacpp_rows.py"), "bench",
                 os.path.join(FIX, "llama-bench.json"), "--json", self.out])
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = read_rows(self.out)
        self.assertEqual([r["test"] for r in rows], ["pp16", "tg16"])
        self.assertAlmostEqual(rows[0]["tok_s"], 779.520858)
        self.assertEqual(rows[0]["reps"], 2)

    def test_refusals(self):
        empty = os.path.join(self.tmp, "empty.txt")
        with open(empty, "w") as f:
            f.write("main: error: failed to load model\n")
        p = run([os.path.join(BENCH, "llamacpp_rows.py"), "batched", empty])
        self.assertEqual(p.returncode, 1)
        self.assertIn("no result rows", p.stderr)
        changed = os.path.join(self.tmp, "changed.md")
        with open(changed, "w") as f:
            f.write("|    PP |     TG |    B |   N_KV | X |\n|---|---|---|---|---|\n| 1 | 2 | 3 | 4 | 5 |\n")
        p = run([os.path.join(BENCH, "llamacpp_rows.py"), "batched", changed])
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("unexpected columns", p.stderr)
        p = run([os.path.join(BENCH, "llamacpp_rows.py"), "batched", empty, "--tag", "nokey"])
        self.assertEqual(p.returncode, 2)


class ServeLoadUnits(unittest.TestCase):
    def setUp(self):
        sys.path.insert(0, BENCH)
        import serve_load
        self.sl = serve_load

    def test_memory_log(self):
        # the line `comet serve --device cuda` logs at start (cmd_serve.c log_memory)
        f = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False)
        f.write("comet: loading\nmemory: weights 4.51 GiB, workspace 1.20 GiB, KV pool 110.00 GiB "
                "(52000 pages of 16 = 832000 tokens); 120.50 of 139.80 GiB on the GPU in use\n")
        f.close()
        m = self.sl.server_memory(f.name)
        self.assertEqual((m["kv_pool_tokens"], m["page_size"], m["weights_gib"],
                          m["device_total_gib"]), (832000, 16, 4.51, 139.8))
        with open(f.name, "w") as g:
            g.write("listening on 127.0.0.1:8000\n")
        self.assertEqual(self.sl.server_memory(f.name), {})
        os.unlink(f.name)

    def test_max_concurrency(self):
        rc = self.sl.resolve_concurrency
        # 20 pages of 16; a 24-token sequence takes 2 pages: 10 at once
        self.assertEqual(rc([1, "max", 1], 16, 8, {"kv_pool_tokens": 320}, 1024), [1, 10])
        self.assertEqual(rc(["max"], 1000, 1000, {"kv_pool_tokens": 10 ** 7}, 1024), [1024])
        self.assertEqual(rc(["max"], 1000, 1000, {"kv_pool_tokens": 1000 * 1000}, 1024), [500])
        self.assertEqual(rc(["max"], 8, 8, {}, 1024), [None])

    def test_percentile(self):
        self.assertEqual(self.sl.pct([4, 1, 3, 2], 50), 2.5)
        self.assertAlmostEqual(self.sl.pct(list(range(101)), 99), 99.0)
        self.assertIsNone(self.sl.pct([], 50))


class ServeLoad(unittest.TestCase):
    serve = "--model %s --threads 2 --max-seqs 4 --kv-pages 128 --max-batch-tokens 64" % MODEL

    def setUp(self):
        if not os.path.exists(BIN) or not os.path.exists(MODEL):
            self.fail("needs %s and the default model %s" % (BIN, MODEL))
        self.tmp = tempfile.mkdtemp()
        self.out = os.path.join(self.tmp, "rows.jsonl")

    def test_grid_and_plot(self):
        p = run([os.path.join(BENCH, "serve_load.py"), "--comet", BIN, "--serve=" + self.serve,
                 "--lengths", "12/6,20/3", "--concurrency", "1,3", "--min-requests", "3",
                 "--json", self.out, "--tag", "model=smol", "--tag", "variant=Q4_1"])
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        rows = read_rows(self.out)
        self.assertEqual([(r["input_len"], r["output_len"], r["concurrency"]) for r in rows],
                         [(12, 6, 1), (12, 6, 3), (20, 3, 1), (20, 3, 3)])
        for r in rows:
            self.assertEqual(r["status"], "ok")
            self.assertEqual(r["requests"], 3)
            self.assertEqual(r["completed"], 3)
            self.assertEqual(r["output_tokens"], 3 * r["output_len"])
            self.assertEqual(r["prompt_tokens"], 3 * r["input_len"])
            self.assertLessEqual(r["ttft_p50_ms"], r["e2e_p50_ms"])
            self.assertGreater(r["output_tok_s"], 0)
            self.assertAlmostEqual(r["output_tok_s"] * r["wall_s"], r["output_tokens"], places=6)
            self.assertGreater(r["tpot_p50_ms"], 0)
            if r["mean_batch"] is not None:
                self.assertLessEqual(r["mean_batch"], r["concurrency"])
            self.assertEqual(r["preemptions"], 0)
            self.assertEqual((r["engine"], r["mode"], r["model"]), ("comet", "online", "smol"))
        md = os.path.join(self.tmp, "t.md")
        p = run([os.path.join(BENCH, "plot_serving.py"), self.out, "--md", md, "--title", "t",
                 "--meta", "GPU: none"])
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(md) as f:
            text = f.read()
        self.assertIn("- GPU: none", text)
        self.assertEqual(text.count("| comet Q4_1 | online | smol |"), 4)
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("test_bench_serving: matplotlib missing: the PNG is not tested", file=sys.stderr)
            return
        png = os.path.join(self.tmp, "t.png")
        p = run([os.path.join(BENCH, "plot_serving.py"), self.out, "--png", png])
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(png, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def test_rate_and_failure(self):
        p = run([os.path.join(BENCH, "serve_load.py"), "--comet", BIN, "--serve=" + self.serve,
                 "--lengths", "8/4", "--concurrency", "4", "--rates", "20", "--requests", "5",
                 "--warmup", "0", "--json", self.out])
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        r = read_rows(self.out)[0]
        self.assertEqual((r["rate"], r["completed"], r["output_tokens"]), (20.0, 5, 20))
        # SmolLM2's vocabulary has 49152 tokens: ids from 60000 on are refused
        p = run([os.path.join(BENCH, "serve_load.py"), "--comet", BIN, "--serve=" + self.serve,
                 "--lengths", "8/4", "--concurrency", "2", "--token-range", "60000:70000",
                 "--warmup", "0", "--json", self.out])
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        r = read_rows(self.out)[-1]
        self.assertEqual(r["status"], "failed 4 of 4")
        self.assertIn("HTTP 400", r["first_error"])

    def test_bad_arguments(self):
        for args, msg in ((["--lengths", "8/x"], "bad length"),
                          (["--rates", "0"], "bad rate"),
                          (["--concurrency", "0"], "bad concurrency"),
                          (["--token-range", "9:3"], "--token-range")):
            p = run([os.path.join(BENCH, "serve_load.py"), "--url", "http://127.0.0.1:9"] + args)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn(msg, p.stderr)

    def test_no_server(self):
        # nothing listens on port 9 (discard) here: one line naming the address, no traceback
        p = run([os.path.join(BENCH, "serve_load.py"), "--url", "http://127.0.0.1:9",
                 "--model-id", "x", "--warmup", "0"])
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        self.assertEqual(p.stderr.count("\n"), 1, p.stderr)
        self.assertIn("cannot reach the server at 127.0.0.1:9", p.stderr)
        p = run([os.path.join(BENCH, "serve_load.py"), "--url", "http://127.0.0.1:9",
                 "--json", os.path.join(self.tmp, "no", "dir", "rows.jsonl")])
        self.assertEqual(p.returncode, 2, p.stderr)
        self.assertIn("cannot append to --json", p.stderr)


class ServingGpuArgs(unittest.TestCase):
    """bench/serving_gpu.sh refuses bad arguments by name before it builds or runs
    anything (OUT points at a folder that must stay uncreated)."""

    def test_bad_arguments(self):
        out = os.path.join(tempfile.mkdtemp(), "gpu-out")
        for args, msg in ((["--model"], "--model needs a value"),
                          (["--lengths", "8/4", "--rates"], "--rates needs a value"),
                          (["--model", "13b"], "--model wants 8b or 70b"),
                          (["--rates", "fast"], "bad rate 'fast'"),
                          (["--rates", "0"], "bad rate '0'"),
                          (["--concurrency", "1025"], "over comet's --max-seqs limit of 1024"),
                          (["--bogus"], "unknown argument '--bogus'")):
            p = subprocess.run(["bash", os.path.join(BENCH, "serving_gpu.sh")] + args,
                               capture_output=True, text=True, timeout=60,
                               env=dict(os.environ, OUT=out))
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertEqual(p.stderr.count("\n"), 1, p.stderr)
            self.assertIn(msg, p.stderr)
            self.assertNotIn("FAILED in step", p.stderr)
            self.assertFalse(os.path.exists(out))


def gguf_python():
    """A python command that imports numpy and gguf, with its PYTHONPATH; or None."""
    paths = [os.environ.get("GGUF_PY", ""),
             os.path.expanduser("~/.cache/comet-llamacpp/0.3.36/src/gguf-py")]
    for py in (os.environ.get("COMET_NUMPY_PYTHON"), sys.executable):
        if not py:
            continue
        for pp in [""] + [p for p in paths if p and os.path.isdir(p)]:
            env = dict(os.environ, PYTHONPATH=pp)
            if subprocess.run([py, "-c", "import numpy, gguf"], env=env,
                              capture_output=True).returncode == 0:
                return py, env
    return None


class MakeGguf(unittest.TestCase):
    def test_tiny(self):
        found = gguf_python()
        if not found:
            self.skipTest("numpy or gguf missing (set COMET_NUMPY_PYTHON / GGUF_PY)")
        py, env = found
        tmp = tempfile.mkdtemp()
        f = os.path.join(tmp, "tiny.gguf")
        p = subprocess.run([py, os.path.join(BENCH, "make_q4_0_gguf.py"), "--preset", "tiny",
                            "-o", f, "--chunk-mb", "1"], env=env, capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        p = subprocess.run([py, os.path.join(BENCH, "make_q4_0_gguf.py"), "--preset", "tiny",
                            "-o", f], env=env, capture_output=True, text=True)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("exists", p.stderr)
        check = r'''
import sys, numpy as np, gguf
r = gguf.GGUFReader(sys.argv[1])
t = {x.name: x for x in r.tensors}
def kv(k):
    f = r.fields[k]
    return f.parts[f.data[0]]
out = {
  "n_tensors": len(t),
  "types": {n: t[n].tensor_type.name for n in ("token_embd.weight", "output.weight",
            "blk.0.attn_q.weight", "blk.1.ffn_down.weight", "blk.0.attn_norm.weight")},
  "shape_k": [int(x) for x in t["blk.0.attn_k.weight"].shape],
  "shape_down": [int(x) for x in t["blk.1.ffn_down.weight"].shape],
  "n_tokens": len(r.fields["tokenizer.ggml.tokens"].data),
  "model": bytes(kv("tokenizer.ggml.model")).decode(),
  "pre": bytes(kv("tokenizer.ggml.pre")).decode(),
  "heads_kv": int(kv("llama.attention.head_count_kv")[0]),
  "eos": int(kv("tokenizer.ggml.eos_token_id")[0]),
}
q = t["blk.0.attn_q.weight"].data.reshape(-1, 18)
d = np.abs(q[:, :2].copy().view(np.float16).astype(np.float32))
out["q_scale_median"] = float(np.median(d))
print(__import__("json").dumps(out))
'''
        p = subprocess.run([py, "-c", check, f], env=env, capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        o = json.loads(p.stdout)
        self.assertEqual(o["n_tensors"], 2 + 2 * 9 + 2)
        self.assertEqual(o["types"], {"token_embd.weight": "Q4_0", "output.weight": "Q6_K",
                                      "blk.0.attn_q.weight": "Q4_0",
                                      "blk.1.ffn_down.weight": "Q4_0",
                                      "blk.0.attn_norm.weight": "F32"})
        self.assertEqual(o["shape_k"], [256, 128])     # ne: [n_embd, kv heads * head dim]
        self.assertEqual(o["shape_down"], [512, 256])  # ne: [n_ff, n_embd]
        self.assertEqual((o["n_tokens"], o["model"], o["pre"], o["heads_kv"], o["eos"]),
                         (128256, "gpt2", "llama-bpe", 1, 128009))
        # scale = 1 / (4.6 sqrt(256)) = 0.0136, times |1 + 0.25 N(0,1)|
        self.assertGreater(o["q_scale_median"], 0.008)
        self.assertLess(o["q_scale_median"], 0.02)


if __name__ == "__main__":
    unittest.main(verbosity=2)
