#!/usr/bin/env python3
"""test_serve_openai.py - `comet serve` driven by the official `openai` Python client.

Starts the server on 127.0.0.1 (a free port) with the default model and checks:
completion, chat, streaming chat with usage, logprobs (chat and completions, echo with
prompt logprobs, text_offset in characters on the whole and the streamed route) for
structure and content; the sampling parameters on both routes (tiny temperatures are greedy,
logit_bias bans and forces tokens and refuses bad maps, each penalty changes a greedy text)
(greedy output equal to `comet generate` for the
same prompt); 64 concurrent streams each equal to the same request alone; the bad-input list (malformed JSON, wrong types, negative/huge max_tokens,
invalid UTF-8, unknown model, missing messages, 10 MB body, prompt over the context, n=2,
wrong API key) each answered with the right status and error object while the server keeps
serving; a client that disconnects (mid-stream, or while waiting for a whole answer) is
cancelled and its KV pages freed; a full
queue answers 503 (a second, small server); SIGTERM lets a stream in flight finish, refuses
new connections and exits 0. Needs COMET_BIN and COMET_SOURCE_DIR (set by CTest) and `pip install
openai`. Every wait is bounded.
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

import openai

BIN = os.environ.get("COMET_BIN", "build/comet")
SRC = os.environ.get("COMET_SOURCE_DIR", ".")
MODEL = os.path.join(SRC, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
KEY = "test-key-123"
MODEL_ID = "smol"

server = None
port = None


def start_server():
    global server, port
    if not os.path.exists(MODEL):
        raise SystemExit(f"test_serve_openai: the default model is missing: {MODEL}")
    server = subprocess.Popen(
        [BIN, "serve", "--model", MODEL, "--model-id", MODEL_ID, "--host", "127.0.0.1",
         "--port", "0", "--api-key", KEY, "--max-seqs", "64", "--kv-pages", "256",
         "--max-batch-tokens", "256"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    deadline = time.time() + 120
    line = ""
    while time.time() < deadline:
        line = server.stdout.readline()
        if line.startswith("listening on") or server.poll() is not None:
            break
    m = re.match(r"listening on [^:]+:(\d+)", line)
    if not m:
        server.kill()
        raise SystemExit(f"test_serve_openai: the server did not start (got {line!r})")
    port = int(m.group(1))
    for _ in range(100):
        try:
            if raw("GET", "/health")[0] == 200:
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("test_serve_openai: /health never answered")


def raw(method, path, body=None, headers=None, auth=True, timeout=120):
    """One HTTP request on a fresh connection; returns (status, body bytes)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = {"Content-Type": "application/json"}
    if auth:
        h["Authorization"] = "Bearer " + KEY
    h.update(headers or {})
    if isinstance(body, str):
        body = body.encode()
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def generate(prompt, max_tokens, raw_prompt=False):
    """`comet generate` greedy output for the same prompt (the reference)."""
    args = [BIN, "generate", "--model", MODEL, "--prompt", prompt, "--max-tokens",
            str(max_tokens), "--temperature", "0"]
    if raw_prompt:
        args.append("--raw")
    out = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def metrics():
    st, body = raw("GET", "/metrics")
    assert st == 200
    vals = {}
    for ln in body.decode().splitlines():
        if ln and not ln.startswith("#"):
            name, _, v = ln.rpartition(" ")
            vals[name] = float(v)
    return vals


class ServeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY,
                                   max_retries=0, timeout=300)

    def error_of(self, status, body):
        obj = json.loads(body)
        err = obj["error"]
        for k in ("message", "type", "param", "code"):
            self.assertIn(k, err)
        self.assertTrue(err["message"])
        return err

    def assert_alive(self):
        self.assertEqual(raw("GET", "/health")[0], 200)

    # ---- structure and content ----

    def test_models(self):
        ids = [m.id for m in self.client.models.list().data]
        self.assertEqual(ids, [MODEL_ID])

    def test_completion_matches_generate(self):
        prompt = "The three primary colors are"
        r = self.client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=12,
                                           temperature=0)
        self.assertEqual(r.object, "text_completion")
        self.assertEqual(len(r.choices), 1)
        c = r.choices[0]
        self.assertIn(c.finish_reason, ("length", "stop"))
        self.assertEqual(c.text, generate(prompt, 12, raw_prompt=True))
        self.assertGreater(r.usage.prompt_tokens, 3)
        self.assertGreaterEqual(r.usage.completion_tokens, 1)
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)

    def test_chat_matches_generate(self):
        q = "What is the capital of France?"
        r = self.client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": q}], max_tokens=16,
            temperature=0)
        self.assertEqual(r.object, "chat.completion")
        msg = r.choices[0].message
        self.assertEqual(msg.role, "assistant")
        self.assertEqual(msg.content, generate(q, 16))
        self.assertIn("Paris", msg.content)
        self.assertGreater(r.usage.prompt_tokens, 5)

    def test_streaming_chat_with_usage(self):
        msgs = [{"role": "user", "content": "Name two planets."}]
        whole = self.client.chat.completions.create(model=MODEL_ID, messages=msgs,
                                                    max_tokens=10, temperature=0)
        stream = self.client.chat.completions.create(
            model=MODEL_ID, messages=msgs, max_tokens=10, temperature=0, stream=True,
            stream_options={"include_usage": True})
        text, finish, usage, n_chunks, roles = "", None, None, 0, []
        for ch in stream:
            n_chunks += 1
            self.assertEqual(ch.object, "chat.completion.chunk")
            if ch.usage is not None:
                usage = ch.usage
                self.assertEqual(ch.choices, [])
                continue
            d = ch.choices[0].delta
            if d.role:
                roles.append(d.role)
            text += d.content or ""
            if ch.choices[0].finish_reason:
                finish = ch.choices[0].finish_reason
        self.assertEqual(roles, ["assistant"])
        self.assertGreater(n_chunks, 3)
        self.assertEqual(text, whole.choices[0].message.content)
        self.assertEqual(finish, whole.choices[0].finish_reason)
        self.assertIsNotNone(usage)
        self.assertEqual(usage.completion_tokens, whole.usage.completion_tokens)
        self.assertEqual(usage.prompt_tokens, whole.usage.prompt_tokens)

    def test_stream_usage_key(self):
        """With stream_options.include_usage every chunk before the usage chunk has
        "usage": null (OpenAI's stream does; typed clients need the key); without it the
        key is absent. Raw SSE: the openai client reads a missing key as None too."""
        for path, req in (("/v1/chat/completions",
                           {"messages": [{"role": "user", "content": "Count to five."}]}),
                          ("/v1/completions", {"prompt": "1, 2, 3,", "echo": True})):
            for include in (True, False):
                body = dict(req, model=MODEL_ID, max_tokens=4, temperature=0, stream=True)
                if include:
                    body["stream_options"] = {"include_usage": True}
                st, data = raw("POST", path, json.dumps(body))
                self.assertEqual(st, 200)
                chunks = [json.loads(ln[6:]) for ln in data.decode().split("\n")
                          if ln.startswith("data: {")]
                self.assertGreater(len(chunks), 2)
                if include:
                    for ch in chunks[:-1]:
                        self.assertIn("usage", ch, f"{path}: {ch}")
                        self.assertIsNone(ch["usage"])
                        self.assertEqual(len(ch["choices"]), 1)
                    self.assertEqual(chunks[-1]["choices"], [])
                    self.assertGreaterEqual(chunks[-1]["usage"]["completion_tokens"], 1)
                else:
                    for ch in chunks:
                        self.assertNotIn("usage", ch, f"{path}: {ch}")

    def test_chat_logprobs(self):
        r = self.client.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "Say hello."}], max_tokens=5,
            temperature=0, logprobs=True, top_logprobs=3)
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), r.usage.completion_tokens)
        self.assertEqual("".join(t.token for t in content), r.choices[0].message.content)
        for t in content:
            self.assertLessEqual(t.logprob, 0.0)
            self.assertEqual(len(t.top_logprobs), 3)
            lps = [x.logprob for x in t.top_logprobs]
            self.assertEqual(lps, sorted(lps, reverse=True))
            # greedy: the chosen token is the most likely one
            self.assertEqual(t.top_logprobs[0].token, t.token)
            self.assertAlmostEqual(t.top_logprobs[0].logprob, t.logprob, places=5)
            self.assertEqual(bytes(t.bytes).decode("utf-8", "replace"), t.token)

    def test_completion_echo_logprobs(self):
        prompt = "One, two, three, four"
        r = self.client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=1,
                                           temperature=0, echo=True, logprobs=2)
        c = r.choices[0]
        self.assertTrue(c.text.startswith(prompt))
        lp = c.logprobs
        n = r.usage.prompt_tokens + r.usage.completion_tokens
        self.assertEqual(len(lp.tokens), n)
        self.assertEqual(len(lp.token_logprobs), n)
        self.assertIsNone(lp.token_logprobs[0])
        self.assertIsNone(lp.top_logprobs[0])
        self.assertTrue(all(x <= 0 for x in lp.token_logprobs[1:]))
        self.assertEqual("".join(lp.tokens), c.text)
        self.assertEqual(lp.text_offset[1], len(lp.tokens[0]))
        # ", five" is far more likely after the count than a typical prompt token
        self.assertGreater(lp.token_logprobs[-1], -3.0)
        # scoring only: max_tokens 0 gives the same prompt logprobs
        r0 = self.client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=0,
                                            temperature=0, echo=True, logprobs=0)
        lp0 = r0.choices[0].logprobs.token_logprobs
        self.assertEqual(len(lp0), r.usage.prompt_tokens)
        for a, b in zip(lp0[1:], lp.token_logprobs[1:]):
            self.assertAlmostEqual(a, b, places=3)

    def test_text_offsets_echo_logprobs(self):
        """text_offset is the token's position in the choice text in characters (code
        points), as the OpenAI API returns it: with echo the first generated token starts
        at the prompt's length, on the streamed route as on the whole one, for an ASCII
        and a non-ASCII prompt."""
        for prompt in ("The capital of France is", "Crème brûlée, café, naïveté — the"):
            with self.subTest(prompt=prompt):
                body = {"model": MODEL_ID, "prompt": prompt, "max_tokens": 4, "temperature": 0,
                        "echo": True, "logprobs": 1}
                st, data = raw("POST", "/v1/completions", json.dumps(body))
                self.assertEqual(st, 200, data[:300])
                choice = json.loads(data)["choices"][0]
                lp = choice["logprobs"]
                self.assertEqual("".join(lp["tokens"]), choice["text"])
                want = [len("".join(lp["tokens"][:i])) for i in range(len(lp["tokens"]))]
                self.assertEqual(lp["text_offset"], want)
                n_prompt = json.loads(data)["usage"]["prompt_tokens"]
                self.assertEqual(lp["text_offset"][n_prompt], len(prompt))
                st, data = raw("POST", "/v1/completions", json.dumps(dict(body, stream=True)))
                self.assertEqual(st, 200)
                chunks = [json.loads(ln[6:]) for ln in data.decode().split("\n")
                          if ln.startswith("data: {")]
                tokens, offsets, text = [], [], ""
                for ch in chunks:
                    c = ch["choices"][0]
                    text += c["text"]
                    if c.get("logprobs"):
                        tokens += c["logprobs"]["tokens"]
                        offsets += c["logprobs"]["text_offset"]
                self.assertEqual(text, choice["text"])
                self.assertEqual(tokens, lp["tokens"])
                self.assertEqual(offsets, lp["text_offset"])

    def test_stop_string(self):
        r = self.client.completions.create(model=MODEL_ID, prompt="1, 2, 3, 4, 5, 6,",
                                           max_tokens=20, temperature=0, stop=[" 9"])
        self.assertEqual(r.choices[0].finish_reason, "stop")
        self.assertNotIn(" 9", r.choices[0].text)
        self.assertIn("8", r.choices[0].text)

    # ---- sampling parameters (comet/sampling.h), on both routes ----

    FRANCE = "The capital of France is"
    FRANCE_CHAT = [{"role": "user", "content": "What is the capital of France?"}]

    def cmpl_tokens(self, **kw):
        r = self.client.completions.create(model=MODEL_ID, prompt=self.FRANCE, logprobs=1, **kw)
        return r.choices[0].text, r.choices[0].logprobs.tokens

    def chat_tokens(self, **kw):
        r = self.client.chat.completions.create(model=MODEL_ID, messages=self.FRANCE_CHAT,
                                                logprobs=True, **kw)
        return r.choices[0].message.content, [t.token for t in r.choices[0].logprobs.content]

    def test_tiny_temperature_is_greedy(self):
        """Temperatures too small to matter give the temperature-0 text, not NaN garbage."""
        ref, _ = self.cmpl_tokens(max_tokens=8, temperature=0)
        self.assertTrue(ref.startswith(" Paris"), ref)
        ref_chat, _ = self.chat_tokens(max_tokens=12, temperature=0)
        for t in (1e-38, 1e-40, 1e-45):
            for seed in (1, 2, 3):
                text, _ = self.cmpl_tokens(max_tokens=8, temperature=t, seed=seed,
                                           extra_body={"top_k": -1, "min_p": 0})
                self.assertEqual(text, ref, f"temperature {t}, seed {seed}")
            text, _ = self.chat_tokens(max_tokens=12, temperature=t, seed=1)
            self.assertEqual(text, ref_chat, f"chat, temperature {t}")

    def test_logit_bias(self):
        """-100 bans " Paris" (id 7042), greedy or sampled; +100 forces a token; bad maps are
        refused with 400 naming logit_bias, on both routes."""
        _, toks = self.cmpl_tokens(max_tokens=8, temperature=0)
        self.assertEqual(toks[0], " Paris")
        _, toks = self.cmpl_tokens(max_tokens=8, temperature=0, logit_bias={"7042": -100})
        self.assertNotIn(" Paris", toks)
        _, toks = self.cmpl_tokens(max_tokens=16, temperature=1.0, seed=3,
                                   logit_bias={"7042": -100})
        self.assertNotIn(" Paris", toks)
        _, toks = self.chat_tokens(max_tokens=16, temperature=0)
        self.assertIn(" Paris", toks)
        _, toks = self.chat_tokens(max_tokens=16, temperature=0, logit_bias={"7042": -100})
        self.assertNotIn(" Paris", toks)
        _, toks = self.cmpl_tokens(max_tokens=4, temperature=0.7, logit_bias={"42": 100})
        self.assertEqual(len(toks), 4)
        self.assertEqual(len(set(toks)), 1, toks)
        _, chat_toks = self.chat_tokens(max_tokens=4, temperature=0.7, logit_bias={"42": 100})
        self.assertEqual(chat_toks, toks)

        chat = {"model": MODEL_ID, "messages": self.FRANCE_CHAT, "max_tokens": 2}
        cmpl = {"model": MODEL_ID, "prompt": self.FRANCE, "max_tokens": 2}
        for bias, says in (({"999999999": 5}, "outside the vocabulary"),
                           ({"abc": 1}, "not a token id"),
                           ({"5": 100.5}, "[-100, 100]"),
                           ({"5": "x"}, "must be a number"),
                           ([7042], "must be an object")):
            for path, body in (("/v1/completions", cmpl), ("/v1/chat/completions", chat)):
                with self.subTest(path=path, bias=bias):
                    st, resp = raw("POST", path, json.dumps(dict(body, logit_bias=bias)))
                    self.assertEqual(st, 400, resp[:300])
                    err = self.error_of(st, resp)
                    self.assertEqual(err["param"], "logit_bias")
                    self.assertIn(says, err["message"])
        self.assert_alive()

    def test_penalties(self):
        """repetition_penalty (vLLM's extension), presence_penalty and frequency_penalty each
        change a greedy continuation of 32 tokens, on both routes."""
        prompt, msgs = self.FRANCE, self.FRANCE_CHAT

        def cmpl(**kw):
            extra = kw.pop("extra_body", {})
            return self.client.completions.create(
                model=MODEL_ID, prompt=prompt, max_tokens=32, temperature=0,
                extra_body=dict(extra, ignore_eos=True), **kw).choices[0].text

        def chat(**kw):
            extra = kw.pop("extra_body", {})
            return self.client.chat.completions.create(
                model=MODEL_ID, messages=msgs, max_tokens=32, temperature=0,
                extra_body=dict(extra, ignore_eos=True), **kw).choices[0].message.content

        ref, ref_chat = cmpl(), chat()
        for kw in ({"presence_penalty": 2.0}, {"frequency_penalty": 2.0},
                   {"extra_body": {"repetition_penalty": 1.8}}):
            with self.subTest(**{k: str(v) for k, v in kw.items()}):
                self.assertNotEqual(cmpl(**dict(kw)), ref)
                self.assertNotEqual(chat(**dict(kw)), ref_chat)
        st, resp = raw("POST", "/v1/completions",
                       json.dumps({"model": MODEL_ID, "prompt": "a", "repetition_penalty": 0}))
        self.assertEqual(st, 400)
        self.assertEqual(self.error_of(st, resp)["param"], "repetition_penalty")

    # ---- bad input: each a clear error, and the server keeps serving ----

    def test_bad_inputs(self):
        chat_ok = {"model": MODEL_ID, "messages": [{"role": "user", "content": "hi"}]}
        cases = [
            ("malformed JSON", "/v1/chat/completions", b'{"model": "smol", "messages": [', 400,
             None),
            ("wrong type", "/v1/chat/completions", dict(chat_ok, temperature="hot"), 400,
             "temperature"),
            ("wrong type stream", "/v1/completions", {"model": MODEL_ID, "prompt": "a",
                                                       "stream": "yes"}, 400, "stream"),
            ("negative max_tokens", "/v1/chat/completions", dict(chat_ok, max_tokens=-3), 400,
             "max_tokens"),
            ("huge max_tokens", "/v1/completions", {"model": MODEL_ID, "prompt": "a",
                                                     "max_tokens": 10**12}, 400, "max_tokens"),
            ("n=2", "/v1/chat/completions", dict(chat_ok, n=2), 400, "n"),
            ("missing messages", "/v1/chat/completions", {"model": MODEL_ID}, 400, "messages"),
            ("invalid UTF-8", "/v1/completions",
             b'{"model": "smol", "prompt": "caf\xe9 \xff"}', 400, None),
            ("unknown model", "/v1/chat/completions", dict(chat_ok, model="gpt-9"), 404, "model"),
        ]
        for name, path, body, status, param in cases:
            with self.subTest(name):
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                st, resp = raw("POST", path, data)
                self.assertEqual(st, status, resp[:300])
                err = self.error_of(st, resp)
                if param:
                    self.assertEqual(err["param"], param)
                self.assert_alive()

        # the same through the official client: typed exceptions
        with self.assertRaises(openai.NotFoundError):
            self.client.chat.completions.create(model="gpt-9", messages=chat_ok["messages"])
        with self.assertRaises(openai.BadRequestError) as cm:
            self.client.chat.completions.create(model=MODEL_ID, messages=[])
        self.assertEqual(cm.exception.body.get("param"), "messages")
        bad = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="wrong",
                            max_retries=0)
        with self.assertRaises(openai.AuthenticationError):
            bad.models.list()

        # prompt over the context: 400 naming both numbers
        long_prompt = "hello " * 9000
        st, resp = raw("POST", "/v1/completions",
                       json.dumps({"model": MODEL_ID, "prompt": long_prompt, "max_tokens": 1}))
        self.assertEqual(st, 400)
        err = self.error_of(st, resp)
        self.assertEqual(err["code"], "context_length_exceeded")
        self.assertIn("8192", err["message"])
        self.assertRegex(err["message"], r"\b9\d\d\d\b")
        self.assert_alive()

        # 10 MB body: refused with 413 without being read in full
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                   "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                   % (KEY, 10 * 1024 * 1024)).encode())
        s.sendall(b"{" + b" " * 65536)
        head = s.recv(4096).decode(errors="replace")
        s.close()
        self.assertTrue(head.startswith("HTTP/1.1 413"), head[:200])
        self.assertIn("request_too_large", head)
        self.assert_alive()

        # after all that, a normal request still works
        r = self.client.completions.create(model=MODEL_ID, prompt="Hello", max_tokens=2,
                                           temperature=0)
        self.assertEqual(r.usage.completion_tokens, 2)

    def test_client_disconnect_cancels(self):
        before = metrics().get('comet_requests_total{outcome="cancelled"}', 0)
        s = socket.create_connection(("127.0.0.1", port), timeout=60)
        body = json.dumps({"model": MODEL_ID, "prompt": "Once upon a time", "max_tokens": 400,
                           "temperature": 0, "stream": True, "ignore_eos": True}).encode()
        s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                   "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                   % (KEY, len(body))).encode() + body)
        got = b""
        while got.count(b"data: ") < 3:
            chunk = s.recv(4096)
            self.assertTrue(chunk, "stream ended early")
            got += chunk
        self.assertTrue(got.startswith(b"HTTP/1.1 200"))
        s.close()  # mid-stream
        deadline = time.time() + 60
        m = metrics()
        while time.time() < deadline:
            m = metrics()
            if (m['comet_requests_total{outcome="cancelled"}'] > before
                    and m["comet_requests_running"] == 0 and m["comet_kv_pages_used"] == 0):
                break
            time.sleep(0.2)
        self.assertGreater(m['comet_requests_total{outcome="cancelled"}'], before)
        self.assertEqual(m["comet_requests_running"], 0)
        self.assertEqual(m["comet_kv_pages_used"], 0)
        self.assertLess(m["comet_generation_tokens_total"], 10**6)
        self.assert_alive()

    def test_client_disconnect_non_streaming_cancels(self):
        before = metrics().get('comet_requests_total{outcome="cancelled"}', 0)
        gen_before = metrics()["comet_generation_tokens_total"]
        s = socket.create_connection(("127.0.0.1", port), timeout=60)
        body = json.dumps({"model": MODEL_ID, "prompt": "Once upon a time", "max_tokens": 2000,
                           "temperature": 0, "ignore_eos": True}).encode()
        s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
                   "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                   % (KEY, len(body))).encode() + body)
        deadline = time.time() + 60
        while time.time() < deadline and metrics()["comet_requests_running"] == 0:
            time.sleep(0.1)
        s.close()  # before the answer
        m = metrics()
        while time.time() < deadline:
            m = metrics()
            if (m['comet_requests_total{outcome="cancelled"}'] > before
                    and m["comet_requests_running"] == 0 and m["comet_kv_pages_used"] == 0):
                break
            time.sleep(0.2)
        self.assertGreater(m['comet_requests_total{outcome="cancelled"}'], before)
        self.assertEqual(m["comet_kv_pages_used"], 0)
        self.assertLess(m["comet_generation_tokens_total"] - gen_before, 1000)
        self.assert_alive()

    def test_64_concurrent_streams_equal_alone(self):
        def prompt(i):
            return "Item %d of the list:%s" % (i, " and more" * (i % 11))

        def params(i):
            return dict(model=MODEL_ID, prompt=prompt(i), max_tokens=3 + i % 6, temperature=0,
                        extra_body={"ignore_eos": True})

        alone = [self.client.completions.create(**params(i)) for i in range(64)]
        got = [None] * 64

        def worker(i):
            try:
                text, usage, n_chunks = "", None, 0
                for ch in self.client.completions.create(
                        stream=True, stream_options={"include_usage": True}, **params(i)):
                    if ch.usage is not None:
                        usage = ch.usage
                    elif ch.choices:
                        text += ch.choices[0].text
                        n_chunks += 1
                got[i] = (text, usage, n_chunks)
            except Exception as e:  # reported below
                got[i] = e

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(64)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=600)
        for i in range(64):
            with self.subTest(i=i):
                self.assertIsInstance(got[i], tuple, repr(got[i]))
                text, usage, n_chunks = got[i]
                self.assertEqual(text, alone[i].choices[0].text)
                self.assertEqual(usage.completion_tokens, 3 + i % 6)
                self.assertEqual(usage.prompt_tokens, alone[i].usage.prompt_tokens)
                self.assertLessEqual(n_chunks, 3 + i % 6 + 1)
        m = metrics()
        self.assertEqual(m["comet_requests_running"], 0)
        self.assertEqual(m["comet_kv_pages_used"], 0)

    def test_metrics(self):
        self.client.completions.create(model=MODEL_ID, prompt="Hi", max_tokens=2, temperature=0)
        m = metrics()
        self.assertGreaterEqual(m["comet_time_to_first_token_seconds_count"], 1)
        self.assertGreaterEqual(m['comet_requests_total{outcome="ok"}'], 1)
        self.assertGreater(m["comet_kv_pages_free"], 0)


