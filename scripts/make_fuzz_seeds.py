#!/usr/bin/env python3
"""Write small valid GGUF and safetensors files as libFuzzer seed corpora.

tests/fuzz/corpus/gguf/: a GGUF v3 file with one metadata pair of every value type
(including a nested array and a custom general.alignment) and one small tensor of each
type comet dequantizes; a second one with the default alignment and no tensors.
tests/fuzz/corpus/safetensors/: files with F32/F16/BF16/I32 tensors and __metadata__.
tests/fuzz/corpus/gguf_model/: two complete one-layer llama models (a byte-level BPE
vocabulary and a SentencePiece one with scores), quantized to stay small.
Written with the `gguf` package and json+numpy (independent of the C reader).
"""
import json
import os
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def write_gguf(path, with_tensors, alignment=None):
    w = gguf.GGUFWriter(path, "llama")
    if alignment:
        w.add_custom_alignment(alignment)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -5)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_float32("t.f32", 1.5)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo")
    w.add_uint64("t.u64", 1 << 40)
    w.add_int64("t.i64", -(1 << 40))
    w.add_float64("t.f64", 2.25)
    w.add_array("t.arr_str", ["a", "bc", ""])
    w.add_array("t.arr_i32", [1, -2, 3])
    w.add_array("t.arr_f32", [0.5, 1.5])
    w.add_array("t.arr_nested", [[1, 2], [3]])
    if with_tensors:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((2, 256)).astype(np.float32)
        w.add_tensor("f32", x[:, :8].copy())
        w.add_tensor("f16", x[:, :8].astype(np.float16))
        for qt in (Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1):
            w.add_tensor(qt.name.lower(), gguf.quants.quantize(x[:, :64], qt), raw_dtype=qt)
        for qt in (Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K):
            bs, ts = gguf.GGML_QUANT_SIZES[qt]
            raw = rng.integers(0, 256, (1, ts), dtype=np.uint8)
            w.add_tensor(qt.name.lower(), raw, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_model_gguf(path, spm):
    """A complete one-layer llama GGUF (C 32, H 2, Hkv 1, F 32) for fuzz_gguf_model."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from make_tiny_fixtures import make_tokenizer, SPECIAL
    C, H, HKV, F = 32, 2, 1, 32
    D = C // H
    w = gguf.GGUFWriter(path, "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(C)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(HKV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    if spm:
        toks = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
        pieces = ["\u2581", "\u2581t", "he", "\u2581the", "\u2581a", "an", "nd", "\u2581and"]
        toks += [p.encode().decode("unicode_escape") for p in pieces]
        w.add_tokenizer_model("llama")
        w.add_token_list(toks)
        w.add_token_types([2, 3, 3] + [6] * 256 + [1] * len(pieces))
        w.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(pieces))])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
    else:
        tok = make_tokenizer()
        toks = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
        tj = json.loads(tok.to_str())
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("smollm")
        w.add_token_list(toks)
        w.add_token_types([3 if t in SPECIAL else 1 for t in toks])
        w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
        w.add_bos_token_id(0)
        w.add_eos_token_id(2)
        w.add_chat_template("{{ messages }}")
    V = len(toks)
    rng = np.random.default_rng(3)
    shapes = {"token_embd.weight": (V, C), "output_norm.weight": (C,),
              "blk.0.attn_norm.weight": (C,), "blk.0.attn_q.weight": (H * D, C),
              "blk.0.attn_k.weight": (HKV * D, C), "blk.0.attn_v.weight": (HKV * D, C),
              "blk.0.attn_output.weight": (C, H * D), "blk.0.ffn_norm.weight": (C,),
              "blk.0.ffn_gate.weight": (F, C), "blk.0.ffn_up.weight": (F, C),
              "blk.0.ffn_down.weight": (C, F)}
    types = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.F16, Q.BF16]
    for i, (name, shape) in enumerate(shapes.items()):
        x = rng.standard_normal(shape).astype(np.float32)
        if len(shape) == 1:
            w.add_tensor(name, x)
        else:
            qt = types[i % len(types)]
            w.add_tensor(name, x.astype(np.float16) if qt == Q.F16 else
                         gguf.quants.quantize(x, qt), raw_dtype=None if qt == Q.F16 else qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_st(path, tensors, metadata=None):
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, arr, dtype in tensors:
        b = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def bf16(a):
    return (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


def main():
    gdir = os.path.join(root, "tests/fuzz/corpus/gguf")
    sdir = os.path.join(root, "tests/fuzz/corpus/safetensors")
    os.makedirs(gdir, exist_ok=True)
    os.makedirs(sdir, exist_ok=True)
    write_gguf(os.path.join(gdir, "types.gguf"), True, alignment=64)
    write_gguf(os.path.join(gdir, "meta_only.gguf"), False)
    mdir = os.path.join(root, "tests/fuzz/corpus/gguf_model")
    os.makedirs(mdir, exist_ok=True)
    write_model_gguf(os.path.join(mdir, "bpe.gguf"), False)
    write_model_gguf(os.path.join(mdir, "spm.gguf"), True)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 5)).astype(np.float32)
    write_st(os.path.join(sdir, "floats.safetensors"),
             [("a.weight", x, "F32"), ("b", x.astype(np.float16), "F16"), ("c", bf16(x), "BF16"),
              ("scalar", np.array(7, dtype=np.int32), "I32")], {"format": "pt"})
    write_st(os.path.join(sdir, "empty.safetensors"), [])
    return 0


if __name__ == "__main__":
    sys.exit(main())
