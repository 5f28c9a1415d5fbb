#!/usr/bin/env python3
"""Input-copying prompt sets for speculative decoding (docs/speculative.md), from TinyStories
validation stories: the tasks where prompt lookup pays, as llama.cpp's lookup and vLLM's n-gram
speculator are measured on (summaries, edits, continuations of a given text).

  continue  the story's first two thirds: the model continues it (names and phrases recur)
  retell    the story, a blank line, then its first sentence again: the model retells it
  edit      the story, a blank line, then its first sentence with the hero renamed: the model
            retells it with the new name

Writes PREFIX.json (ShareGPT format for `tern bench-serve --prompts`) and PREFIX.txt (one
prompt per line, newlines written as \\n, for `tern bench --spec-prompts`).

usage: spec_prompts.py TINYSTORIES_VAL OUT_PREFIX [--n N] [--task continue|retell|edit|all]
"""
import argparse
import json
import os
import re
import sys


def stories(path, n_min_chars=300, n_max_chars=900):
    text = open(path, encoding="utf-8").read()
    for para in re.split(r"\n\s*\n", text):
        s = " ".join(para.split())
        if n_min_chars <= len(s) <= n_max_chars and s.startswith("Once upon a time"):
            yield s


def first_sentence(s):
    m = re.match(r"(.+?[.!?])\s", s)
    return m.group(1) if m else s[:80]


def hero(s):
    m = re.search(r"named ([A-Z][a-z]+)", s)
    return m.group(1) if m else None


def prompt_for(task, s):
    if task == "continue":
        return s[: len(s) * 2 // 3]
    if task == "retell":
        return s + "\n\n" + first_sentence(s)
    name = hero(s)
    if name is None:
        return None
    new = "Zed" if name != "Zed" else "Max"
    return s + "\n\n" + first_sentence(s).replace(name, new)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("val")
    ap.add_argument("prefix")
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--task", default="all", choices=["continue", "retell", "edit", "all"])
    a = ap.parse_args()
    if not os.path.isfile(a.val):
        sys.exit(f"spec_prompts.py: {a.val}: no such file")
    # Never over an input or something that is not a regular file.
    for out in (a.prefix + ".json", a.prefix + ".txt"):
        if os.path.realpath(out) == os.path.realpath(a.val):
            sys.exit(f"spec_prompts.py: {out} is the input file")
        if os.path.exists(out) and not os.path.isfile(out):
            sys.exit(f"spec_prompts.py: {out} exists and is not a regular file")
    tasks = ["continue", "retell", "edit"] if a.task == "all" else [a.task]
    prompts = []
    for s in stories(a.val):
        p = prompt_for(tasks[len(prompts) % len(tasks)], s)
        if p:
            prompts.append(p)
        if len(prompts) == a.n:
            break
    with open(a.prefix + ".json", "w", encoding="utf-8") as f:
        json.dump([{"conversations": [{"from": "human", "value": p}]} for p in prompts], f, indent=0)
    with open(a.prefix + ".txt", "w", encoding="utf-8") as f:
        for p in prompts:
            f.write(p.replace("\\", "\\\\").replace("\n", "\\n") + "\n")
    print(f"{len(prompts)} prompts ({', '.join(tasks)}) -> {a.prefix}.json, {a.prefix}.txt")


if __name__ == "__main__":
    main()