class QueueFullTest(unittest.TestCase):
    """A second server with room for one running and one waiting request: the third
    concurrent request gets 503 queue_full, and the server recovers."""

    def test_queue_full(self):
        proc = subprocess.Popen(
            [BIN, "serve", "--model", MODEL, "--model-id", MODEL_ID, "--port", "0",
             "--max-seqs", "1", "--max-waiting", "1", "--kv-pages", "64"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        socks = []
        try:
            line = ""
            deadline = time.time() + 120
            while time.time() < deadline:
                line = proc.stdout.readline()
                if line.startswith("listening on") or proc.poll() is not None:
                    break
            m = re.match(r"listening on [^:]+:(\d+)", line)
            self.assertIsNotNone(m, line)
            qport = int(m.group(1))
            body = json.dumps({"model": MODEL_ID, "prompt": "Count: one, two,",
                               "max_tokens": 300, "temperature": 0, "stream": True,
                               "ignore_eos": True}).encode()
            req = (("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                    "application/json\r\nContent-Length: %d\r\n\r\n" % len(body)).encode()
                   + body)
            for i in range(2):  # one running, one waiting: both get their 200 headers
                s = socket.create_connection(("127.0.0.1", qport), timeout=60)
                s.sendall(req)
                got = s.recv(4096)
                self.assertTrue(got.startswith(b"HTTP/1.1 200"), got[:200])
                # the first one is running once a token has come back
                while i == 0 and b"data: " not in got:
                    more = s.recv(4096)
                    self.assertTrue(more, "stream ended early")
                    got += more
                socks.append(s)
            c = http.client.HTTPConnection("127.0.0.1", qport, timeout=60)
            c.request("POST", "/v1/completions", body=body,
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read()
            c.close()
            self.assertEqual(r.status, 503, data[:200])
            self.assertEqual(json.loads(data)["error"]["code"], "queue_full")
            for s in socks:
                s.close()
            socks = []
            ok = False
            for _ in range(300):  # the cancelled streams make room again
                c = http.client.HTTPConnection("127.0.0.1", qport, timeout=60)
                c.request("POST", "/v1/completions", headers={"Content-Type": "application/json"},
                          body=json.dumps({"model": MODEL_ID, "prompt": "Hi", "max_tokens": 1}))
                r = c.getresponse()
                r.read()
                c.close()
                if r.status == 200:
                    ok = True
                    break
                time.sleep(0.2)
            self.assertTrue(ok)
        finally:
            for s in socks:
                s.close()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
            proc.stdout.close()


class DrainTest(unittest.TestCase):
    """SIGTERM while a stream is in flight: the stream still ends with all its tokens and
    data: [DONE], new connections are refused, and the server exits 0."""

    def test_sigterm_drains(self):
        proc = subprocess.Popen(
            [BIN, "serve", "--model", MODEL, "--model-id", MODEL_ID, "--port", "0",
             "--kv-pages", "64"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            line = ""
            deadline = time.time() + 120
            while time.time() < deadline:
                line = proc.stdout.readline()
                if line.startswith("listening on") or proc.poll() is not None:
                    break
            m = re.match(r"listening on [^:]+:(\d+)", line)
            self.assertIsNotNone(m, line)
            dport = int(m.group(1))
            body = json.dumps({"model": MODEL_ID, "prompt": "Once upon a time", "max_tokens": 24,
                               "temperature": 0, "stream": True, "ignore_eos": True,
                               "stream_options": {"include_usage": True}}).encode()
            s = socket.create_connection(("127.0.0.1", dport), timeout=120)
            s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                       "application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
                       % len(body)).encode() + body)
            got = b""
            while b"data: {" not in got:
                more = s.recv(4096)
                self.assertTrue(more, "stream ended early")
                got += more
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            with self.assertRaises(OSError):  # no new connections while draining
                c = socket.create_connection(("127.0.0.1", dport), timeout=5)
                c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                if not c.recv(100):
                    raise ConnectionResetError("closed")
                c.close()
            for _ in range(2000):
                more = s.recv(65536)
                if not more:
                    break
                got += more
            s.close()
            self.assertIn(b"data: [DONE]", got)
            usage = [json.loads(ln[6:]) for ln in got.split(b"\n")
                     if ln.startswith(b"data: {") and b'"usage"' in ln]
            self.assertEqual(usage[-1]["usage"]["completion_tokens"], 24)
            self.assertEqual(proc.wait(timeout=60), 0)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
            proc.stdout.close()


def main():
    start_server()
    try:
        prog = unittest.main(exit=False, verbosity=2)
        ok = prog.result.wasSuccessful()
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            rc = server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            rc = -1
        server.stdout.close()
    if rc != 0:
        print(f"test_serve_openai: the server exited with {rc} after SIGTERM", file=sys.stderr)
        ok = False
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
