// An independent reading of GBNF (llama.cpp's grammar syntax) for checking tern's outputs: a
// parser to an AST, an Earley recognizer over code points, and `bound()`, which rewrites a
// grammar into one whose every derivation is also one of the original but of bounded size
// (repetitions capped, recursion depth capped), so that random samples finish. Shares no code
// with tern's C++ (src/grammar).

// ---- parsing -------------------------------------------------------------------------------
// AST: Map name -> alts; alts: [seq]; seq: [item]; item:
//   {t: "chars", ranges: [[lo, hi]...], neg}   one code point
//   {t: "ref", name}   {t: "group", alts}   {t: "rep", item, min, max}  (max Infinity: unbounded)
export function parseGbnf(text) {
  const cps = Array.from(text).map((c) => c.codePointAt(0));
  let i = 0;
  const rules = new Map();
  const err = (msg) => {
    throw new Error(`gbnf: ${msg} at code point ${i}`);
  };
  const isName = (c) =>
    (c >= 0x61 && c <= 0x7a) || (c >= 0x41 && c <= 0x5a) || (c >= 0x30 && c <= 0x39) || c === 0x5f || c === 0x2d;
  const space = (nl) => {
    while (i < cps.length) {
      const c = cps[i];
      if (c === 0x20 || c === 0x09) i++;
      else if (c === 0x23) while (i < cps.length && cps[i] !== 0x0a && cps[i] !== 0x0d) i++;
      else if (nl && (c === 0x0a || c === 0x0d)) i++;
      else break;
    }
  };
  const name = () => {
    const s = i;
    while (i < cps.length && isName(cps[i])) i++;
    return String.fromCodePoint(...cps.slice(s, i));
  };
  const hex = (n) => {
    let v = 0;
    for (let k = 0; k < n; k++) {
      const d = parseInt(String.fromCodePoint(cps[i++]), 16);
      if (Number.isNaN(d)) err("bad hex escape");
      v = v * 16 + d;
    }
    return v;
  };
  const char = () => {
    const c = cps[i++];
    if (c !== 0x5c) return c;
    const e = String.fromCodePoint(cps[i++]);
    const simple = { n: 10, r: 13, t: 9, "\\": 92, '"': 34, "[": 91, "]": 93, "-": 45, "^": 94 };
    if (e in simple) return simple[e];
    if (e === "x") return hex(2);
    if (e === "u") return hex(4);
    if (e === "U") return hex(8);
    err(`unknown escape \\${e}`);
  };
  const alternates = (nested) => {
    const alts = [sequence(nested)];
    while (cps[i] === 0x7c) {
      i++;
      space(true);
      alts.push(sequence(nested));
    }
    return alts;
  };
  const sequence = (nested) => {
    const seq = [];
    for (;;) {
      const c = cps[i];
      if (c === 0x22) {
        i++;
        const lit = [];
        while (cps[i] !== 0x22) {
          if (i >= cps.length) err("unterminated literal");
          lit.push(char());
        }
        i++;
        seq.push({ t: "group", alts: [lit.map((cp) => ({ t: "chars", ranges: [[cp, cp]], neg: false }))] });
      } else if (c === 0x5b) {
        i++;
        let neg = false;
        if (cps[i] === 0x5e) {
          neg = true;
          i++;
        }
        const ranges = [];
        while (cps[i] !== 0x5d) {
          if (i >= cps.length) err("unterminated class");
          const lo = char();
          let hi = lo;
          if (cps[i] === 0x2d && cps[i + 1] !== 0x5d) {
            i++;
            hi = char();
          }
          ranges.push([lo, hi]);
        }
        i++;
        seq.push({ t: "chars", ranges, neg });
      } else if (c === 0x2e) {
        i++;
        seq.push({ t: "chars", ranges: [], neg: true });
      } else if (c !== undefined && isName(c)) {
        seq.push({ t: "ref", name: name() });
      } else if (c === 0x28) {
        i++;
        space(true);
        const alts = alternates(true);
        if (cps[i] !== 0x29) err("expected )");
        i++;
        seq.push({ t: "group", alts });
      } else if (c === 0x2a || c === 0x2b || c === 0x3f) {
        i++;
        const item = seq.pop();
        if (!item) err("repetition of nothing");
        seq.push({ t: "rep", item, min: c === 0x2b ? 1 : 0, max: c === 0x3f ? 1 : Infinity });
      } else if (c === 0x7b) {
        i++;
        space(nested);
        const num = () => {
          const s = i;
          while (cps[i] >= 0x30 && cps[i] <= 0x39) i++;
          return parseInt(String.fromCodePoint(...cps.slice(s, i)), 10);
        };
        const min = num();
        let max = min;
        space(nested);
        if (cps[i] === 0x2c) {
          i++;
          space(nested);
          max = cps[i] === 0x7d ? Infinity : num();
          space(nested);
        }
        if (cps[i] !== 0x7d) err("expected }");
        i++;
        const item = seq.pop();
        seq.push({ t: "rep", item, min, max });
      } else {
        break;
      }
      space(nested);
    }
    return seq;
  };
  space(true);
  while (i < cps.length) {
    const n = name();
    if (!n) err("expected a rule name");
    space(false);
    if (String.fromCodePoint(...cps.slice(i, i + 3)) !== "::=") err("expected ::=");
    i += 3;
    space(true);
    rules.set(n, alternates(false));
    space(true);
  }
  if (!rules.has("root")) err("no root");
  return rules;
}

