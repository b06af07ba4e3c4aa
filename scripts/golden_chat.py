#!/usr/bin/env python3
"""Golden chat-template renders for tests/test_tokenizer.c, made by transformers'
apply_chat_template (its Jinja sandbox) from the models' own template strings:
SmolLM2's (read from the default GGUF), Meta Llama-3-Instruct's and Llama-2-chat's.
Writes tests/fixtures/chat_templates.json: per template the Jinja string, BOS/EOS text,
and renders of several conversations with and without add_generation_prompt (the last
has no system message, so SmolLM2's template inserts its default one).
Usage: python3 scripts/golden_chat.py [--gguf models/SmolLM2-135M-Instruct.Q4_1.gguf]
"""
import argparse
import json
import os

import gguf
from transformers import PreTrainedTokenizerFast

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}"
          "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
          "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
          "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
          "{% endif %}")

LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
          "{% set system_message = messages[0]['content'] %}{% else %}"
          "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
          "{% for message in loop_messages %}{% if (message['role'] == 'user') != "
          "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
          "user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and "
          "system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
          "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}"
          "{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
          "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == "
          "'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")

CONVERSATIONS = [
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4."},
     {"role": "user", "content": "And 3+3? Answer in French, s'il te plaît. 😀"}],
    [{"role": "system", "content": "  Padded system.\n"},
     {"role": "user", "content": "\n Multi-line\nquestion with  spaces \t"},
     {"role": "assistant", "content": " An answer\n\nwith paragraphs. "},
     {"role": "user", "content": "中文问题？"}],
    [{"role": "user", "content": "Hi there"}],
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=os.path.join(ROOT, "models",
                                                    "SmolLM2-135M-Instruct.Q4_1.gguf"))
    args = ap.parse_args()
    r = gguf.GGUFReader(args.gguf)
    f = r.fields["tokenizer.chat_template"]
    smol = bytes(f.parts[f.data[0]]).decode()
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(ROOT, "tests", "fixtures",
                                                               "tok_bytelevel.json"))
    out = []
    for name, tmpl, bos, eos in (("chatml", smol, "<|im_start|>", "<|im_end|>"),
                                 ("llama3", LLAMA3, "<|begin_of_text|>", "<|eot_id|>"),
                                 ("llama2", LLAMA2, "<s>", "</s>")):
        tok.bos_token, tok.eos_token = bos, eos
        renders = []
        for conv in CONVERSATIONS:
            for gen in (0, 1):
                text = tok.apply_chat_template(conv, chat_template=tmpl, tokenize=False,
                                               add_generation_prompt=bool(gen))
                renders.append({"messages": conv, "add_generation_prompt": gen,
                                "render": text})
        out.append({"name": name, "jinja": tmpl, "bos": bos if name != "chatml" else None,
                    "renders": renders})
    path = os.path.join(ROOT, "tests", "fixtures", "chat_templates.json")
    with open(path, "w", encoding="utf-8") as fp:
        json.dump({"source": "transformers apply_chat_template; scripts/golden_chat.py",
                   "templates": out}, fp, ensure_ascii=False, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
