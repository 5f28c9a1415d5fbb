// The response shapes the `ollama` npm client declares, read from its own TypeScript declarations
// (node_modules/ollama/dist/*.d.ts) at test time, and a validator for them:
//
//   validate(typeName, value, path, { omit })  throws an AssertionError naming every path where
//       a required field is missing or a field has the wrong type (the declared type and what
//       came); fields the interface does not declare are returned, not failed ({extra}).
//       omit: ["Type.field", ...] required fields that may be absent (each one absent is
//       returned in {omitted}, so a caller can tell when an allowance is no longer needed);
//       a field that is there is always checked.
//   responseTypeOf(method)  the type a client method resolves to (or streams), from the
//       declaration of class Ollama: "ps" -> "ListResponse".
//   declared(typeName)  the parsed members of an interface (with what it extends).
//
// Types understood: string, number, boolean, any, unknown, object, null, undefined, Date,
// Uint8Array, string/number literals, T[], Array<T>, Partial<T>, Record<K, V>, Map<K, V>,
// { [key: string]: V }, inline { a: T; ... } objects, named interfaces (with extends) and type
// aliases, unions and parentheses. Anything else in a declaration a response reaches makes the
// parse throw: a check that cannot check must not pass.
//
// JSON has no Date and no Map. The client returns `await response.json()` (and JSON.parse of
// each NDJSON line) unchanged, converting nothing (checked below: its code has no `new Date`),
// so what a user gets for a `Date` field is the server's string: "Date" accepts a Date object or
// an RFC 3339 date-time string, and Map<string, V> accepts a JSON object whose values are V.
import assert from "node:assert/strict";
import { readFileSync, existsSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join, resolve } from "node:path";

const require = createRequire(import.meta.url);
const pkgPath = require.resolve("ollama/package.json");
const pkgDir = dirname(pkgPath);
const pkg = JSON.parse(readFileSync(pkgPath, "utf8"));
export const clientVersion = pkg.version;

// ---- reading the declarations --------------------------------------------------------------

// The package's types file and every relative module it imports from (index.d.ts re-exports
// browser.d.ts's declarations).
function declarationFiles() {
  const first = resolve(pkgDir, pkg.types || pkg.typings || "dist/index.d.ts");
  const seen = new Map();
  const todo = [first];
  while (todo.length) {
    const f = todo.pop();
    if (seen.has(f)) continue;
    if (!existsSync(f)) throw new Error(`ollama_shapes: the ollama client's declaration file ${f} is missing`);
    const text = readFileSync(f, "utf8");
    seen.set(f, text);
    for (const m of text.matchAll(/\bfrom\s+['"](\.{1,2}\/[^'"]+)['"]/g)) {
      todo.push(resolve(dirname(f), m[1].replace(/\.(c|m)?js$/, ".d.ts").replace(/^(?!.*\.d\.ts$)(.*)$/, "$1.d.ts")));
    }
  }
  return seen;
}

