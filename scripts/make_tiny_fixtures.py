#!/usr/bin/env python3
"""Write the tiny LLaMA checkpoints the loader tests read (tests/fixtures/tiny_*).

One set of weights, three files that must load to identical fp32 values:
  tiny_hf/          config.json + model.safetensors (BF16, separate lm_head) + tokenizer
  tiny_hf_sharded/  written by transformers' own save_pretrained (v5 config with
                    rope_parameters, Llama-3 RoPE scaling, tied, F16, sharded + index)
  tiny.gguf         GGUF v3, mixed F32/F16/BF16, Q/K rows permuted as llama.cpp's
                    convert_hf_to_gguf.py does, tokenizer in tokenizer.ggml.* (gpt2)
  tiny_llama3.gguf  the same in F16 with rope_theta 500000 and Llama-3.1 RoPE scaling
                    stored as llama.cpp does: a rope_freqs.weight tensor
Weights follow a formula the C test recomputes: tensor number t (order in NAMES),
element i -> ((37 i + 11 t) % 129 - 64) / 64, exact in BF16, F16 and F32.
Written with safetensors/torch, tokenizers and gguf (independent of the C code); the
GGUF permutation is checked against transformers' reverse permutation.
"""
import json
import os
import shutil
import sys

import numpy as np
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
import gguf
from gguf import GGMLQuantizationType as Q

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
fx = os.path.join(root, "tests/fixtures")

L, C, H, HKV, D, F = 2, 32, 4, 2, 8, 64
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
            "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
TEXT = ["The quick brown fox jumps over the lazy dog.", "Hello, world! 123 456",
        "It is a truth universally acknowledged, that a single man in possession of a good "
        "fortune, must be in want of a wife."] * 20


def names():
    g = [("model.embed_tokens.weight", "token_embd.weight"),
         ("model.norm.weight", "output_norm.weight"), ("lm_head.weight", "output.weight")]
    per = [("input_layernorm", "attn_norm"), ("self_attn.q_proj", "attn_q"),
           ("self_attn.k_proj", "attn_k"), ("self_attn.v_proj", "attn_v"),
           ("self_attn.o_proj", "attn_output"), ("post_attention_layernorm", "ffn_norm"),
           ("mlp.gate_proj", "ffn_gate"), ("mlp.up_proj", "ffn_up"), ("mlp.down_proj", "ffn_down")]
    for l in range(L):
        for hf, gg in per:
            g.append(("model.layers.%d.%s.weight" % (l, hf), "blk.%d.%s.weight" % (l, gg)))
    return g


def shape_of(name, V):
    if "embed" in name or "lm_head" in name:
        return (V, C)
    if "norm" in name:
        return (C,)
    for k, s in {"q_proj": (H * D, C), "k_proj": (HKV * D, C), "v_proj": (HKV * D, C),
                 "o_proj": (C, H * D), "gate_proj": (F, C), "up_proj": (F, C),
                 "down_proj": (C, F)}.items():
        if k in name:
            return s
    raise KeyError(name)


def values(t, shape):
    i = np.arange(int(np.prod(shape)), dtype=np.int64)
    return (((37 * i + 11 * t) % 129 - 64) / 64.0).astype(np.float32).reshape(shape)


def permute(w, n_head, n_head_kv):
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def make_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIAL,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXT, tr)
    return tok


