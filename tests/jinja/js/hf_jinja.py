"""Fills in the cases of reference.json that transformers.js's Jinja cannot parse (Qwen3's
[::-1], Gemma 3's `is string`, Mistral's `for ... if`) with Python's Jinja2 in the environment
Hugging Face's apply_chat_template renders in (transformers/utils/chat_template_utils.py):
an ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loopcontrols, a tojson
that is json.dumps(ensure_ascii=False), raise_exception and strftime_now.

  python3 hf_jinja.py REFERENCE.json
Exit 77 when Jinja2 (Debian: python3-jinja2) is missing."""
import json
import sys
from datetime import datetime

try:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("SKIPPED: python3 jinja2 not installed")
    sys.exit(77)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now

path = sys.argv[1]
with open(path, encoding="utf-8") as f:
    doc = json.load(f)
filled = 0
for case in doc["cases"]:
    if case.get("expected") is not None:
        continue
    try:
        case["expected"] = env.from_string(case["template"]).render(**case["vars"])
        case["reference"] = "jinja2"
        filled += 1
    except jinja2.exceptions.TemplateError as e:
        case["refused"] = str(e)
with open(path, "w", encoding="utf-8") as f:
    json.dump(doc, f, ensure_ascii=False, indent=1)
print(f"jinja2 rendered {filled} cases that transformers.js could not")
