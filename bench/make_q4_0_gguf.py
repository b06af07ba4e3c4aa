#!/usr/bin/env python3
"""make_q4_0_gguf.py - write a random-weight Q4_0 GGUF of a LLaMA-3 shape for llama.cpp.

llama.cpp is the peer in comet's GPU benchmarks (`llama-bench`, `llama-batched-bench`), run
on a model of the same shape as comet's synthetic presets (src/model/synthetic.c:
llama3-8b, llama3-70b; head dim 128, 8 KV heads, vocabulary 128256, LLaMA-3.1 RoPE
scaling). Speed does not depend on the weights' values, so the weights are random: every
Q4_0 block is an fp16 scale and 32 random 4-bit codes, the scale chosen so a row's dot
product with a unit-RMS vector stays near 1 (no inf/NaN in the activations). The tensor
types follow llama.cpp's own `llama-quantize Q4_0` output: Q4_0 for the layers' matrices
and token_embd, Q6_K for output (lm_head), F32 for the norms and rope_freqs
(`--output-type q4_0` makes output Q4_0 too).

The file is streamed: the GGUF header, metadata and tensor table come from the `gguf`
package, then each tensor's bytes are written in chunks of at most --chunk-mb from one
pool of random bytes made once (the 70B file, ~40 GB, never sits in memory). Random codes
repeat across tensors with the pool's period; that changes no kernel's work.

The tokenizer is a byte-level BPE ("gpt2" model, "llama-bpe" pre-tokenizer) with 128256
tokens, as llama.cpp's loader needs (src/llama-vocab.cpp): the 256 byte-level symbols,
one merge, unique synthetic strings, and LLaMA-3's special tokens at 128000..128255
(<|begin_of_text|> 128000, <|end_of_text|> 128001, <|eot_id|> 128009). It can tokenize any
text (byte by byte); it is not LLaMA-3's tokenizer, and only token ids carry meaning.

`import gguf` must work: pip's gguf, or the gguf-py folder of llama.cpp's source on
PYTHONPATH (bench/llamacpp_cuda.sh sets that). numpy is needed.

Usage:
  python3 bench/make_q4_0_gguf.py --preset llama3-8b -o /tmp/llama3-8b-q4_0.gguf
  python3 bench/make_q4_0_gguf.py --preset tiny -o /tmp/tiny.gguf        # 2 layers, n_embd 256
  python3 bench/make_q4_0_gguf.py --n-layer 4 --n-embd 512 --n-ff 1024 --n-head 4 \
      --n-head-kv 2 -o /tmp/x.gguf
"""
import argparse
import math
import os
import sys
import time

import numpy as np

try:
    import gguf
except ImportError as e:
    sys.exit("make_q4_0_gguf.py: cannot import the gguf package (%s): pip install gguf, or put "
             "llama.cpp's gguf-py folder on PYTHONPATH" % e)

# name: (n_layer, n_embd, n_ff, n_head, n_head_kv) as in src/model/synthetic.c
PRESETS = {
    "llama3-8b": (32, 4096, 14336, 32, 8),
    "llama3-70b": (80, 8192, 28672, 64, 8),
    "tiny": (2, 256, 512, 2, 1),  # the same structure at a size a CPU loads in a second
}
N_VOCAB = 128256
N_CTX = 8192
ROPE_THETA = 500000.0
RMS_EPS = 1e-5
# LLaMA-3.1 RoPE scaling (as the presets): factor, low/high frequency factors, original context
ROPE_FACTOR, ROPE_LOW, ROPE_HIGH, ROPE_ORIG_CTX = 8.0, 1.0, 4.0, 8192

QT = gguf.GGMLQuantizationType
Q4_0_BLOCK, Q4_0_BYTES = gguf.GGML_QUANT_SIZES[QT.Q4_0]   # 32 weights in 18 bytes
Q6_K_BLOCK, Q6_K_BYTES = gguf.GGML_QUANT_SIZES[QT.Q6_K]   # 256 weights in 210 bytes