def write_hf(d, tensors, V, tied, tok, shards, dtype):
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": C,
           "intermediate_size": F, "num_attention_heads": H, "num_key_value_heads": HKV,
           "num_hidden_layers": L, "rms_norm_eps": 1e-5, "rope_theta": 50000.0,
           "max_position_embeddings": 256, "tie_word_embeddings": tied, "vocab_size": V,
           "bos_token_id": 0, "eos_token_id": [2, 0], "hidden_act": "silu",
           "rope_scaling": None if not tied else {"rope_type": "llama3", "factor": 8.0,
                                                  "low_freq_factor": 1.0,
                                                  "high_freq_factor": 4.0,
                                                  "original_max_position_embeddings": 64},
           "torch_dtype": "bfloat16" if dtype == torch.bfloat16 else "float16"}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": TEMPLATE, "add_bos_token": False, "bos_token": SPECIAL[0],
                   "eos_token": SPECIAL[2]}, f, indent=2)
    ts = {k: torch.from_numpy(v).to(dtype) for k, v in tensors.items()
          if not (tied and k == "lm_head.weight")}
    if shards == 1:
        save_file(ts, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        return
    keys = list(ts)
    parts = [keys[:len(keys) // 2], keys[len(keys) // 2:]]
    wmap = {}
    for n, part in enumerate(parts):
        fn = "model-%05d-of-%05d.safetensors" % (n + 1, len(parts))
        save_file({k: ts[k] for k in part}, os.path.join(d, fn), metadata={"format": "pt"})
        wmap.update({k: fn for k in part})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": wmap}, f, indent=2)


def llama3_rope_factors(base, dim, factor, low, high, orig):
    """convert_hf_to_gguf.py LlamaModel.generate_extra_tensors (rope_freqs.weight)."""
    import math
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    low_wl, high_wl = orig / low, orig / high
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wl:
            out.append(1)
        elif wavelen > low_wl:
            out.append(factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def write_hf_transformers(d, tensors, V, tok):
    """The same weights saved by transformers (sharded F16, tied, Llama-3 rope)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    shutil.rmtree(d, ignore_errors=True)
    cfg = LlamaConfig(hidden_size=C, intermediate_size=F, num_attention_heads=H,
                      num_key_value_heads=HKV, num_hidden_layers=L, vocab_size=V,
                      max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=True,
                      bos_token_id=0, eos_token_id=[2, 0],
                      rope_parameters={"rope_type": "llama3", "rope_theta": 50000.0,
                                       "factor": 8.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 64})
    model = LlamaForCausalLM(cfg)
    sd = {k: torch.from_numpy(v) for k, v in tensors.items() if k != "lm_head.weight"}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.to(torch.float16).save_pretrained(d, max_shard_size="40KB")
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": TEMPLATE, "add_bos_token": False, "bos_token": SPECIAL[0],
                   "eos_token": SPECIAL[2]}, f, indent=2)
    assert os.path.exists(os.path.join(d, "model.safetensors.index.json"))


def write_gguf(path, tensors, V, tok, llama3=False):
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor
    proc = LlamaTensorProcessor(config={"num_attention_heads": H, "num_key_value_heads": HKV})
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("tiny-llama")
    w.add_block_count(L)
    w.add_context_length(256)
    w.add_embedding_length(C)
    w.add_feed_forward_length(F)
    w.add_head_count(H)
    w.add_head_count_kv(HKV)
    w.add_rope_dimension_count(D)
    w.add_rope_freq_base(500000.0 if llama3 else 50000.0)
    w.add_layer_norm_rms_eps(1e-5)
    vocab = tok.get_vocab()
    toks = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    assert len(toks) == V
    tj = json.loads(tok.to_str())
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(toks)
    w.add_token_types([3 if t in SPECIAL else 1 for t in toks])
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE)
    types = {"attn_q": Q.F32, "attn_k": Q.BF16, "attn_v": Q.F16, "token_embd": Q.F16}
    if llama3:
        types = {"": Q.F16}
        rf = llama3_rope_factors(500000.0, D, 8.0, 1.0, 4.0, 8192)
        assert 1.0 < rf[2] < 8.0  # one frequency in the smooth band
        w.add_tensor("rope_freqs.weight", rf)
    for hf, gg in names():
        x = tensors[hf]
        if ".attn_q." in gg or ".attn_k." in gg:
            nh = H if ".attn_q." in gg else HKV
            x = permute(x, H, nh)
            back = proc.process(x.copy(), gg).weights
            assert np.array_equal(back, tensors[hf]), gg  # transformers undoes it exactly
        qt = next((v for k, v in types.items() if k in gg), Q.F32)
        if qt == Q.F32:
            w.add_tensor(gg, x)
        elif qt == Q.F16:
            w.add_tensor(gg, x.astype(np.float16))
        else:
            w.add_tensor(gg, gguf.quants.quantize(x, qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    tok = make_tokenizer()
    V = tok.get_vocab_size()
    tensors = {hf: values(t, shape_of(hf, V)) for t, (hf, _) in enumerate(names())}
    write_hf(os.path.join(fx, "tiny_hf"), tensors, V, False, tok, 1, torch.bfloat16)
    write_hf_transformers(os.path.join(fx, "tiny_hf_sharded"), tensors, V, tok)
    write_gguf(os.path.join(fx, "tiny.gguf"), tensors, V, tok)
    write_gguf(os.path.join(fx, "tiny_llama3.gguf"), tensors, V, tok, llama3=True)
    print("vocab", V)
    return 0


if __name__ == "__main__":
    sys.exit(main())
