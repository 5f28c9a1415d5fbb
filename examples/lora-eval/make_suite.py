#!/usr/bin/env python3
"""Builds the demonstration suite of `tern eval` (docs/lora.md, "Replacing the base model") from
TinyStories' validation text: three product scenarios, each with fine-tuning data and a disjoint
held-out set of prompts with reference answers.

  birds     stories about birds: plain-text paragraphs that mention a bird; held out: a
            paragraph's first sentence -> its second sentence.
  dialogue  dialogue-heavy paragraphs as prompt/completion pairs: the text up to a `said, "`
            -> the quoted speech (to its closing quote).
  opening   the house style: "Title: NAME" -> a story that opens with the fixed formula
            "Long ago and far away," (TinyStories' "Once upon a time," rewritten); held out:
            the title -> the story's first sentence.

usage: make_suite.py TINYSTORIES_VAL_TXT OUT_DIR
Writes OUT_DIR/suite.json and the scenarios' files; refuses to overwrite an existing suite.json.
Only the standard library; the same input gives the same files.
"""
import json
import os
import re
import sys

N_EVAL = 30  # held-out prompts per scenario


def sentences(par):
    # Split after . ! ? (and a closing quote that follows one) when a space comes next.
    return [s for s in re.split(r'(?:(?<=[.!?])|(?<=[.!?]"))\s+', par) if s]


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    if os.path.exists(os.path.join(out, "suite.json")):
        sys.exit(f"make_suite.py: {out}/suite.json exists (remove it or choose another folder)")
    text = open(src, encoding="utf-8").read()
    paras = [p.strip() for p in text.split("\n\n") if p.strip()]

    # birds: held out are every 6th bird paragraph with two sentences or more.
    birds = [p for p in paras if re.search(r"\bbirds?\b", p, re.I)]
    b_eval, b_train = [], []
    for i, p in enumerate(birds):
        s = sentences(p)
        if i % 6 == 0 and len(s) >= 2 and len(b_eval) < N_EVAL:
            b_eval.append({"prompt": s[0], "reference": " " + s[1]})
        else:
            b_train.append(p)
    with open(os.path.join(out, "birds.train.txt"), "w", encoding="utf-8") as f:
        f.write("\n\n".join(b_train) + "\n")
    write_jsonl(os.path.join(out, "birds.eval.jsonl"), b_eval)

    # dialogue: every `said, "..."` of the dialogue-heavy paragraphs is one example.
    dia = [p for p in paras if p.count('"') >= 4 and "said" in p]
    d_eval, d_train = [], []
    for i, p in enumerate(dia):
        for m in re.finditer(r'said, "([^"]+)"', p):
            row = {"prompt": p[: m.start(1)], "completion": m.group(1)}
            if i % 5 == 0 and len(d_eval) < N_EVAL and len(row["prompt"]) < 500:
                d_eval.append({"prompt": row["prompt"], "reference": row["completion"]})
                break
            d_train.append(row)
    write_jsonl(os.path.join(out, "dialogue.train.jsonl"), d_train)
    write_jsonl(os.path.join(out, "dialogue.eval.jsonl"), d_eval)

    # opening: "Once upon a time, there was ... named NAME." -> the house formula.
    o_eval, o_train = [], []
    for i, p in enumerate(q for q in paras if q.startswith("Once upon a time, ")):
        m = re.search(r"\bnamed ([A-Z][a-z]+)", p)
        if not m:
            continue
        story = "Long ago and far away, " + p[len("Once upon a time, "):]
        prompt = f"Title: {m.group(1)}\n"
        if i % 8 == 0 and len(o_eval) < N_EVAL:
            o_eval.append({"prompt": prompt, "reference": sentences(story)[0]})
        else:
            o_train.append({"prompt": prompt, "completion": story})
    write_jsonl(os.path.join(out, "opening.train.jsonl"), o_train)
    write_jsonl(os.path.join(out, "opening.eval.jsonl"), o_eval)

    # A few epochs at most: the scenarios' data are small (more steps overfit and raise the
    # held-out perplexity). The opening formula is a larger change of behaviour: more steps.
    recipe = {"rank": 8, "alpha": 16, "targets": "q,k,v,o,gate,up,down", "steps": 40, "lr": 0.001,
              "batch": 8, "ctx": 128, "seed": 7}
    # "production": figures recorded when the online adapters went live (stories260K + the
    # adapters this suite's recipe trains, measured by tern eval on the same held-out sets).
    suite = {
        "name": "tinystories-products",
        "defaults": {"recipe": recipe, "max_regression": 0.05},
        "scenarios": [
            {"name": "birds", "train": "birds.train.txt", "online_adapter": "birds.online.gguf",
             "eval": "birds.eval.jsonl",
             "checks": [{"name": "mentions-bird", "regex": "\\bbirds?\\b"}],
             "thresholds": {"ppl": {"max": 6.0}, "check:mentions-bird": {"min": 0.5}},
             "production": {"ppl": 4.58, "token_f1": 0.142, "rouge_l": 0.117}},
            {"name": "dialogue", "train": "dialogue.train.jsonl", "online_adapter": "dialogue.online.gguf",
             "eval": "dialogue.eval.jsonl",
             "checks": [{"name": "one-line", "not_contains": "\n"}],
             "thresholds": {"ppl": {"max": 6.0}},
             "production": {"ppl": 4.62, "token_f1": 0.137, "rouge_l": 0.121}},
            {"name": "opening", "train": "opening.train.jsonl", "online_adapter": "opening.online.gguf",
             "eval": "opening.eval.jsonl", "recipe": {"steps": 120, "lr": 0.002},
             "checks": [{"name": "house-formula", "starts_with": "Long ago and far away,"}],
             "thresholds": {"check:house-formula": {"min": 0.9}},
             "max_regression": {"exact_match": 1.0},
             "production": {"ppl": 1.23, "rouge_l": 0.862, "check:house-formula": 1.0}},
        ],
    }
    with open(os.path.join(out, "suite.json"), "w", encoding="utf-8") as f:
        json.dump(suite, f, indent=2)
        f.write("\n")
    for name, tr, ev in (("birds", b_train, b_eval), ("dialogue", d_train, d_eval), ("opening", o_train, o_eval)):
        print(f"{name}: {len(tr)} training examples, {len(ev)} held-out prompts")


if __name__ == "__main__":
    main()
