#!/usr/bin/env python3
"""Small tokenizer.json fixtures + golden ids (HF `tokenizers`) for tests/test_tokenizer.c.

Trains two small BPE tokenizers on the GPL-3 text shipped by Debian's base-files plus a few
multilingual lines, then writes
  tests/fixtures/tok_bytelevel.json  byte-level BPE: Split(Llama-3 regex) + ByteLevel,
                                     ignore_merges, merges as "a b" strings, special and
                                     non-special added tokens
  tests/fixtures/tok_spm.json        SentencePiece-style BPE as Llama-2's tokenizer.json:
                                     Prepend/Replace "▁" normalizers, byte_fallback with
                                     <0xXX> tokens, <unk>/<s>/</s>, merges as [a, b] pairs
  tests/fixtures/tok_spm_meta.json   the same vocabulary behind a Metaspace pre-tokenizer
                                     (prepend_scheme "first", split)
  tests/fixtures/tok_small_golden.json  strings and the ids HF tokenizers gives for both,
                                     and the SPM vocabulary's scores for the GGUF-style path
Usage: python3 scripts/golden_tokenizer_json.py
"""
import json
import os

from tokenizers import (AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                        trainers)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures")

LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

EXTRA = [
    "naïve café résumé über Straße", "你好世界，我爱北京。", "Привет, мир!", "مرحبا بالعالم",
    "नमस्ते दुनिया", "😀 👍🏽 🎉", "def f(x):\n    return x * 2\n", "1234567890 3.14159",
]

TESTS = [
    "", " ", "a", "Hello world", " Hello  world ", "hello\n\nworld\n", "The GNU General Public "
    "License is a free, copyleft license.", "software and other kinds of works",
    "You should have received a copy", "12345 678 9", "3.14159 and 1,000,000",
    "naïve café", "Straße über", "你好", "你好世界，我爱北京。", "日本語", "Привет", "مرحبا",
    "नमस्ते", "😀", "👨‍👩‍👧", "a😀b", "\t\ttabs\there", "   leading", "trailing   ",
    "it's they're we've I'm you'll he'd", "IT'S THEY'RE", "x = [1, 2, 3]\n",
    "<s>Hello</s>", "<s> Hello </s>", "text <|special|> more", "<|special|>", "<mask> word",
    "word<mask>word", "~!@#$%^&*()", "ÿþ\u00a0\u0001", "zzzzzzzzzzzzzzzzzzzzzz",
    "Copyright (C) 2007 Free Software Foundation, Inc. <https://fsf.org/>",
    "Everyone is permitted to copy and distribute verbatim copies",
    "ÀÉÎÕÜ àéîõü", "ﬁ", "\n", "\n\n\n", "  \n  ",
    "  0. Definitions.\n\n  \"This License\" refers to version 3",
    "(a) The work must carry prominent notices;\n  (b) The work",
    "section 10.\n\n  11. Patents.", "You're, you'RE, YOU'VE, they'll",
    "copies,\r\n\r\nand", "END OF TERMS AND CONDITIONS\n\n",
]


def corpus():
    with open("/usr/share/common-licenses/GPL-3", encoding="utf-8") as f:
        text = f.read()
    # Paragraph chunks keep newlines inside training strings, so that tokens spanning
    # "\n\n", ".\n" and the like exist and the pre-tokenizer's choices show in the ids.
    paras = text.split("\n\n")
    return [p + "\n\n" for p in paras] + EXTRA * 3


def train_bytelevel():
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(pattern=__import__("tokenizers").Regex(LLAMA3_RE),
                             behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<s>", "</s>", "<|special|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    tok.add_tokens([AddedToken("<mask>", special=False, normalized=False)])
    return tok


def train_spm():
    base = Tokenizer(models.BPE(unk_token="<unk>"))
    base.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always",
                                                  split=True)
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<unk>", "<s>", "</s>"],
                                  show_progress=False)
    base.train_from_iterator(corpus(), trainer)
    j = json.loads(base.to_str())
    old = j["model"]["vocab"]
    # Llama-2 layout: <unk> <s> </s>, then the 256 byte pieces, then the learned pieces.
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for t, _ in sorted(old.items(), key=lambda kv: kv[1]):
        if t not in vocab:
            vocab[t] = len(vocab)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1))
              for m in j["model"]["merges"]]
    def make(meta):
        tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True,
                                   fuse_unk=False))
        if meta:
            tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581",
                                                         prepend_scheme="first", split=True)
        else:  # Llama-2's own tokenizer.json: "▁" prepended to every text segment
            tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                                   normalizers.Replace(" ", "\u2581")])
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "),
                                         decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in ["<unk>", "<s>", "</s>"]])
        return tok
    return make(False), make(True), vocab


def main():
    bl = train_bytelevel()
    j = json.loads(bl.to_str())
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    with open(os.path.join(FIX, "tok_bytelevel.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False)
    bl = Tokenizer.from_file(os.path.join(FIX, "tok_bytelevel.json"))

    spm, meta, vocab = train_spm()
    spm.save(os.path.join(FIX, "tok_spm.json"))
    spm = Tokenizer.from_file(os.path.join(FIX, "tok_spm.json"))
    meta.save(os.path.join(FIX, "tok_spm_meta.json"))
    meta = Tokenizer.from_file(os.path.join(FIX, "tok_spm_meta.json"))
    # GGUF-style scores as SentencePiece gives BPE pieces: earlier pieces score higher.
    n = spm.get_vocab_size()
    scores = [0.0] * n
    attr = [1] * n
    for t, i in spm.get_vocab().items():
        scores[i] = -float(i)
        if t == "<unk>":
            attr[i] = 2
        elif t in ("<s>", "</s>"):
            attr[i] = 3
        elif t.startswith("<0x") and len(t) == 6:
            attr[i] = 6

    # The byte-level cases must tell the file's Llama-3 split from GPT-2's.
    gpt2 = Tokenizer.from_file(os.path.join(FIX, "tok_bytelevel.json"))
    gpt2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    n_diff = sum(gpt2.encode(t).ids != bl.encode(t).ids for t in TESTS)
    print(f"{n_diff} of {len(TESTS)} strings tokenize differently under GPT-2's regex")
    assert n_diff >= 5

    cases = []
    for name, tok in (("bytelevel", bl), ("spm", spm), ("spm_meta", meta)):
        for t in TESTS:
            enc = tok.encode(t, add_special_tokens=False)
            cases.append({"tokenizer": name, "text": t, "hex": t.encode().hex(),
                          "ids": enc.ids, "decoded": tok.decode(enc.ids,
                                                                skip_special_tokens=False)})
    doc = {"source": "HF tokenizers " + __import__("tokenizers").__version__ +
                     "; scripts/golden_tokenizer_json.py",
           "spm_scores": scores, "spm_attr": attr, "cases": cases}
    with open(os.path.join(FIX, "tok_small_golden.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)
    print(f"wrote {len(cases)} cases")


if __name__ == "__main__":
    main()
