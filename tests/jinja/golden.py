#!/usr/bin/env python3
"""Golden chat-template renders from Python's jinja2 with transformers' settings.

Renders every llama.cpp template (models/templates/*.jinja, as vendored in the PyPI source
package llama-cpp-python) on each conversation of conversations.json with
add_generation_prompt off and on, in the environment of transformers'
apply_chat_template: ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
loopcontrols, the {% generation %} tag), tojson as json.dumps(ensure_ascii=False),
raise_exception, and strftime_now on a fixed clock. Writes one JSON document:
{"now": epoch, "templates": [{"name", "compile_error"?, "cases": [{"conv", "gen",
"text" | "error"}]}]}.

Usage: golden.py TEMPLATE_DIR CONVERSATIONS.json OUT.json
"""
import datetime
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

NOW = 1721952000  # 2024-07-26 00:00:00 UTC: the clock comet's test fixes too


class GenerationTracker(jinja2.ext.Extension):
    """transformers' AssistantTracker without the mask: {% generation %} renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(NOW, datetime.timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    tdir, conv_path, out_path = sys.argv[1:4]
    with open(conv_path, encoding="utf-8") as f:
        convs = json.load(f)
    env = environment()
    out = {"now": NOW, "templates": []}
    for name in sorted(os.listdir(tdir)):
        if not name.endswith(".jinja"):
            continue
        with open(os.path.join(tdir, name), encoding="utf-8") as f:
            src = f.read()
        entry = {"name": name, "cases": []}
        try:
            tmpl = env.from_string(src)
        except Exception as e:  # noqa: BLE001 - any compile failure is recorded
            entry["compile_error"] = f"{type(e).__name__}: {e}"
            out["templates"].append(entry)
            continue
        for ci, conv in enumerate(convs):
            for gen in (False, True):
                case = {"conv": ci, "gen": gen}
                try:
                    case["text"] = tmpl.render(messages=conv["messages"], tools=conv.get("tools"),
                                               documents=None, add_generation_prompt=gen,
                                               bos_token="<s>", eos_token="</s>")
                except Exception as e:  # noqa: BLE001
                    case["error"] = f"{type(e).__name__}: {e}"
                entry["cases"].append(case)
        out["templates"].append(entry)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