def bytes_to_unicode():
    """GPT-2's byte-level alphabet: byte value -> the printable character standing for it."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def vocab():
    """(tokens, token types, merges) of the synthetic byte-level BPE vocabulary."""
    tokens = bytes_to_unicode()              # ids 0..255: every byte, so any text tokenizes
    tokens.append("\u0120\u0120")            # "ĠĠ", the product of the one merge below
    seen = set(tokens)
    i = 0
    while len(tokens) < 128000:
        t = "w%d" % i
        i += 1
        if t not in seen:
            tokens.append(t)
    special = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
               "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>",
               "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
               "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]
    k = 3
    while len(special) < N_VOCAB - 128000:
        special.append("<|reserved_special_token_%d|>" % k)
        k += 1
    tokens += special
    types = [int(gguf.TokenType.NORMAL)] * 128000 + [int(gguf.TokenType.CONTROL)] * len(special)
    assert len(tokens) == N_VOCAB and len(set(tokens)) == N_VOCAB
    return tokens, types, ["\u0120 \u0120"]


def llama3_rope_freqs(head_dim):
    """LLaMA-3.1's per-frequency RoPE divisors (what convert_hf_to_gguf.py writes as
    rope_freqs.weight): 1 for high frequencies, the factor for low ones, smooth between."""
    out = []
    low_wavelen = ROPE_ORIG_CTX / ROPE_LOW
    high_wavelen = ROPE_ORIG_CTX / ROPE_HIGH
    for i in range(0, head_dim, 2):
        freq = 1.0 / (ROPE_THETA ** (i / head_dim))
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(ROPE_FACTOR)
        else:
            smooth = (ROPE_ORIG_CTX / wavelen - ROPE_LOW) / (ROPE_HIGH - ROPE_LOW)
            out.append(1.0 / ((1 - smooth) / ROPE_FACTOR + smooth))
    return np.array(out, dtype=np.float32)


class BlockSource:
    """Random quantized blocks in chunks: one pool of random bytes, block scales set per
    tensor. A chunk is a uint8 array [n_blocks, block_bytes] ready to write."""

    def __init__(self, pool_bytes, seed):
        rng = np.random.default_rng(seed)
        self.pool = rng.integers(0, 256, size=pool_bytes, dtype=np.uint8)
        self.scale_jitter = np.abs(1.0 + 0.25 * rng.standard_normal(4096)).astype(np.float32)

    def chunk(self, qtype, n_blocks, offset, scale):
        bb = Q4_0_BYTES if qtype == QT.Q4_0 else Q6_K_BYTES
        n = n_blocks * bb
        start = (offset * 7919) % (len(self.pool) - n) if n < len(self.pool) else 0
        if n <= len(self.pool):
            buf = self.pool[start:start + n].copy()
        else:
            buf = np.resize(self.pool, n)
        blocks = buf.reshape(n_blocks, bb)
        jitter = np.resize(np.roll(self.scale_jitter, offset % 4096), n_blocks)
        d = (scale * jitter).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
        if qtype == QT.Q4_0:                 # block_q4_0: fp16 d, then 16 bytes of nibbles
            blocks[:, 0:2] = d
        else:                                # block_q6_K: ql[128] qh[64] scales[16] d
            blocks[:, 192:208] &= 0x0F       # int8 sub-block scales 0..15
            blocks[:, 208:210] = d
        return blocks


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-o", "--output", required=True, help="the .gguf file to write")
    ap.add_argument("--preset", choices=sorted(PRESETS), help="a shape (default llama3-8b)")
    for f in ("n-layer", "n-embd", "n-ff", "n-head", "n-head-kv"):
        ap.add_argument("--" + f, type=int, help="override the preset's " + f.replace("-", "_"))
    ap.add_argument("--output-type", choices=["q6_k", "q4_0"], default="q6_k",
                    help="the output (lm_head) matrix's type (default q6_k, as llama-quantize Q4_0)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chunk-mb", type=int, default=256, help="bytes written at once (MiB)")
    ap.add_argument("--force", action="store_true", help="overwrite an existing file")
    a = ap.parse_args()

    if a.preset is None and any(getattr(a, f) is None for f in
                                ("n_layer", "n_embd", "n_ff", "n_head", "n_head_kv")):
        a.preset = a.preset or "llama3-8b"
    n_layer, n_embd, n_ff, n_head, n_head_kv = PRESETS[a.preset] if a.preset else (0,) * 5
    n_layer = a.n_layer or n_layer
    n_embd = a.n_embd or n_embd
    n_ff = a.n_ff or n_ff
    n_head = a.n_head or n_head
    n_head_kv = a.n_head_kv or n_head_kv
    for name, v in (("n_layer", n_layer), ("n_embd", n_embd), ("n_ff", n_ff),
                    ("n_head", n_head), ("n_head_kv", n_head_kv)):
        if v <= 0:
            ap.error("%s must be positive, got %d" % (name, v))
    if n_embd % n_head or n_head % n_head_kv:
        ap.error("n_embd (%d) must be a multiple of n_head (%d), and n_head of n_head_kv (%d)"
                 % (n_embd, n_head, n_head_kv))
    head_dim = n_embd // n_head
    if n_embd % Q6_K_BLOCK or n_ff % Q4_0_BLOCK or head_dim % 2:
        ap.error("n_embd must be a multiple of %d and n_ff of %d (quantization blocks)"
                 % (Q6_K_BLOCK, Q4_0_BLOCK))
    if a.chunk_mb <= 0:
        ap.error("--chunk-mb must be positive")
    if os.path.exists(a.output) and not a.force:
        sys.exit("make_q4_0_gguf.py: %s exists (use --force to overwrite)" % a.output)
    kv_dim = n_head_kv * head_dim
    out_type = QT.Q6_K if a.output_type == "q6_k" else QT.Q4_0

    # (name, shape as ggml's ne: [columns, rows], type, scale of the random values)
    tensors = [("token_embd.weight", (n_embd, N_VOCAB), QT.Q4_0, 1.0 / 4.6),
               ("rope_freqs.weight", (head_dim // 2,), QT.F32, None)]
    for i in range(n_layer):
        p = "blk.%d." % i
        tensors += [
            (p + "attn_norm.weight", (n_embd,), QT.F32, None),
            (p + "attn_q.weight", (n_embd, n_embd), QT.Q4_0, None),
            (p + "attn_k.weight", (n_embd, kv_dim), QT.Q4_0, None),
            (p + "attn_v.weight", (n_embd, kv_dim), QT.Q4_0, None),
            (p + "attn_output.weight", (n_embd, n_embd), QT.Q4_0, None),
            (p + "ffn_norm.weight", (n_embd,), QT.F32, None),
            (p + "ffn_gate.weight", (n_embd, n_ff), QT.Q4_0, None),
            (p + "ffn_up.weight", (n_embd, n_ff), QT.Q4_0, None),
            (p + "ffn_down.weight", (n_ff, n_embd), QT.Q4_0, None),
        ]
    tensors += [("output_norm.weight", (n_embd,), QT.F32, None),
                ("output.weight", (n_embd, N_VOCAB), out_type, None)]

    def nbytes(shape, qt):
        n = int(np.prod(shape))
        if qt == QT.F32:
            return 4 * n
        blk, bb = gguf.GGML_QUANT_SIZES[qt]
        return n // blk * bb

    arch = "llama"
    w = gguf.GGUFWriter(a.output, arch)
    w.add_name("random %s Q4_0" % (a.preset or "custom"))
    w.add_description("random weights of a LLaMA-3 shape for speed measurements only "
                      "(comet bench/make_q4_0_gguf.py)")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_vocab_size(N_VOCAB)
    w.add_context_length(N_CTX)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(ROPE_THETA)
    w.add_layer_norm_rms_eps(RMS_EPS)
    tokens, types, merges = vocab()
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(128000)
    w.add_eos_token_id(128009)
    w.add_add_bos_token(True)
    for name, shape, qt, _ in tensors:
        # shapes in the gguf package's numpy order (rows first; it reverses them into ne);
        # a quantized tensor's as bytes per row, which the package turns back into weights
        np_shape = tuple(reversed(shape))
        if qt == QT.F32:
            w.add_tensor_info(name, np_shape, np.dtype(np.float32), nbytes(shape, qt))
        else:
            blk, bb = gguf.GGML_QUANT_SIZES[qt]
            w.add_tensor_info(name, np_shape[:-1] + (np_shape[-1] // blk * bb,),
                              np.dtype(np.uint8), nbytes(shape, qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    align = w.data_alignment

    chunk_bytes = a.chunk_mb << 20
    src = BlockSource(min(chunk_bytes, 64 << 20), a.seed)
    total = sum(nbytes(s, q) for _, s, q, _ in tensors)
    t0 = time.time()
    done = 0
    for ti, (name, shape, qt, scale) in enumerate(tensors):
        pad = -fout.tell() % align
        fout.write(b"\0" * pad)
        if qt == QT.F32:
            if name == "rope_freqs.weight":
                data = llama3_rope_freqs(head_dim)
            else:
                data = np.ones(shape, dtype=np.float32)
            fout.write(data.tobytes())
            done += data.nbytes
            continue
        blk, bb = gguf.GGML_QUANT_SIZES[qt]
        n_cols = shape[0]
        if scale is None:
            # codes - 8 (Q4_0) or codes - 32 times a 0..15 sub-scale (Q6_K) have an RMS of
            # about 4.6 or 160: a dot product over n_cols inputs of RMS 1 stays near 1
            rms = 4.6 if qt == QT.Q4_0 else 160.0
            scale = 1.0 / (rms * math.sqrt(n_cols))
        n_blocks = nbytes(shape, qt) // bb
        per_chunk = max(1, chunk_bytes // bb)
        off = 0
        while off < n_blocks:
            k = min(per_chunk, n_blocks - off)
            src.chunk(qt, k, off + ti * 1009, scale).tofile(fout)
            off += k
        done += n_blocks * bb
        if ti % 50 == 0 or ti == len(tensors) - 1:
            el = time.time() - t0
            print("make_q4_0_gguf: %5.1f%% %7.2f GB in %5.1f s (%s)" %
                  (100.0 * done / total, done / 1e9, el, name), file=sys.stderr, flush=True)
    fout.write(b"\0" * (-fout.tell() % align))
    w.close()
    print("make_q4_0_gguf: wrote %s: %d layers, n_embd %d, n_ff %d, %d heads, %d KV heads, "
          "vocab %d, %.2f GB in %.1f s" % (a.output, n_layer, n_embd, n_ff, n_head, n_head_kv,
                                           N_VOCAB, os.path.getsize(a.output) / 1e9,
                                           time.time() - t0), file=sys.stderr)


if __name__ == "__main__":
    main()
