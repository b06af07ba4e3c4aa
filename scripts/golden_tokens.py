#!/usr/bin/env python3
"""Golden token ids for tests/test_tokenizer.c from an independent implementation.

Builds SmolLM2's tokenizer with HF `tokenizers` from the GGUF's vocabulary and merges
(read with the `gguf` package) and the pre-tokenizer the model ships with on the HF hub
(Digits(individual_digits) then ByteLevel), cross-checks it against transformers'
own GGUF conversion (AutoTokenizer.from_pretrained(..., gguf_file=...)), and writes
the strings with their ids to tests/fixtures/tokens_smollm2.json, plus the id count and an
FNV-1a hash of the ids of two whole novels (data/, from scripts/extract_texts.py).

Usage: python3 scripts/golden_tokens.py [--gguf models/SmolLM2-135M-Instruct.Q4_1.gguf]
"""
import argparse
import json
import os
import sys

import gguf
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gguf_strings(reader, key):
    f = reader.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def gguf_ints(reader, key):
    f = reader.fields[key]
    return [int(f.parts[i][0]) for i in f.data]


def build_reference(path):
    r = gguf.GGUFReader(path)
    tokens = gguf_strings(r, "tokenizer.ggml.tokens")
    types = gguf_ints(r, "tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in gguf_strings(r, "tokenizer.ggml.merges")]
    pre = bytes(r.fields["tokenizer.ggml.pre"].parts[-1]).decode()
    assert pre == "smollm", pre
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, merges, ignore_merges=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False)
                for t, ty in zip(tokens, types) if ty == 3]
    tok.add_special_tokens(specials)
    return tok


def fnv1a64(ids):
    """FNV-1a over the ids as little-endian int32 bytes, as a hex string."""
    h = 0xcbf29ce484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little", signed=True):
            h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
    return f"{h:016x}"


