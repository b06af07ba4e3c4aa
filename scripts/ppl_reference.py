#!/usr/bin/env python3
"""Reference perplexity with HF transformers, under comet's protocol (docs/numerics.md
"Accuracy protocol"): tokenize the whole text once with the HF tokenizer (BOS first only
if the GGUF says tokenizer.ggml.add_bos_token), cut non-overlapping windows of --ctx
tokens, evaluate each window on its own (fresh, no cache carried over), score every token
but the first of each window, PPL = exp(mean NLL) in float64.

Prints one line per requested window count, in the format of `comet perplexity`:
  PPL <value> tokens <scored> ctx <n> windows <n>
With --fixture FILE, also writes those lines there (tests/fixtures/ppl_reference.txt).

Usage: scripts/ppl_reference.py [--model models/SmolLM2-135M-Instruct.Q4_1.gguf]
         [--text data/austen/prideprejudice.txt] [--ctx 512] [--windows 2,16] [--fixture FILE]
Needs: pip install torch transformers accelerate gguf
"""
import argparse
import math
import os
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--text", default="data/austen/prideprejudice.txt")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--windows", default="2,16", help="comma-separated window counts to report")
    ap.add_argument("--fixture", default=None)
    args = ap.parse_args()
    counts = sorted(int(x) for x in args.windows.split(","))

    import torch
    from gguf import GGUFReader
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = os.path.realpath(args.model)
    d, f = os.path.dirname(path), os.path.basename(path)
    reader = GGUFReader(path)
    fld = reader.fields.get("tokenizer.ggml.add_bos_token")
    add_bos = bool(fld.parts[fld.data[0]][0]) if fld is not None else False
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32)
    model.eval()
    torch.set_num_threads(max(1, os.cpu_count() or 1))

    with open(args.text, "rb") as fi:
        text = fi.read().decode("utf-8")
    ids = tok(text, add_special_tokens=False).input_ids
    if add_bos:
        ids = [tok.bos_token_id] + ids
    ctx = args.ctx
    n_windows = min(len(ids) // ctx, counts[-1])
    nll, scored, out = 0.0, 0, []
    for w in range(n_windows):
        win = torch.tensor([ids[w * ctx:(w + 1) * ctx]])
        with torch.no_grad():
            logits = model(win).logits[0].double()
        logp = torch.log_softmax(logits[:-1], dim=-1)
        nll -= logp.gather(1, win[0, 1:, None]).sum().item()
        scored += ctx - 1
        print("window %d/%d PPL %.4f" % (w + 1, n_windows, math.exp(nll / scored)), file=sys.stderr)
        if w + 1 in counts:
            out.append("PPL %.4f tokens %d ctx %d windows %d" % (math.exp(nll / scored), scored, ctx, w + 1))
            print(out[-1])
    if args.fixture:
        with open(args.fixture, "w") as fo:
            fo.write("# scripts/ppl_reference.py --model %s --text %s --ctx %d (HF transformers %s, "
                     "torch %s, fp32 CPU; %d tokens in the text, add_bos %d)\n"
                     % (f, args.text, ctx, __import__("transformers").__version__,
                        torch.__version__, len(ids), add_bos))
            fo.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
