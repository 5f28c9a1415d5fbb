// Samples tern's grammar-constrained outputs and checks each with an independent validator.
//   node validate.mjs TERN_BINARY MODEL GRAMMARS_DIR SAMPLES
// For each of llama.cpp's example grammars (json, arithmetic, list, c):
//   1. the grammar must parse in tern (tern run exits 0 with it);
//   2. SAMPLES outputs are drawn at temperature 1.5 (top-k 200, no top-p / min-p), on a model
//      with random weights and a real 32000-token vocabulary, so outputs are diverse. The model
//      would wander forever inside unbounded repetitions, so tern samples under bound(grammar):
//      the same rules with repetitions and recursion depth capped (gbnf.mjs), a sub-language;
//   3. every output that finished ("stop") must be a complete match of the ORIGINAL grammar
//      for an Earley recognizer over the .gbnf file (and JSON.parse for json); an output cut by
//      -n must at least be a valid prefix, and at least 95% must finish.
// Then the JSON-schema case: SAMPLES outputs under --json-schema, each valid for ajv.
//
// Many samples are drawn in one `tern run`, so that 1,000 take seconds, not a process start
// each: the bounded grammar is wrapped, root ::= S "\x1E" root, with the separator taken out of
// every character class of S, and the text is split on it; every part but the last of a run is
// a complete sample (the last one, cut by -n, must be a valid prefix). The JSON-schema case
// wraps the schema instead: {"type": "array", "items": SCHEMA, "minItems": 10}, each item one sample. Runs go in
// parallel, with a new seed each, until there are SAMPLES complete ones.
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

import Ajv2020 from "ajv/dist/2020.js";

import { bound, parseGbnf, Recognizer } from "./gbnf.mjs";

const [tern, model, grammarsDir, samplesArg] = process.argv.slice(2);
const samples = Number(samplesArg || 1000);
const work = fs.mkdtempSync(path.join(os.tmpdir(), "tern-grammar-"));
const jobs = Number(process.env.TERN_TEST_JOBS || Math.min(4, os.cpus().length));
const SEP = "\x1e";

function runTern(args) {
  return new Promise((resolve, reject) => {
    const p = spawn(tern, args, { stdio: ["ignore", "pipe", "pipe"] });
    // Chunks are kept as bytes and decoded once: a pipe chunk may end inside a UTF-8
    // sequence, and decoding chunk by chunk would turn that character into two U+FFFD.
    // The decoder is fatal, so invalid UTF-8 from tern fails the test instead of hiding.
    const out = [];
    const err = [];
    p.stdout.on("data", (d) => out.push(d));
    p.stderr.on("data", (d) => err.push(d));
    p.on("close", (code) => {
      if (code !== 0) {
        reject(new Error(`tern ${args.join(" ")} exited ${code}: ${Buffer.concat(err)}`));
        return;
      }
      try {
        resolve(JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(Buffer.concat(out))));
      } catch (e) {
        reject(new Error(`tern ${args.join(" ")}: output is not valid UTF-8 JSON: ${e.message}`));
      }
    });
  });
}

async function pool(n, fn) {
  const results = new Array(n);
  let next = 0;
  const worker = async () => {
    while (next < n) {
      const i = next++;
      results[i] = await fn(i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(jobs, n) }, worker));
  return results;
}

// Runs `tern run` (new seeds, `jobs` at a time) until `parse(result)` has given `samples`
// complete samples; returns them with the incomplete ones and the runs' totals.
async function sampleRuns(makeArgs, parse, seedBase) {
  const complete = [];
  const incomplete = [];
  let constraintMs = 0;
  let tokens = 0;
  let runs = 0;
  while (complete.length < samples) {
    const results = await pool(jobs, (i) => runTern(makeArgs(seedBase + runs + i)));
    runs += results.length;
    for (const r of results) {
      constraintMs += r.metrics.constraint_ms;
      tokens += r.metrics.n_generated;
      parse(r, complete, incomplete);
    }
  }
  return { complete: complete.slice(0, samples), incomplete, constraintMs, tokens, runs };
}

function splitSamples(r, complete, incomplete) {
  const parts = r.text.split(SEP);
  const last = parts.pop();
  complete.push(...parts);
  // Empty after the last separator: the run ended there (EOG), nothing was cut.
  if (!(last === "" && r.finish_reason === "stop")) incomplete.push(last);
}

function wrap(gbnfText) {
  // Rename the grammar's root, then root ::= S SEP root: never complete, so a run goes on to
  // -n (no EOG), and right-recursive, so every sample starts from the same state and the
  // constraint's caches are reused from sample to sample.
  const renamed = gbnfText.replace(/^root(\s*::=)/m, "sample-root$1");
  return `root ::= sample-root "\\x1E" root\n${renamed}`;
}

// Temperature 1.5 over the 200 best allowed tokens (top-k keeps the sampler's softmax off the
// masked -inf tail, which costs more than the model here), no top-p / min-p.
const common = ["--threads", "1", "--temp", "1.5", "--top-k", "200", "--top-p", "1", "--min-p", "0", "--json"];
const runTokens = Number(process.env.TERN_GRAMMAR_RUN_TOKENS || 2000);

let failures = 0;
const fail = (msg) => {
  failures++;
  if (failures <= 20) console.log(`FAIL ${msg}`);
};

const cases = [
  { name: "json", depth: 8, extra: 3 },
  { name: "arithmetic", depth: 8, extra: 2 },
  { name: "list", depth: 4, extra: 3 },
  { name: "c", depth: 10, extra: 2 },
];