def strings():
    s = [
        "", " ", "  ", "   ", "\n", "\n\n", "\n\n\n", "\t", "\t\t", " \n", "\n ", " \t \n ",
        "\r\n", "\r\n\r\n", "a", "A", "Hello", "Hello world", "Hello, world!", " Hello",
        "Hello ", "hello  world", "hello   world", "hello\tworld", "hello\nworld",
        "hello\n\nworld", "Hello world!\n", "The quick brown fox jumps over the lazy dog.",
        "THE QUICK BROWN FOX", "I'm here. You're there. We've been. He'll go. She'd say. It's.",
        "don't DON'T Don't", "'s 't 're 've 'm 'll 'd", "''quoted''", "\"double quoted\"",
        "0", "7", "12", "123", "1234", "12345", "3.14159", "1,000,000", "-42", "+7",
        "1e10", "0x1F", "2024-11-29", "12:34:56", "$100.00", "100%", "a1b2c3",
        "99 bottles of beer", "pi = 3.141592653589793238462643383279",
        "12345678901234567890123456789012345678901234567890",
        "½ ¾ ² ³ ¹", "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "Ⅰ Ⅱ Ⅲ Ⅻ", "①②③",
        "café", "naïve", "résumé", "Crème brûlée", "über", "Straße", "façade", "jalapeño",
        "Ångström", "ça va?", "e\u0301", "n\u0303", "ﬁ ligature", "Æsir ØRE œuvre",
        "Привет, мир!", "Здравствуйте", "Ελληνικά γράμματα", "Ἀθῆναι",
        "你好世界", "我爱北京天安门。", "日本語のテキスト", "カタカナとひらがな", "한국어 텍스트",
        "中文, English, 日本語 mixed", "東京 2024", "　全角スペース　",
        "مرحبا بالعالم", "العربية ١٢٣", "שלום עולם", "नमस्ते दुनिया", "हिन्दी भाषा",
        "বাংলা", "தமிழ்", "ภาษาไทย", "Tiếng Việt có dấu", "ქართული", "Հայերեն", "አማርኛ",
        "😀", "😀😃😄", "Hello 😀 world", "👍🏽", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "❤️", "🇫🇷🇯🇵",
        "🤖 robots", "emoji at end 🎉", "🎉 emoji at start", "a😀b", "😀\n😀",
        "∑ ∫ √ ∞ ≠ ≤ ≥", "α + β = γ", "→ ← ↑ ↓", "© ® ™", "€ £ ¥ ₹ ₿", "°C °F",
        "…", "—", "– dash", "“smart quotes”", "‘single’", "«guillemets»", "¿Qué? ¡Sí!",
        "•bullet", "§ ¶ †", "\u00a0nbsp\u00a0", "zero\u200bwidth", "soft\u00adhyphen",
        "\u2028line sep", "\u3000ideographic space", "\u0085next line", "tab\u000bvt", "\u000cff",
        "\u0001\u0002\u0003", "\u007f del", "\u00a0", "\ufeffBOM", "\ufffd replacement",
        "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𝕳𝖊𝖑𝖑𝖔", "\U0001F600\U0001F64F", "\U00010348 gothic", "\U000E0041 tag",
        "def main():\n    print('hello')\n", "int main(void) {\n\treturn 0;\n}\n",
        "for (int i = 0; i < n; i++) { sum += a[i]; }",
        "    indented four", "        indented eight", "\t\tdouble tab",
        "x = [1, 2, 3]\ny = {'a': 1}\n", "if x == y and not z: pass",
        "<div class=\"main\">Hello</div>", "SELECT * FROM users WHERE id = 42;",
        "#include <stdio.h>", "// comment\n/* block */", "a->b && c || !d",
        "x+=1;y-=2;z*=3;w/=4;", "~!@#$%^&*()_+`-={}|[]\\:\";'<>?,./",
        "lambda x: x**2", "console.log(`template ${x}`);", "fn main() -> Result<(), E> {}",
        "https://www.example.com/path?query=1&b=2#frag", "http://localhost:8080/",
        "user@example.com", "ftp://ftp.example.org/file.tar.gz",
        "C:\\Users\\name\\file.txt", "/usr/local/bin/comet", "~/.config/app.json",
        "git commit -m \"fix: bug\"", "$ echo $HOME", "key=value; other=thing",
        "<|im_start|>", "<|im_end|>", "<|endoftext|>",
        "<|im_start|>user\nHello<|im_end|>\n",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        "text<|endoftext|>more", "<|im_start|><|im_end|>", "< |im_start| >", "<|im_start",
        "im_start|>", "<repo_name>comet<file_sep>", "<jupyter_code>print(1)",
        "<<|im_start|>>", "<|im_start|>|>", "<s></s>", "[INST] hi [/INST]",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "abababababababababab",
        "!!!!!!!!!!!!!!!!", "????", "...", "......", "----------", "==========",
        "__init__", "__name__ == '__main__'", "snake_case_name", "camelCaseName",
        "PascalCaseName", "kebab-case-name", "SCREAMING_SNAKE", "MiXeD cAsE",
        " " * 17 + "x", "\n" * 9 + "y", "\t" * 5 + "z", " \t" * 6, "a" + " " * 30 + "b",
        "trailing spaces   ", "   leading spaces", "  both  ",
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor "
        "incididunt ut labore et dolore magna aliqua.",
        "It is a truth universally acknowledged, that a single man in possession of a good "
        "fortune, must be in want of a wife.",
        "Call me Ishmael. Some years ago—never mind how long precisely—having little or no "
        "money in my purse, and nothing particular to interest me on shore, I thought I would "
        "sail about a little and see the watery part of the world.",
        "Mr. and Mrs. Dursley, of number four, Privet Drive, were proud to say that they were "
        "perfectly normal, thank you very much.",
        "the the the the the", "The Theory of Everything", "naïve café résumé über 😀 你好 123",
        "ASCII then ünïcödé then 中文 then 🎉 then 42",
    ]
    # Systematic combinations: every separator between every kind of word.
    words = ["word", "Word", "42", "naïve", "中文", "😀", "x_y", "!?"]
    seps = ["", " ", "  ", "\n", "\t", " \n ", "\n\n"]
    for a in words:
        for sep in seps[:4]:
            s.append(a + sep + words[(words.index(a) + 3) % len(words)])
    for sep in seps:
        s.append("left" + sep)
        s.append(sep + "right")
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=os.path.join(ROOT, "models",
                                                    "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default=os.path.join(ROOT, "tests", "fixtures",
                                                   "tokens_smollm2.json"))
    ap.add_argument("--no-cross-check", action="store_true")
    args = ap.parse_args()
    ref = build_reference(args.gguf)
    texts = strings()
    assert len(set(texts)) == len(texts), "duplicate test strings"
    special_texts = [t for t in texts if "<" in t]

    hf = None
    if not args.no_cross_check:
        from transformers import AutoTokenizer
        d, f = os.path.split(os.path.abspath(args.gguf))
        hf = AutoTokenizer.from_pretrained(d, gguf_file=f)

    cases = []
    n_diff = 0
    for parse_special, batch in ((1, texts), (0, special_texts)):
        ref.encode_special_tokens = not parse_special
        for t in batch:
            ids = ref.encode(t, add_special_tokens=False).ids
            assert ref.decode(ids, skip_special_tokens=False) == t or not t, repr(t)
            if hf is not None:
                hid = hf(t, add_special_tokens=False,
                         split_special_tokens=not parse_special).input_ids
                if hid != ids:
                    n_diff += 1
                    print(f"transformers' GGUF conversion differs on {t!r}: {hid} vs {ids}",
                          file=sys.stderr)
            cases.append({"text": t, "hex": t.encode("utf-8").hex(), "special": parse_special,
                          "ids": ids})
    # Whole novels (extracted by scripts/extract_texts.py): id count and a hash of the ids.
    novels = []
    for rel in ("data/austen/prideprejudice.txt", "data/mobydick.txt"):
        path = os.path.join(ROOT, rel)
        if not os.path.exists(path):
            sys.exit(f"{path} missing: run scripts/extract_texts.py first")
        with open(path, "rb") as fp:
            text = fp.read().decode("utf-8")
        ref.encode_special_tokens = True
        ids = ref.encode(text, add_special_tokens=False).ids
        novels.append({"path": rel, "n_tokens": len(ids), "fnv1a64": fnv1a64(ids),
                       "first": ids[:16], "last": ids[-16:]})
    ref.encode_special_tokens = False
    doc = {
        "source": "HF tokenizers BPE from the GGUF vocab/merges, pre-tokenizer "
                  "Digits(individual)+ByteLevel; scripts/golden_tokens.py",
        "model": os.path.basename(args.gguf),
        "cases": cases,
        "novels": novels,
    }
    with open(args.out, "w", encoding="utf-8") as fp:
        json.dump(doc, fp, ensure_ascii=False, indent=0)
        fp.write("\n")
    print(f"wrote {len(cases)} cases to {args.out}; transformers disagreed on {n_diff}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
