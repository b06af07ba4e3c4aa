#!/usr/bin/env python3
"""Golden values for the GGUF reader and loader, from independent implementations.

Reads the default model with the `gguf` package (gguf.GGUFReader + gguf.quants.dequantize)
and writes tests/fixtures/gguf_golden.txt:
  meta <name> <value>                          config the loader must produce
  raw <tensor> <type> <n_elements> <sum> <wsum> <v0..v63>
      reader-level dequantization (ggml row-major [ne1][ne0]), first 64 values
  hf <tensor> <rows> <cols> <sum> <wsum> <row>:<v0..v7> ...
      the tensor after transformers' own GGUF Q/K reverse permutation
      (LlamaTensorProcessor), i.e. what comet_model_load must hold, sampled at rows
      that the permutation moves.
sum = fp64 sum of all values; wsum = sum over rows r of (r+1) * (fp64 row sum), which
changes when rows are permuted. Also writes tests/fixtures/quant_blocks.txt: random
blocks of every type comet dequantizes and their values per gguf.quants.dequantize.

Usage: python3 scripts/golden_gguf.py [model.gguf]
"""
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
default_model = os.path.join(root, "models/SmolLM2-135M-Instruct.Q4_1.gguf")

RAW = ["token_embd.weight", "output_norm.weight", "blk.0.attn_norm.weight",
       "blk.0.attn_q.weight", "blk.0.ffn_down.weight", "blk.7.ffn_gate.weight",
       "blk.29.attn_k.weight", "blk.29.ffn_norm.weight"]
HF = ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.29.attn_q.weight",
      "blk.29.attn_k.weight", "blk.3.attn_v.weight"]


def f9(x):
    return "%.9g" % float(x)


def sums(m):
    m2 = m.reshape(m.shape[0], -1) if m.ndim > 1 else m.reshape(1, -1)
    rows = m2.astype(np.float64).sum(axis=1)
    return float(rows.sum()), float((rows * np.arange(1, len(rows) + 1)).sum())


def field(r, key):
    return r.fields[key].contents()


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else default_model
    r = gguf.GGUFReader(path)
    tensors = {t.name: t for t in r.tensors}
    out = []
    n_head = field(r, "llama.attention.head_count")
    n_head_kv = field(r, "llama.attention.head_count_kv")
    meta = {
        "n_layer": field(r, "llama.block_count"),
        "n_embd": field(r, "llama.embedding_length"),
        "n_ff": field(r, "llama.feed_forward_length"),
        "n_head": n_head,
        "n_head_kv": n_head_kv,
        "n_ctx": field(r, "llama.context_length"),
        "n_vocab": len(r.fields["tokenizer.ggml.tokens"].data),
        "rope_theta": field(r, "llama.rope.freq_base"),
        "rms_eps": field(r, "llama.attention.layer_norm_rms_epsilon"),
        "bos_id": field(r, "tokenizer.ggml.bos_token_id"),
        "eos_id": field(r, "tokenizer.ggml.eos_token_id"),
        "add_bos": int(field(r, "tokenizer.ggml.add_bos_token")),
        "tied": int("output.weight" not in tensors),
        "n_tensors": len(r.tensors),
        "n_kv": len(r.fields) - 3,  # GGUF.version/tensor_count/kv_count are pseudo-fields
    }
    for k, v in meta.items():
        out.append("meta %s %s" % (k, f9(v) if isinstance(v, float) else v))

    def deq(name):
        t = tensors[name]
        x = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        return x.reshape([int(d) for d in reversed(t.shape)] if len(t.shape) > 1 else [-1])

    for name in RAW:
        t = tensors[name]
        x = deq(name)
        s, ws = sums(x)
        out.append("raw %s %s %d %r %r %s" % (name, t.tensor_type.name, x.size, s, ws,
                                              " ".join(f9(v) for v in x.reshape(-1)[:64])))

    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor
    proc = LlamaTensorProcessor(config={"num_attention_heads": n_head,
                                        "num_key_value_heads": n_head_kv})
    for name in HF:
        w = proc.process(deq(name), name).weights
        s, ws = sums(w)
        rows = [0, 1, 2, 3, 31, 32, 33, 63, 64, 65, 97, w.shape[0] - 1]
        samp = " ".join("%d:%s" % (rr, ",".join(f9(v) for v in w[rr, :8])) for rr in rows)
        out.append("hf %s %d %d %r %r %s" % (name, w.shape[0], w.shape[1], s, ws, samp))

    with open(os.path.join(root, "tests/fixtures/gguf_golden.txt"), "w") as f:
        f.write("\n".join(out) + "\n")

    # Random blocks of every supported type; fp16 scale fields are set to finite values.
    rng = np.random.default_rng(42)
    lines = []
    for qt in (Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q4_K,
               Q.Q5_K, Q.Q6_K):
        bs, ts = gguf.GGML_QUANT_SIZES[qt]
        n_el = 512 if bs == 1 else 2 * bs
        if qt in (Q.F16, Q.BF16):
            vals = rng.standard_normal(n_el).astype(np.float32)
            raw = gguf.quants.quantize(vals, qt).view(np.uint8).reshape(-1)
        else:
            nb = n_el // bs
            raw = rng.integers(0, 256, (nb, ts), dtype=np.uint8)
            halves = {Q.Q8_0: [0], Q.Q4_0: [0], Q.Q5_0: [0], Q.Q4_1: [0, 2], Q.Q5_1: [0, 2],
                      Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208],
                      Q.Q2_K: [80, 82], Q.Q3_K: [108]}[qt]
            for b in range(nb):
                for off in halves:
                    h = np.array([rng.uniform(-0.05, 0.05)], dtype=np.float16).view(np.uint8)
                    raw[b, off:off + 2] = h
            raw = raw.reshape(-1)
        y = gguf.quants.dequantize(raw, qt).astype(np.float32).reshape(-1)
        assert y.size == n_el
        lines.append("%s %d %d %s" % (qt.name, int(qt), n_el, raw.tobytes().hex()))
        lines.append(" ".join(f9(v) for v in y))
    with open(os.path.join(root, "tests/fixtures/quant_blocks.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