export function charsMatch(item, cp) {
  let inside = false;
  for (const [lo, hi] of item.ranges) if (cp >= lo && cp <= hi) inside = true;
  return inside !== item.neg;
}

// ---- Earley recognition ---------------------------------------------------------------------
// Flattens the AST into productions over symbols (nonterminal ids, or terminal items), then
// recognizes code point strings with Earley's algorithm (Aycock-Horspool handling of nullable
// nonterminals: predicting a nullable one also moves the dot over it).
export class Recognizer {
  constructor(rules) {
    this.prods = []; // {lhs, rhs: [{nt} | {term}]}
    this.byLhs = [];
    const ids = new Map();
    const nt = (key) => {
      if (!ids.has(key)) {
        ids.set(key, this.byLhs.length);
        this.byLhs.push([]);
      }
      return ids.get(key);
    };
    let fresh = 0;
    const addProd = (lhs, rhs) => {
      this.byLhs[lhs].push(this.prods.length);
      this.prods.push({ lhs, rhs });
    };
    const seqSyms = (seq) => seq.flatMap(itemSyms);
    const groupNt = (alts) => {
      const id = nt(`#${fresh++}`);
      for (const s of alts) addProd(id, seqSyms(s));
      return id;
    };
    const itemSyms = (item) => {
      if (item.t === "chars") return [{ term: item }];
      if (item.t === "ref") {
        if (!rules.has(item.name)) throw new Error(`undefined rule ${item.name}`);
        return [{ nt: nt(item.name) }];
      }
      if (item.t === "group") return [{ nt: groupNt(item.alts) }];
      // rep: min copies, then a star nonterminal or a chain of optionals
      const x = itemSyms(item.item);
      const out = [];
      for (let k = 0; k < item.min; k++) out.push(...x);
      if (item.max === Infinity) {
        const star = nt(`#${fresh++}`);
        addProd(star, []);
        addProd(star, [...x, { nt: star }]);
        out.push({ nt: star });
      } else {
        let prev = null;
        for (let k = item.min; k < item.max; k++) {
          const opt = nt(`#${fresh++}`);
          addProd(opt, []);
          addProd(opt, prev === null ? [...x] : [...x, { nt: prev }]);
          prev = opt;
        }
        if (prev !== null) out.push({ nt: prev });
      }
      return out;
    };
    for (const [name, alts] of rules) {
      const id = nt(name);
      for (const s of alts) addProd(id, seqSyms(s));
    }
    this.start = nt("root");
    // nullable nonterminals
    this.nullable = new Array(this.byLhs.length).fill(false);
    for (let changed = true; changed; ) {
      changed = false;
      for (const p of this.prods) {
        if (this.nullable[p.lhs]) continue;
        if (p.rhs.every((s) => s.nt !== undefined && this.nullable[s.nt])) {
          this.nullable[p.lhs] = true;
          changed = true;
        }
      }
    }
  }