function tokenize(text, file) {
  const toks = [];
  const re = /\s+|\/\*[\s\S]*?\*\/|\/\/[^\n]*|([A-Za-z_$][\w$]*)|('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")|(-?\d+(?:\.\d+)?)|([{}()[\]<>;:,?|&=.*!+-])|(\S)/y;
  let m;
  while (re.lastIndex < text.length && (m = re.exec(text))) {
    if (m[1] !== undefined) toks.push({ k: "id", v: m[1] });
    else if (m[2] !== undefined) toks.push({ k: "str", v: JSON.parse(m[2][0] === "'" ? `"${m[2].slice(1, -1).replace(/"/g, '\\"')}"` : m[2]) });
    else if (m[3] !== undefined) toks.push({ k: "num", v: Number(m[3]) });
    else if (m[4] !== undefined) toks.push({ k: "p", v: m[4] });
    else if (m[5] !== undefined) toks.push({ k: "p", v: m[5] });
  }
  for (const t of toks) t.file = file;
  return toks;
}

const files = declarationFiles();
// name -> { kind: "interface"|"type", toks, at } (the first declaration of a name wins, and a
// second, different one is an error: declaration merging would change the shape).
const decls = new Map();
let classOllama = "";
for (const [file, text] of files) {
  const toks = tokenize(text, file);
  let depth = 0;
  for (let i = 0; i < toks.length; i++) {
    const t = toks[i];
    if (t.k === "p" && (t.v === "{" || t.v === "(")) depth++;
    else if (t.k === "p" && (t.v === "}" || t.v === ")")) depth--;
    else if (depth === 0 && t.k === "id" && (t.v === "interface" || t.v === "type") && toks[i + 1]?.k === "id") {
      if (t.v === "type" && !(toks[i + 2]?.v === "=" || toks[i + 2]?.v === "<")) continue;
      const name = toks[i + 1].v;
      if (decls.has(name) && decls.get(name).file !== file)
        throw new Error(`ollama_shapes: ${name} is declared twice (${decls.get(name).file} and ${file})`);
      if (!decls.has(name)) decls.set(name, { kind: t.v, toks, at: i + 2, file });
    }
  }
  const cls = text.match(/declare class Ollama \{([\s\S]*?)\n\}/);
  if (cls && /\bps\(\)/.test(cls[1])) classOllama = cls[1];
}
if (decls.size === 0) throw new Error(`ollama_shapes: no interface or type declarations found in ${[...files.keys()].join(", ")}`);
if (!classOllama) throw new Error(`ollama_shapes: no "declare class Ollama { ... }" with ps() in ${[...files.keys()].join(", ")}`);

const BUILTIN_PRIM = new Set(["string", "number", "boolean", "any", "unknown", "object", "null", "undefined"]);
const BUILTIN_GENERIC = new Set(["Array", "Partial", "Record", "Map"]);

class Parser {
  constructor(toks, at, what) {
    this.toks = toks;
    this.i = at;
    this.what = what;
  }
  peek(o = 0) {
    return this.toks[this.i + o];
  }
  fail(msg) {
    const near = this.toks.slice(Math.max(0, this.i - 6), this.i + 6).map((t) => (t.k === "str" ? JSON.stringify(t.v) : t.v)).join(" ");
    throw new Error(`ollama_shapes: cannot parse ${this.what} in ${this.toks[0]?.file}: ${msg}, near: ${near}`);
  }
  is(v) {
    const t = this.peek();
    return t && t.k === "p" && t.v === v;
  }
  eat(v) {
    if (!this.is(v)) this.fail(`expected "${v}", got ${JSON.stringify(this.peek()?.v)}`);
    this.i++;
  }
  id() {
    const t = this.peek();
    if (!t || t.k !== "id") this.fail(`expected a name, got ${JSON.stringify(t?.v)}`);
    this.i++;
    return t.v;
  }
  // type := ['|'] inter ('|' inter)*
  type() {
    if (this.is("|")) this.i++;
    const of = [this.postfix()];
    while (this.is("|")) {
      this.i++;
      of.push(this.postfix());
    }
    if (this.is("&")) this.fail("intersection types are not understood");
    return of.length === 1 ? of[0] : { k: "union", of };
  }
  postfix() {
    let t = this.primary();
    while (this.is("[") && this.peek(1)?.v === "]") {
      this.i += 2;
      t = { k: "array", of: t };
    }
    if (this.is("[")) this.fail("indexed access types are not understood");
    return t;
  }
  primary() {
    const t = this.peek();
    if (!t) this.fail("unexpected end");
    if (t.k === "str" || t.k === "num") {
      this.i++;
      return { k: "lit", v: t.v };
    }
    if (t.k === "p" && t.v === "(") {
      this.i++;
      const inner = this.type();
      this.eat(")");
      return inner;
    }
    if (t.k === "p" && t.v === "{") return this.object();
    if (t.k !== "id") this.fail(`unexpected ${JSON.stringify(t.v)}`);
    const name = this.id();
    if (name === "true" || name === "false") return { k: "lit", v: name === "true" };
    if (["typeof", "keyof", "infer", "readonly"].includes(name)) this.fail(`"${name}" is not understood`);
    if (this.is(".")) this.fail("qualified names are not understood");
    let args = [];
    if (this.is("<")) {
      this.i++;
      args.push(this.type());
      while (this.is(",")) {
        this.i++;
        args.push(this.type());
      }
      this.eat(">");
    }
    if (BUILTIN_PRIM.has(name)) {
      if (args.length) this.fail(`${name} takes no type arguments`);
      return { k: "prim", name };
    }
    if (name === "Date" || name === "Uint8Array") return { k: "class", name };
    if (BUILTIN_GENERIC.has(name)) {
      const want = name === "Array" || name === "Partial" ? 1 : 2;
      if (args.length !== want) this.fail(`${name} takes ${want} type argument(s), got ${args.length}`);
      if (name === "Array") return { k: "array", of: args[0] };
      if (name === "Partial") return { k: "partial", of: args[0] };
      return { k: "record", key: args[0], of: args[1], map: name === "Map" };
    }
    if (args.length) this.fail(`type arguments to ${name} are not understood`);
    return { k: "ref", name };
  }
  // { a: T; b?: U; [key: string]: V; }
  object() {
    this.eat("{");
    const fields = new Map();
    let index = null;
    while (!this.is("}")) {
      if (this.peek()?.v === "readonly" && this.peek(1)?.k === "id") this.i++;
      if (this.is("[")) {
        this.i++;
        this.id();
        this.eat(":");
        const key = this.type();
        if (!(key.k === "prim" && key.name === "string")) this.fail("only [key: string] index signatures are understood");
        this.eat("]");
        this.eat(":");
        index = this.type();
      } else {
        const t = this.peek();
        if (!t || (t.k !== "id" && t.k !== "str")) this.fail(`expected a member name, got ${JSON.stringify(t?.v)}`);
        this.i++;
        const name = t.v;
        let optional = false;
        if (this.is("?")) {
          this.i++;
          optional = true;
        }
        if (this.is("(") || this.is("<")) this.fail(`method signature ${name}(...) is not understood in a response type`);
        this.eat(":");
        if (fields.has(name)) this.fail(`member ${name} declared twice`);
        fields.set(name, { type: this.type(), optional });
      }
      if (this.is(";") || this.is(",")) this.i++;
      else if (!this.is("}")) this.fail(`expected ";" or "}", got ${JSON.stringify(this.peek()?.v)}`);
    }
    this.eat("}");
    return { k: "object", fields, index };
  }
}

const parsed = new Map();
// A declaration, parsed: interfaces as { k: "object", fields, index } with their extends
// merged in, aliases as their type.
export function declared(name) {
  if (parsed.has(name)) {
    const p = parsed.get(name);
    if (p === "busy") throw new Error(`ollama_shapes: ${name} extends itself`);
    return p;
  }
  const d = decls.get(name);
  if (!d) throw new Error(`ollama_shapes: the ollama client ${clientVersion} declares no interface or type named ${name} (in ${[...files.keys()].join(", ")})`);
  parsed.set(name, "busy");
  const p = new Parser(d.toks, d.at, `${d.kind} ${name}`);
  let out;
  if (d.kind === "type") {
    if (p.is("<")) p.fail("generic type aliases are not understood");
    p.eat("=");
    out = p.type();
    p.eat(";");
  } else {
    if (p.is("<")) p.fail("generic interfaces are not understood");
    const bases = [];
    if (p.peek()?.v === "extends") {
      p.i++;
      bases.push(p.id());
      while (p.is(",")) {
        p.i++;
        bases.push(p.id());
      }
    }
    const body = p.object();
    const fields = new Map();
    let index = body.index;
    for (const b of bases) {
      const bt = declared(b);
      if (bt.k !== "object") p.fail(`${name} extends ${b}, which is not an interface`);
      for (const [k, v] of bt.fields) fields.set(k, v);
      index = index || bt.index;
    }
    for (const [k, v] of body.fields) fields.set(k, v); // the interface's own declaration wins
    out = { k: "object", fields, index, name, bases };
  }
  parsed.set(name, out);
  return out;
}

// The type a client method gives: `Promise<T>` or `Promise<AbortableAsyncIterator<T>>`, the same
// T for every overload (generate's streamed and not).
export function responseTypeOf(method) {
  const re = new RegExp(`\\b${method}\\(([^()]*)\\)\\s*:\\s*Promise<(?:AbortableAsyncIterator<)?([A-Za-z_$][\\w$]*)>`, "g");
  const types = new Set([...classOllama.matchAll(re)].map((m) => m[2]));
  if (types.size !== 1) throw new Error(`ollama_shapes: class Ollama's ${method}() should resolve to one declared type, found ${JSON.stringify([...types])}`);
  return [...types][0];
}

export function typeText(t) {
  switch (t.k) {
    case "prim":
      return t.name;
    case "class":
      return t.name;
    case "lit":
      return JSON.stringify(t.v);
    case "array":
      return (t.of.k === "union" ? `(${typeText(t.of)})` : typeText(t.of)) + "[]";
    case "union":
      return t.of.map(typeText).join(" | ");
    case "ref":
      return t.name;
    case "partial":
      return `Partial<${typeText(t.of)}>`;
    case "record":
      return `${t.map ? "Map" : "Record"}<${typeText(t.key)}, ${typeText(t.of)}>`;
    case "object":
      if (t.name) return t.name;
      return `{ ${[
        ...[...t.fields].map(([k, f]) => `${k}${f.optional ? "?" : ""}: ${typeText(f.type)}`),
        ...(t.index ? [`[key: string]: ${typeText(t.index)}`] : []),
      ].join("; ")} }`;
  }
  return "?";
}

// Every reference in a type resolves to a declaration the parser understands (checked up front
// for the response types, so that a declaration changed in a new client fails at once, not only
// when a response happens to carry that field).
function resolveAll(t, seen = new Set()) {
  switch (t.k) {
    case "ref":
      if (!seen.has(t.name)) {
        seen.add(t.name);
        resolveAll(declared(t.name), seen);
      }
      return seen;
    case "array":
    case "partial":
      return resolveAll(t.of, seen);
    case "union":
      t.of.forEach((x) => resolveAll(x, seen));
      return seen;
    case "record":
      resolveAll(t.key, seen);
      return resolveAll(t.of, seen);
    case "object":
      for (const f of t.fields.values()) resolveAll(f.type, seen);
      if (t.index) resolveAll(t.index, seen);
      return seen;
  }
  return seen;
}

// The client converts nothing it receives (no Date, no Map): what the server sent is what the
// user gets. If a later client starts converting, the premise of "Date accepts a string" is
// worth re-reading, so this fails.
for (const f of ["dist/browser.mjs", "dist/index.mjs"]) {
  const p = join(pkgDir, f);
  if (existsSync(p) && /new Date\(|new Map\(|\.(created_at|modified_at|expires_at)\s*=/.test(readFileSync(p, "utf8")))
    throw new Error(`ollama_shapes: ${p} now converts response fields (new Date / new Map): validate what it returns, not the raw JSON`);
}

export const RESPONSE_TYPES = [
  "GenerateResponse", "ChatResponse", "Message", "ToolCall", "Logprob", "TokenLogprob", "ListResponse", "ModelResponse",
  "ModelDetails", "ShowResponse", "EmbedResponse", "EmbeddingsResponse", "ProgressResponse", "VersionResponse",
  "StatusResponse", "ErrorResponse",
];
for (const name of RESPONSE_TYPES) {
  const t = declared(name);
  if (t.k !== "object" || t.fields.size === 0) throw new Error(`ollama_shapes: ${name} parsed to no fields: ${typeText(t)}`);
  resolveAll({ k: "ref", name });
}

// ---- validating ------------------------------------------------------------------------------

const RFC3339 = /^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$/;
const isPlainObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v) && !(v instanceof Date) && !(v instanceof Map);

function got(v) {
  if (v === undefined) return "nothing (the field is missing)";
  let s;
  try {
    s = JSON.stringify(v instanceof Map ? Object.fromEntries(v) : v);
  } catch {
    s = String(v);
  }
  if (s === undefined) s = String(v);
  if (s.length > 100) s = s.slice(0, 97) + "...";
  const kind = v === null ? "null" : Array.isArray(v) ? "array" : v instanceof Date ? "Date" : v instanceof Map ? "Map" : typeof v;
  return `${s} (${kind})`;
}

class Checker {
  constructor(omit) {
    this.omit = new Set(omit || []);
    this.errors = [];
    this.extra = [];
    this.omitted = [];
  }
  err(path, t, v, note = "") {
    this.errors.push(`${path}: declared ${typeText(t)}${note}, got ${got(v)}`);
  }
  check(t, v, path, partial = false) {
    switch (t.k) {
      case "prim":
        switch (t.name) {
          case "any":
          case "unknown":
            return;
          case "null":
            if (v !== null) this.err(path, t, v);
            return;
          case "undefined":
            if (v !== undefined) this.err(path, t, v);
            return;
          case "object":
            if (v === null || typeof v !== "object") this.err(path, t, v);
            return;
          case "number":
            if (typeof v !== "number" || !Number.isFinite(v)) this.err(path, t, v);
            return;
          default:
            if (typeof v !== t.name) this.err(path, t, v);
            return;
        }
      case "class":
        if (t.name === "Date") {
          if (v instanceof Date ? Number.isNaN(v.getTime()) : !(typeof v === "string" && RFC3339.test(v) && Number.isFinite(Date.parse(v.replace(/(\.\d{3})\d+/, "$1")))))
            this.err(path, t, v, " (a Date, or in JSON an RFC 3339 date-time string)");
        } else if (!(v instanceof Uint8Array)) this.err(path, t, v);
        return;
      case "lit":
        if (v !== t.v) this.err(path, t, v);
        return;
      case "array":
        if (!Array.isArray(v)) return this.err(path, t, v);
        v.forEach((x, i) => this.check(t.of, x, `${path}[${i}]`));
        return;
      case "union": {
        // The first branch that takes the value wins; if none does, one error naming the union.
        for (const b of t.of) {
          const sub = new Checker(this.omit);
          sub.check(b, v, path, partial);
          if (sub.errors.length === 0) {
            this.extra.push(...sub.extra);
            this.omitted.push(...sub.omitted);
            return;
          }
        }
        return this.err(path, t, v);
      }
      case "ref":
        return this.check(declared(t.name), v, path, partial);
      case "partial":
        return this.check(t.of.k === "ref" ? declared(t.of.name) : t.of, v, path, true);
      case "record":
        if (v instanceof Map) {
          for (const [k, x] of v) {
            this.check(t.key, k, `${path} key ${JSON.stringify(k)}`);
            this.check(t.of, x, `${path}[${JSON.stringify(k)}]`);
          }
          return;
        }
        // JSON has no Map: a JSON object stands for Map<string, V> (what the client returns).
        if (!isPlainObject(v)) return this.err(path, t, v, t.map ? " (in JSON an object)" : "");
        for (const [k, x] of Object.entries(v)) {
          this.check(t.key, k, `${path} key ${JSON.stringify(k)}`);
          this.check(t.of, x, `${path}.${k}`);
        }
        return;
      case "object": {
        if (!isPlainObject(v)) return this.err(path, t, v);
        const where = t.name || "an inline object";
        for (const [k, f] of t.fields) {
          const fp = `${path}.${k}`;
          if (!Object.prototype.hasOwnProperty.call(v, k)) {
            if (f.optional || partial) continue;
            if (t.name && this.omit.has(`${t.name}.${k}`)) {
              this.omitted.push(`${t.name}.${k}`);
              continue;
            }
            this.err(fp, f.type, undefined, ` (required in ${where})`);
            continue;
          }
          this.check(f.type, v[k], fp);
        }
        for (const k of Object.keys(v)) {
          if (t.fields.has(k)) continue;
          if (t.index) this.check(t.index, v[k], `${path}.${k}`);
          else this.extra.push({ path: `${path}.${k}`, field: `${where}.${k}`, value: got(v[k]) });
        }
        return;
      }
    }
    throw new Error(`ollama_shapes: internal: unknown type node ${JSON.stringify(t)}`);
  }
}

// Validates `value` against the client's declaration `typeName`. Throws an AssertionError listing
// every problem (path, declared type, what came); returns { extra, omitted }: the fields the
// interface does not declare ({path, field, value}) and the allowed omissions that occurred.
export function validate(typeName, value, path = typeName, { omit = [] } = {}) {
  for (const o of omit) {
    const [type, field] = o.split(".");
    const d = declared(type);
    if (d.k !== "object" || !d.fields.has(field) || d.fields.get(field).optional)
      throw new Error(`ollama_shapes: omit ${o}: ${type} declares no required field ${field}`);
  }
  const c = new Checker(omit);
  c.check({ k: "ref", name: typeName }, value, path);
  if (c.errors.length) {
    throw new assert.AssertionError({
      message: `not the ${typeName} the ollama client ${clientVersion} declares:\n  ${c.errors.join("\n  ")}`,
      actual: value,
      expected: typeText(declared(typeName)),
      operator: "validate",
    });
  }
  return { extra: c.extra, omitted: [...new Set(c.omitted)] };
}