const t0 = Date.now();
for (const c of cases) {
  const tc = Date.now();
  const original = fs.readFileSync(path.join(grammarsDir, `${c.name}.gbnf`), "utf8");
  const rules = parseGbnf(original);
  const rec = new Recognizer(rules);
  // 1. the original grammar parses in tern (a short run under it).
  const origFile = path.join(work, `${c.name}.gbnf`);
  fs.writeFileSync(origFile, original);
  await runTern(["run", "-m", model, "--ctx", "64", "-n", "8", "-s", "1", ...common, "--grammar-file", origFile]);
  // 2. samples under the bounded grammar.
  const boundedFile = path.join(work, `${c.name}.bounded.gbnf`);
  fs.writeFileSync(boundedFile, wrap(bound(rules, c.depth, c.extra, SEP.codePointAt(0))));
  const { complete, incomplete, constraintMs, tokens, runs } = await sampleRuns(
    (seed) => ["run", "-m", model, "--ctx", String(runTokens + 8), "-n", String(runTokens), "-s", String(seed), ...common,
               "--grammar-file", boundedFile],
    splitSamples, 1000);
  const tv = Date.now();
  // 3. the independent checks, against the original grammar.
  for (const text of complete) {
    if (rec.recognize(text) !== 1) fail(`${c.name}: output not accepted by the Earley recognizer: ${JSON.stringify(text)}`);
    if (c.name === "json") {
      try {
        JSON.parse(text);
      } catch (e) {
        fail(`json: JSON.parse refused ${JSON.stringify(text)}: ${e.message}`);
      }
    }
  }
  for (const text of incomplete)
    if (rec.recognize(text) < 0) fail(`${c.name}: a truncated output is not even a prefix: ${JSON.stringify(text)}`);
  const distinct = new Set(complete).size;
  console.log(`${c.name}: ${complete.length} complete samples accepted by the Earley recognizer` +
              `${c.name === "json" ? " and JSON.parse" : ""} (${distinct} distinct), ${incomplete.length} cut by -n ` +
              `(valid prefixes), ${runs} runs, ${tokens} tokens, constraint ${(constraintMs / Math.max(tokens, 1)).toFixed(3)} ms/token; ${((tv - tc) / 1000).toFixed(1)} s sampling, ${((Date.now() - tv) / 1000).toFixed(1)} s checking`);
  if (complete.length < samples) fail(`${c.name}: only ${complete.length} samples`);
  if (incomplete.length > 0.05 * samples) fail(`${c.name}: ${incomplete.length} outputs cut by -n`);
  if (distinct < 0.5 * samples) fail(`${c.name}: only ${distinct} distinct outputs`);
}

// The JSON-schema case: nested objects, enums, arrays with minItems / maxItems, required fields.
const schema = {
  type: "object",
  properties: {
    id: { type: "integer" },
    name: { type: "string", minLength: 1, maxLength: 6 },
    kind: { enum: ["cat", "dog", 7, null] },
    owner: {
      type: "object",
      properties: {
        first: { type: "string", maxLength: 4 },
        verified: { type: "boolean" },
        score: { type: "number" },
      },
      required: ["first"],
    },
    tags: { type: "array", items: { type: "string", maxLength: 3 }, minItems: 1, maxItems: 3 },
    point: { type: "array", prefixItems: [{ type: "integer" }, { type: ["number", "null"] }] },
  },
  required: ["id", "kind", "tags"],
  additionalProperties: false,
};
const schemaFile = path.join(work, "schema.json");
fs.writeFileSync(schemaFile, JSON.stringify(schema));
const validate = new Ajv2020({ strict: true, strictTuples: false, allErrors: true }).compile(schema);
{
  const batchFile = path.join(work, "batch-schema.json");
  // At least 10 documents a run (fewer process starts), then as many as the model goes on to.
  fs.writeFileSync(batchFile, JSON.stringify({ type: "array", items: schema, minItems: 10 }));
  const { complete, incomplete, runs, tokens, constraintMs } = await sampleRuns(
    (seed) => ["run", "-m", model, "--ctx", String(2 * runTokens + 8), "-n", String(2 * runTokens), "-s", String(seed),
               ...common, "--json-schema", `@${batchFile}`],
    (r, done, cut) => {
      if (r.finish_reason !== "stop") {
        cut.push(r.text);
        return;
      }
      let docs;
      try {
        docs = JSON.parse(r.text);
      } catch (e) {
        fail(`schema: JSON.parse refused ${JSON.stringify(r.text)}`);
        return;
      }
      if (!Array.isArray(docs)) fail(`schema: not an array: ${r.text}`);
      else done.push(...docs);
    },
    5000);
  for (const doc of complete)
    if (!validate(doc)) fail(`schema: ajv refused ${JSON.stringify(doc)}: ${JSON.stringify(validate.errors)}`);
  const distinct = new Set(complete.map((d) => JSON.stringify(d))).size;
  console.log(`json-schema: ${complete.length} documents valid for ajv (${distinct} distinct), ${incomplete.length} runs cut by -n, ` +
              `${runs} runs, ${tokens} tokens, constraint ${(constraintMs / Math.max(tokens, 1)).toFixed(3)} ms/token`);
  if (incomplete.length > 0.05 * runs) fail(`schema: ${incomplete.length} of ${runs} runs cut by -n`);
  if (distinct < 0.5 * samples) fail(`schema: only ${distinct} distinct documents`);
}

fs.rmSync(work, { recursive: true, force: true });
console.log(`${failures === 0 ? "PASS" : "FAIL"} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
process.exit(failures === 0 ? 0 : 1);