  // 1: complete match, 0: a proper prefix of some match, -1: not even a prefix.
  recognize(text) {
    const cps = Array.from(text).map((c) => c.codePointAt(0));
    const n = cps.length;
    const sets = [];
    const keys = [];
    const add = (k, p, dot, origin) => {
      const key = (p * 1024 + dot) * (n + 1) + origin;
      if (keys[k].has(key)) return;
      keys[k].add(key);
      sets[k].push([p, dot, origin]);
    };
    for (let k = 0; k <= n; k++) {
      sets.push([]);
      keys.push(new Set());
    }
    for (const p of this.byLhs[this.start]) add(0, p, 0, 0);
    for (let k = 0; k <= n; k++) {
      const set = sets[k];
      for (let j = 0; j < set.length; j++) {
        const [p, dot, origin] = set[j];
        const rhs = this.prods[p].rhs;
        if (dot === rhs.length) {
          // complete
          const lhs = this.prods[p].lhs;
          for (const [q, d, o] of sets[origin]) {
            const s = this.prods[q].rhs[d];
            if (s && s.nt === lhs) add(k, q, d + 1, o);
          }
          continue;
        }
        const s = rhs[dot];
        if (s.nt !== undefined) {
          for (const q of this.byLhs[s.nt]) add(k, q, 0, k);
          if (this.nullable[s.nt]) add(k, p, dot + 1, origin);
        } else if (k < n && charsMatch(s.term, cps[k])) {
          add(k + 1, p, dot + 1, origin);
        }
      }
      if (k < n && sets[k + 1].length === 0) return -1;
    }
    for (const [p, dot, origin] of sets[n])
      if (origin === 0 && this.prods[p].lhs === this.start && dot === this.prods[p].rhs.length) return 1;
    return 0;
  }
}

// ---- bounding --------------------------------------------------------------------------------
// Rewrites `rules` so that every derivation has depth <= depth (rule references nested) and every
// unbounded repetition at most `extra` more than its minimum. The result's language is a subset
// of the original's. `forbid` (a code point, optional) is taken out of every character class, so
// that it can separate samples. Returns GBNF text.
export function bound(rules, depth, extra, forbid = -1) {
  const possible = new Map(); // `${name}@${d}` -> converted alts (null: impossible)
  const conv = (item, d) => {
    if (item.t === "chars") {
      if (forbid < 0) return item;
      if (item.neg) return { t: "chars", neg: true, ranges: [...item.ranges, [forbid, forbid]] };
      const ranges = [];
      for (const [lo, hi] of item.ranges) {
        if (forbid < lo || forbid > hi) ranges.push([lo, hi]);
        else {
          if (lo < forbid) ranges.push([lo, forbid - 1]);
          if (forbid < hi) ranges.push([forbid + 1, hi]);
        }
      }
      return ranges.length ? { t: "chars", neg: false, ranges } : null;
    }
    if (item.t === "ref") return d + 1 <= depth && possible.get(`${item.name}@${d + 1}`) ? { t: "ref", name: `${item.name}__${d + 1}` } : null;
    if (item.t === "group") {
      const alts = item.alts.map((s) => convSeq(s, d)).filter((s) => s !== null);
      return alts.length ? { t: "group", alts } : null;
    }
    const x = conv(item.item, d);
    if (x === null) return item.min === 0 ? { t: "group", alts: [[]] } : null;
    return { t: "rep", item: x, min: item.min, max: item.max === Infinity ? item.min + extra : item.max };
  };
  const convSeq = (seq, d) => {
    const out = [];
    for (const it of seq) {
      const c = conv(it, d);
      if (c === null) return null;
      out.push(c);
    }
    return out;
  };
  for (let d = depth; d >= 0; d--) {
    for (const [name, alts] of rules) {
      const c = alts.map((s) => convSeq(s, d)).filter((s) => s !== null);
      possible.set(`${name}@${d}`, c.length ? c : null);
    }
  }
  if (!possible.get("root@0")) throw new Error("bound: root impossible at this depth");
  const esc = (cp) => {
    if (cp === 0x5c || cp === 0x22 || cp === 0x5d || cp === 0x5b || cp === 0x2d || cp === 0x5e) return "\\" + String.fromCodePoint(cp);
    if (cp < 0x20 || cp === 0x7f || cp > 0x7e) return "\\U" + cp.toString(16).padStart(8, "0");
    return String.fromCodePoint(cp);
  };
  const show = (item) => {
    if (item.t === "chars") return `[${item.neg ? "^" : ""}${item.ranges.map(([lo, hi]) => (lo === hi ? esc(lo) : `${esc(lo)}-${esc(hi)}`)).join("")}]`;
    if (item.t === "ref") return item.name;
    if (item.t === "group") return `(${item.alts.map((s) => s.map(show).join(" ")).join(" | ")})`;
    return `${show(item.item)}{${item.min},${item.max}}`;
  };
  let out = "root ::= root__0\n";
  for (const [key, alts] of possible) {
    if (!alts) continue;
    const [name, d] = key.split("@");
    out += `${name}__${d} ::= ${alts.map((s) => s.map(show).join(" ")).join(" | ")}\n`;
  }
  return out;
}
