// Ollama's API and multi-model serving, through the official `ollama` npm client: what a tool
// written for Ollama sees when pointed at `tern serve --models DIR`. run.sh starts the servers
// (every one with --api-key $TERN_TEST_API_KEY --parallel 8 --threads 1 --models $TERN_MODELS_DIR):
//   TERN_BASE_URL     --max-loaded 2 --keep-alive 2m: three models, room for two
//   TERN_BUDGET_URL   --max-memory: the two largest models' /api/ps sizes plus half the smallest
//                     (about 2.5 models), measured by run.sh on a throw-away server
//   TERN_BUDGET_JSON  {"sizes": {NAME: bytes}, "budget": bytes}
//   TERN_BUDGET_PID   the memory-budget server's process (its RSS is read from /proc)
//   TERN_BINARY       the tern binary (`tern ps`, `tern list`)
// The models (TERN_MODELS_DIR): stories (stories260K, F32), sub/tern-stories (Q8_0), babble
// (`tern synth` random weights, Q8_0): three different greedy answers to the same prompt, so a
// request served by the wrong model is caught. The tests run in order and share the servers.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFileSync, statSync, existsSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { Ollama } from "ollama";
import OpenAI from "openai";
import { validate, responseTypeOf, clientVersion } from "./ollama_shapes.mjs";

const base = process.env.TERN_BASE_URL;
const apiKey = process.env.TERN_TEST_API_KEY;
const headers = { Authorization: `Bearer ${apiKey}` };

// ---- response shapes: the ollama client's own TypeScript interfaces (ollama_shapes.mjs) --------
// Every answer must validate against the type the client declares, strictly: every required
// field there, with its declared type. (Ollama's own server leaves some out: expires_at and
// size_vram in /api/tags, modified_at in /api/ps, license/system/messages in /api/show, and
// done_reason, context and the durations on a stream's lines before the last. tern sends them
// all, so that a client written against the declarations never meets a missing field.)
// What the checks saw, over the whole run: fields no interface declares ("Type.field" -> an
// example).
const shapeSeen = { extra: new Map(), checked: 0 };

// Checks one response against the client's declaration `type` (throws naming the field).
function checkShape(type, value, path) {
  const { extra } = validate(type, value, path);
  shapeSeen.checked++;
  for (const e of extra) if (!shapeSeen.extra.has(e.field)) shapeSeen.extra.set(e.field, e);
  return value;
}

// The client, with every answer it gives (and every line of a stream) checked against the type
// its declaration says that method gives. Errors (ResponseError) pass through unchanged.
const SHAPED = ["generate", "chat", "list", "show", "embed", "embeddings", "ps", "version"];
function shaped(client, label) {
  return new Proxy(client, {
    get(target, prop) {
      const v = Reflect.get(target, prop, target);
      if (typeof v !== "function") return v;
      if (!SHAPED.includes(prop)) return v.bind(target);
      const type = responseTypeOf(prop);
      return async (...args) => {
        const what = `${label}.${prop}(${args[0]?.model ?? ""}${args[0]?.stream ? ", stream" : ""})`;
        const r = await v.apply(target, args);
        if (r && typeof r[Symbol.asyncIterator] === "function") {
          return {
            abort: () => r.abort(),
            async *[Symbol.asyncIterator]() {
              let i = 0;
              for await (const part of r) yield checkShape(type, part, `${what} line ${i++}`);
            },
          };
        }
        return checkShape(type, r, what);
      };
    },
  });
}

const ollama = shaped(new Ollama({ host: base, headers }), "ollama");
const budgetOllama = shaped(new Ollama({ host: process.env.TERN_BUDGET_URL, headers }), "budgetOllama");
const openai = new OpenAI({ baseURL: base + "/v1", apiKey, maxRetries: 0, timeout: 120_000 });
const { sizes, budget } = JSON.parse(process.env.TERN_BUDGET_JSON);
const modelsDir = process.env.TERN_MODELS_DIR;
const run = promisify(execFile);

// What the files are (tern list / the GGUF headers): n_embd, training context, details.
const MODELS = {
  babble: { file: "babble.gguf", n_embd: 64, ctx: 2048, quant: "Q8_0", params: "293K" },
  stories: { file: "stories.gguf", n_embd: 64, ctx: 2048, quant: "F32", params: "293K" },
  "tern-stories": { file: "sub/tern-stories.gguf", n_embd: 128, ctx: 256, quant: "Q8_0", params: "1.17M" },
};
const NAMES = Object.keys(MODELS).sort();
const greedy = { temperature: 0, num_predict: 24, seed: 1 };
const PROMPT = "The cat";
const CHAT = [
  { role: "system", content: "You tell short stories." },
  { role: "user", content: "Tell me about a cat." },
];
// The single-request greedy answers, filled by the first generation tests and compared against
// by every later one (both servers serve the same files with the same settings).
const ref = { generate: {}, chat: {} };

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// Go's RFC 3339 with nanoseconds: JS dates take milliseconds.
const parseTime = (s) => Date.parse(String(s).replace(/(\.\d{3})\d+/, "$1"));

function vmKiB(pid, field) {
  const m = readFileSync(`/proc/${pid}/status`, "utf8").match(new RegExp(`^${field}:\\s+(\\d+) kB`, "m"));
  return m ? Number(m[1]) : NaN;
}
const haveProc = existsSync(`/proc/${process.env.TERN_BUDGET_PID}/status`);
// The memory-budget server before any request: nothing loaded (its RSS is the process itself:
// code, HTTP threads, allocator).
const budgetBaselineKiB = haveProc ? vmKiB(process.env.TERN_BUDGET_PID, "VmRSS") : NaN;

function checkDurations(r, what) {
  for (const k of ["total_duration", "load_duration", "prompt_eval_duration", "eval_duration"]) {
    assert.equal(typeof r[k], "number", `${what}: ${k} is a number of nanoseconds, got ${JSON.stringify(r[k])}`);
    assert.ok(r[k] >= 0, `${what}: ${k} >= 0, got ${r[k]}`);
  }
  assert.ok(r.total_duration > 0, `${what}: total_duration > 0`);
  assert.ok(r.total_duration >= r.eval_duration, `${what}: total_duration (${r.total_duration}) >= eval_duration (${r.eval_duration})`);
  assert.ok(Number.isInteger(r.prompt_eval_count) && r.prompt_eval_count > 0, `${what}: prompt_eval_count > 0, got ${r.prompt_eval_count}`);
  assert.ok(Number.isInteger(r.eval_count) && r.eval_count > 0 && r.eval_count <= greedy.num_predict,
    `${what}: 0 < eval_count <= num_predict (${greedy.num_predict}), got ${r.eval_count}`);
  assert.ok(["stop", "length"].includes(r.done_reason), `${what}: done_reason "stop" or "length", got ${JSON.stringify(r.done_reason)}`);
  if (r.done_reason === "length") assert.equal(r.eval_count, greedy.num_predict, `${what}: done_reason "length" after num_predict tokens`);
  assert.ok(Number.isFinite(parseTime(r.created_at)), `${what}: created_at is an RFC 3339 time, got ${r.created_at}`);
}

async function loadedNames(client = ollama) {
  return (await client.ps()).models.map((m) => m.name).sort();
}

// Waits until `pred(names loaded)` holds (an unload after an answer may trail it by a moment).
async function waitPs(pred, what, client = ollama, ms = 3000) {
  const end = Date.now() + ms;
  let names = [];
  while (Date.now() < end) {
    names = await loadedNames(client);
    if (pred(names)) return names;
    await sleep(20);
  }
  assert.fail(`${what}: /api/ps still lists ${JSON.stringify(names)} after ${ms} ms`);
}

// Polls /api/ps every 5 ms in the background; stop() gives the largest count and bytes seen.
function watchPs(client) {
  let stopped = false;
  const seen = { maxCount: 0, maxBytes: 0, maxNames: [], samples: 0, errors: [] };
  const loop = (async () => {
    while (!stopped) {
      try {
        const ps = await client.ps();
        seen.samples++;
        const bytes = ps.models.reduce((s, m) => s + m.size, 0);
        if (ps.models.length > seen.maxCount) {
          seen.maxCount = ps.models.length;
          seen.maxNames = ps.models.map((m) => m.name);
        }
        seen.maxBytes = Math.max(seen.maxBytes, bytes);
      } catch (e) {
        seen.errors.push(String(e));
      }
      await sleep(5);
    }
  })();
  return async () => {
    stopped = true;
    await loop;
    return seen;
  };
}

async function unloadAll(client = ollama) {
  for (const model of NAMES) {
    const r = await client.generate({ model, prompt: "", keep_alive: 0 });
    assert.equal(r.done_reason, "unload", `${model}: a generate with no prompt and keep_alive 0 answers done_reason "unload", got ${JSON.stringify(r.done_reason)}`);
  }
  await waitPs((n) => n.length === 0, "after unloading every model", client);
}

async function streamText(iter, field) {
  let text = "";
  let last = null;
  let chunks = 0;
  for await (const part of iter) {
    chunks++;
    text += field === "response" ? part.response : part.message.content;
    last = part;
  }
  return { text, last, chunks };
}

// A big stream that holds its model: 8 greedy choices with 20 logprobs each, far more bytes than
// the sockets buffer; the client reads the first chunk and then nothing until drain(), so the
// server's handler is stuck writing and the request (and its model) stays in use.
async function holdModel(model) {
  const stream = await openai.chat.completions.create({
    model,
    messages: [{ role: "user", content: "Tell me a long story." }],
    max_tokens: 800,
    n: 8,
    logprobs: true,
    top_logprobs: 20,
    temperature: 0,
    ignore_eos: true,
    stream: true,
  });
  const it = stream[Symbol.asyncIterator]();
  const first = await it.next();
  assert.ok(!first.done && first.value.object === "chat.completion.chunk", `${model}: the holding stream sends a first chunk`);
  return {
    async drain() {
      const text = new Map();
      const tokens = new Map();
      const finish = new Map();
      for (let r = first; !r.done; r = await it.next()) {
        for (const c of r.value.choices) {
          text.set(c.index, (text.get(c.index) || "") + (c.delta?.content || ""));
          tokens.set(c.index, (tokens.get(c.index) || 0) + (c.logprobs?.content?.length || 0));
          if (c.finish_reason) finish.set(c.index, c.finish_reason);
        }
      }
      assert.equal(text.size, 8, `${model}: the holding stream has 8 choices`);
      for (let i = 0; i < 8; i++) {
        assert.equal(finish.get(i), "length", `${model}: choice ${i} ends with finish_reason "length"`);
        assert.equal(tokens.get(i), 800, `${model}: choice ${i} has a logprob entry for each of its 800 tokens`);
        assert.equal(text.get(i), text.get(0), `${model}: greedy choice ${i} equals choice 0`);
      }
    },
  };
}

// ---------------------------------------------------------------------------------------------

test("the shape check reads the client's declarations and rejects what they do not allow", () => {
  for (const [method, type] of Object.entries({
    generate: "GenerateResponse", chat: "ChatResponse", list: "ListResponse", ps: "ListResponse", show: "ShowResponse",
    embed: "EmbedResponse", embeddings: "EmbeddingsResponse", version: "VersionResponse",
  })) assert.equal(responseTypeOf(method), type, `the client ${clientVersion} declares ${method}() to give ${type}`);
  const good = {
    model: "m", created_at: "2025-01-02T03:04:05.123456789Z", response: "x", done: true, done_reason: "stop", context: [1, 2],
    total_duration: 5, load_duration: 1, prompt_eval_count: 2, prompt_eval_duration: 1, eval_count: 3, eval_duration: 1,
  };
  assert.deepEqual(validate("GenerateResponse", good), { extra: [], omitted: [] }, "a whole GenerateResponse validates");
  const rejects = (type, value, pattern, what, opts) =>
    assert.throws(() => validate(type, value, "v", opts), (e) => {
      assert.ok(e instanceof assert.AssertionError, `${what}: an AssertionError, got ${e}`);
      assert.match(e.message, pattern, `${what}: the message names the path, the declared type and what came`);
      return true;
    }, `${what}: rejected`);
  rejects("GenerateResponse", { ...good, eval_count: "3" }, /v\.eval_count: declared number, got "3" \(string\)/, "eval_count a string");
  const { done, ...noDone } = good;
  rejects("GenerateResponse", noDone, /v\.done: declared boolean \(required in GenerateResponse\), got nothing/, "done missing");
  rejects("GenerateResponse", { ...good, created_at: "yesterday" }, /v\.created_at: declared Date .*RFC 3339.*"yesterday"/, "created_at not a time");
  rejects("GenerateResponse", { ...good, context: [1, "2"] }, /v\.context\[1\]: declared number, got "2"/, "a context entry a string");
  rejects("GenerateResponse", { ...good, done_reason: null }, /v\.done_reason: declared string, got null/, "done_reason null");
  rejects("ChatResponse", { ...good, message: { role: "assistant", content: "", tool_calls: [{ function: { name: "f", arguments: "{}" } }] } },
    /v\.message\.tool_calls\[0\]\.function\.arguments: declared \{ \[key: string\]: any \}, got "\{\}" \(string\)/, "tool-call arguments a JSON string");
  rejects("ListResponse", { models: [{ name: "a", model: "a", modified_at: "2025-01-02T03:04:05Z", size: 1, digest: "d", details: {} }] },
    /v\.models\[0\]\.details\.format: declared string \(required in ModelDetails\)/, "details without its fields");
  rejects("ShowResponse", { model_info: [] }, /v\.model_info: declared Map<string, any> \(in JSON an object\), got \[\] \(array\)/, "model_info an array");
  // A streamed line as Ollama's own server writes it (no context, done_reason or durations)
  // fails the strict reading; an allowance takes only its field, only when absent; a field not
  // declared is reported, not failed.
  const chunk = { model: "m", created_at: "2025-01-02T03:04:05Z", response: "x", done: false };
  rejects("GenerateResponse", chunk, /v\.context: declared number\[\]/, "a streamed line without context");
  const METRICS = ["total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration"];
  const omit = ["done_reason", "context", ...METRICS].map((f) => `GenerateResponse.${f}`);
  assert.deepEqual(validate("GenerateResponse", { ...chunk, extra_field: 1 }, "v", { omit }),
    { extra: [{ path: "v.extra_field", field: "GenerateResponse.extra_field", value: "1 (number)" }], omitted: omit },
    "a streamed line with allowances validates; its undeclared field is reported");
  rejects("GenerateResponse", { ...chunk, eval_count: -0.5, total_duration: "1" }, /v\.total_duration: declared number, got "1"/,
    "an allowed field that is there is still checked", { omit });
});

test("version, list and show describe the three models", async () => {
  const v = await ollama.version();
  assert.equal(typeof v.version, "string", "version() gives {version: string}");
  assert.ok(v.version.length > 0, "the version is not empty");

  const list = await ollama.list();
  assert.deepEqual(list.models.map((m) => m.name), NAMES, "list() gives the three models of the directory, by name");
  for (const m of list.models) {
    const want = MODELS[m.name];
    assert.equal(m.model, m.name, `${m.name}: model equals name`);
    assert.equal(m.size, statSync(join(modelsDir, want.file)).size, `${m.name}: size is the file's size`);
    assert.match(m.digest, /^[0-9a-f]{64}$/, `${m.name}: digest is 64 hex digits`);
    assert.ok(Number.isFinite(parseTime(m.modified_at)), `${m.name}: modified_at is an RFC 3339 time, got ${m.modified_at}`);
    assert.equal(m.details.format, "gguf", `${m.name}: details.format "gguf"`);
    assert.equal(m.details.family, "llama", `${m.name}: details.family "llama"`);
    assert.deepEqual(m.details.families, ["llama"], `${m.name}: details.families ["llama"]`);
    assert.equal(m.details.parameter_size, want.params, `${m.name}: details.parameter_size`);
    assert.equal(m.details.quantization_level, want.quant, `${m.name}: details.quantization_level`);
  }

  for (const name of NAMES) {
    const s = await ollama.show({ model: name });
    const listed = list.models.find((m) => m.name === name);
    assert.deepEqual(s.details, listed.details, `${name}: show() has the same details as list()`);
    assert.equal(s.model_info["general.architecture"], "llama", `${name}: model_info general.architecture`);
    assert.equal(s.model_info["llama.embedding_length"], MODELS[name].n_embd, `${name}: model_info llama.embedding_length`);
    assert.equal(s.model_info["llama.context_length"], MODELS[name].ctx, `${name}: model_info llama.context_length`);
    assert.equal(typeof s.template, "string", `${name}: show() has a template string`);
    assert.match(s.modelfile, /^FROM /m, `${name}: the modelfile has a FROM line`);
    assert.ok(Array.isArray(s.capabilities) && s.capabilities.includes("completion"),
      `${name}: capabilities include "completion", got ${JSON.stringify(s.capabilities)}`);
  }
  // models.json: tern-stories' default option, and an alias of stories.
  const ts = await ollama.show({ model: "tern-stories" });
  assert.match(ts.parameters, /^top_k\s+40$/m, `tern-stories: show().parameters lists models.json's top_k 40, got ${JSON.stringify(ts.parameters)}`);
  const alias = await ollama.show({ model: "stories260K" });
  assert.deepEqual(alias.details, list.models.find((m) => m.name === "stories").details, "show() of the alias stories260K describes stories");
  // Nothing is loaded by listing and showing.
  assert.deepEqual(await loadedNames(), [], "ps() lists nothing before any generation");
});

test("generate, not streamed and streamed, on each model", async () => {
  for (const model of NAMES) {
    const whole = await ollama.generate({ model, prompt: PROMPT, options: greedy });
    assert.equal(whole.model, model, `${model}: the answer names its model`);
    assert.equal(whole.done, true, `${model}: the answer is done`);
    assert.equal(typeof whole.response, "string", `${model}: response is a string`);
    assert.ok(whole.response.length > 0, `${model}: the response is not empty`);
    checkDurations(whole, `${model} generate`);
    assert.ok(Array.isArray(whole.context) && whole.context.every(Number.isInteger), `${model}: context is an array of token ids`);
    assert.ok(whole.context.length >= whole.eval_count, `${model}: context holds at least the answer's ${whole.eval_count} tokens`);

    const again = await ollama.generate({ model, prompt: PROMPT, options: greedy });
    assert.equal(again.response, whole.response, `${model}: greedy answers repeat`);

    const { text, last, chunks } = await streamText(await ollama.generate({ model, prompt: PROMPT, options: greedy, stream: true }), "response");
    assert.ok(chunks > 2, `${model}: the stream came in several chunks, got ${chunks}`);
    assert.equal(text, whole.response, `${model}: the streamed pieces concatenate to the whole answer`);
    assert.equal(last.done, true, `${model}: the last chunk is done`);
    assert.equal(last.done_reason, whole.done_reason, `${model}: the stream's done_reason equals the whole answer's`);
    assert.equal(last.eval_count, whole.eval_count, `${model}: the stream's eval_count equals the whole answer's`);
    assert.deepEqual(last.context, whole.context, `${model}: the stream's context equals the whole answer's`);
    checkDurations(last, `${model} generate stream`);
    ref.generate[model] = whole;
  }
  // Ollama's clients may add the ":latest" tag to a name.
  const tagged = await ollama.generate({ model: "stories:latest", prompt: PROMPT, options: greedy });
  assert.equal(tagged.response, ref.generate.stories.response, "stories:latest is stories");
  assert.equal(tagged.model, "stories:latest", "the answer echoes the name as the request gave it, as Ollama's does");
  const answers = NAMES.map((m) => ref.generate[m].response);
  assert.equal(new Set(answers).size, 3, `the three models answer differently (the premise of every mix-up check): ${JSON.stringify(answers)}`);

  // Without "stream" a raw client gets Ollama's default: an NDJSON stream.
  const res = await fetch(base + "/api/generate", {
    method: "POST",
    headers: { ...headers, "Content-Type": "application/json" },
    body: JSON.stringify({ model: "stories", prompt: PROMPT, options: greedy }),
  });
  assert.equal(res.status, 200, "POST /api/generate without stream: 200");
  assert.match(res.headers.get("content-type") || "", /^application\/x-ndjson/, "streamed by default, as application/x-ndjson");
  const lines = (await res.text()).split("\n").filter((l) => l !== "").map((l) => JSON.parse(l));
  assert.ok(lines.length > 2, "several NDJSON lines");
  assert.equal(lines.at(-1).done, true, "the last line is done");
  assert.ok(lines.slice(0, -1).every((l) => l.done === false), "every line before the last is done: false");
  assert.equal(lines.map((l) => l.response).join(""), ref.generate.stories.response, "the default stream concatenates to the whole answer");
});

test("generate's context continues the text", async () => {
  const model = "stories";
  const first = await ollama.generate({ model, prompt: PROMPT, raw: true, options: greedy });
  const longer = await ollama.generate({ model, prompt: PROMPT, raw: true, options: { ...greedy, num_predict: 48 } });
  assert.equal(first.eval_count, 24, "24 tokens first (stories260K does not stop that early)");
  assert.equal(longer.eval_count, 48, "48 tokens in one go");
  // An empty prompt with a context goes on from where that answer stopped: greedy, the next 24
  // tokens are those the 48-token answer has after its first 24.
  const next = await ollama.generate({ model, prompt: "", raw: true, context: first.context, options: greedy });
  assert.equal(first.response + next.response, longer.response,
    "first answer + its continuation from `context` equals the 48-token answer");
  assert.deepEqual(next.context.slice(0, first.context.length), first.context, "the continued context starts with the one sent");
  assert.equal(next.context.length, first.context.length + next.eval_count, "and adds the new answer's tokens");
  // A new prompt after the context: the context is kept and the prompt's tokens follow it.
  const more = await ollama.generate({ model, prompt: " Then the dog", raw: true, context: first.context, options: greedy });
  assert.deepEqual(more.context.slice(0, first.context.length), first.context, "a prompt after a context keeps the context first");
  assert.ok(more.prompt_eval_count > first.context.length, `the prompt evaluated covers the context (${first.context.length} tokens) and the new text, got ${more.prompt_eval_count}`);
});

test("chat, not streamed and streamed, on each model", async () => {
  for (const model of NAMES) {
    const whole = await ollama.chat({ model, messages: CHAT, options: greedy });
    assert.equal(whole.model, model, `${model}: the answer names its model`);
    assert.equal(whole.done, true, `${model}: done`);
    assert.equal(whole.message.role, "assistant", `${model}: message.role "assistant"`);
    assert.equal(typeof whole.message.content, "string", `${model}: message.content is a string`);
    checkDurations(whole, `${model} chat`);

    const { text, last, chunks } = await streamText(await ollama.chat({ model, messages: CHAT, options: greedy, stream: true }), "message");
    assert.ok(chunks > 2, `${model}: the chat stream came in several chunks, got ${chunks}`);
    assert.equal(text, whole.message.content, `${model}: the streamed message pieces concatenate to the whole answer`);
    assert.equal(last.done_reason, whole.done_reason, `${model}: the stream's done_reason equals the whole answer's`);
    assert.equal(last.eval_count, whole.eval_count, `${model}: the stream's eval_count equals the whole answer's`);
    checkDurations(last, `${model} chat stream`);
    ref.chat[model] = whole;
  }
  // A conversation goes on: the answer given back as an assistant turn, then a user turn.
  const model = "tern-stories";
  const follow = await ollama.chat({
    model,
    messages: [...CHAT, ref.chat[model].message, { role: "user", content: "And then?" }],
    options: greedy,
  });
  assert.ok(follow.prompt_eval_count > ref.chat[model].prompt_eval_count + ref.chat[model].eval_count - 1,
    `a longer conversation has a longer prompt: ${follow.prompt_eval_count} vs ${ref.chat[model].prompt_eval_count} + ${ref.chat[model].eval_count}`);
});

test("three models, room for two: a model in use is never unloaded", async (t) => {
  const t0 = Date.now();
  const mark = (what) => t.diagnostic(`${what} at ${Date.now() - t0} ms`);
  await unloadAll();
  const stopWatch = watchPs(ollama);
  try {
    // tern-stories, then babble: both loaded, tern-stories the least recently used.
    assert.equal((await ollama.generate({ model: "tern-stories", prompt: PROMPT, options: greedy })).response, ref.generate["tern-stories"].response, "tern-stories answers as alone");
    assert.equal((await ollama.generate({ model: "babble", prompt: PROMPT, options: greedy })).response, ref.generate.babble.response, "babble answers as alone");
    assert.deepEqual(await loadedNames(), ["babble", "tern-stories"], "two models loaded");

    // A stream on stories holds it; tern-stories (the LRU idle one) made room for it.
    mark("tern-stories and babble loaded");
    const holder = await holdModel("stories");
    mark("a stream holds stories");
    assert.deepEqual(await loadedNames(), ["babble", "stories"], "stories loaded in place of the least recently used idle model (tern-stories)");
    // An Ollama stream on the same model, read one chunk at a time.
    const s = (await ollama.generate({ model: "stories", prompt: PROMPT, options: greedy, stream: true }))[Symbol.asyncIterator]();
    const firstPart = await s.next();
    assert.ok(!firstPart.done && firstPart.value.done === false, "the Ollama stream on stories sends a first chunk");
    // In use, it expires no sooner than now + keep_alive (the server's 2m), as Ollama shows it.
    const inUse = (await ollama.ps()).models.find((m) => m.name === "stories");
    const leftInUse = (parseTime(inUse.expires_at) - Date.now()) / 1000;
    assert.ok(leftInUse > 100 && leftInUse < 140, `stories in use: expires_at about 120 s away, got ${leftInUse.toFixed(1)} s (${inUse.expires_at})`);

    // tern-stories again: stories is in use, so babble (idle) goes.
    const a = await ollama.generate({ model: "tern-stories", prompt: PROMPT, options: greedy });
    assert.equal(a.response, ref.generate["tern-stories"].response, "tern-stories, reloaded while stories streams, answers as alone");
    assert.ok(a.load_duration > 0, "tern-stories was loaded for this request: load_duration > 0");
    assert.deepEqual(await loadedNames(), ["stories", "tern-stories"], "babble (idle) was unloaded, stories (in use) was not");
    // babble again: tern-stories (idle) goes, stories (still in use) stays.
    const b = await ollama.generate({ model: "babble", prompt: PROMPT, options: greedy });
    assert.equal(b.response, ref.generate.babble.response, "babble, reloaded while stories streams, answers as alone");
    assert.deepEqual(await loadedNames(), ["babble", "stories"], "tern-stories (idle) was unloaded, stories (in use) was not");

    // The Ollama stream opened before those loads completes with the right answer.
    let text = firstPart.value.response;
    let last = firstPart.value;
    for (let r = await s.next(); !r.done; r = await s.next()) {
      text += r.value.response;
      last = r.value;
    }
    assert.equal(last.done, true, "the Ollama stream on stories ends with done");
    assert.equal(text, ref.generate.stories.response, "the stream on stories, kept open across two loads and unloads, gives stories' answer");

    // Both loaded models in use: a request for the third waits for room instead of failing.
    mark("the Ollama stream ended");
    const holder2 = await holdModel("babble");
    mark("a stream holds babble");
    let waitedAnswer = null;
    const waiting = ollama.generate({ model: "tern-stories", prompt: PROMPT, options: greedy }).then((r) => (waitedAnswer = r));
    await sleep(400);
    assert.equal(waitedAnswer, null, "with both loaded models in use, the request for tern-stories waits");
    assert.deepEqual(await loadedNames(), ["babble", "stories"], "while it waits, the two models in use stay loaded");
    await holder.drain(); // stories' long stream ends (and is checked): it goes out, tern-stories comes in
    mark("the stream on stories drained");
    const c = await waiting;
    assert.equal(c.response, ref.generate["tern-stories"].response, "the waiting tern-stories request, served once stories went idle, answers as alone");
    await waitPs((n) => n.includes("tern-stories") && n.includes("babble") && n.length === 2,
      "tern-stories loaded beside babble (still in use)");
    await holder2.drain();
    mark("the stream on babble drained");
  } finally {
    const seen = await stopWatch();
    assert.deepEqual(seen.errors, [], "ps() answered throughout");
    assert.ok(seen.samples > 5, `ps() was sampled during the test (${seen.samples} times)`);
    assert.ok(seen.maxCount <= 2, `ps() never lists more than 2 models (--max-loaded 2), saw ${JSON.stringify(seen.maxNames)}`);
  }
});

test("keep_alive: 0 unloads after the request, -1 keeps forever, durations set expires_at", async () => {
  const r0 = await ollama.generate({ model: "tern-stories", prompt: PROMPT, options: greedy, keep_alive: 0 });
  assert.equal(r0.response, ref.generate["tern-stories"].response, "a keep_alive 0 request is answered as usual");
  await waitPs((n) => !n.includes("tern-stories"), "after a keep_alive 0 request, tern-stories is unloaded");

  const load = await ollama.generate({ model: "babble", keep_alive: -1 });
  assert.equal(load.done, true, "a load-only request (no prompt) is done");
  assert.equal(load.done_reason, "load", `a load-only request answers done_reason "load", got ${JSON.stringify(load.done_reason)}`);
  assert.equal(load.response, "", "a load-only request has an empty response");
  let ps = await ollama.ps();
  const babble = ps.models.find((m) => m.name === "babble");
  assert.ok(babble, "babble is loaded after the load-only request");
  assert.ok(new Date(parseTime(babble.expires_at)).getUTCFullYear() >= 2200,
    `keep_alive -1: expires_at is in the far future, got ${babble.expires_at}`);
  assert.equal(babble.size_vram, 0, "size_vram is 0 (CPU only)");
  assert.equal(babble.context_length, MODELS.babble.ctx, "context_length is the context babble was loaded with");
  assert.ok(babble.size > 0, "size > 0");
  assert.deepEqual(babble.details, (await ollama.show({ model: "babble" })).details, "ps() details equal show()'s");

  // The server's --keep-alive 2m for a request that names none, the request's own otherwise.
  const t0 = Date.now();
  await ollama.generate({ model: "stories", prompt: PROMPT, options: greedy });
  ps = await ollama.ps();
  const stories = ps.models.find((m) => m.name === "stories");
  assert.ok(stories, "stories loaded");
  const left = (parseTime(stories.expires_at) - t0) / 1000;
  assert.ok(left > 100 && left < 140, `the server's --keep-alive 2m: stories expires in about 120 s, got ${left.toFixed(1)} s (${stories.expires_at})`);
  await ollama.generate({ model: "babble", prompt: PROMPT, options: greedy, keep_alive: "10m" });
  ps = await ollama.ps();
  const left10 = (parseTime(ps.models.find((m) => m.name === "babble").expires_at) - Date.now()) / 1000;
  assert.ok(left10 > 560 && left10 < 640, `keep_alive "10m": expires in about 600 s, got ${left10.toFixed(1)} s`);

  // Unload-only: no prompt and keep_alive 0.
  const un = await ollama.generate({ model: "babble", keep_alive: 0 });
  assert.equal(un.done_reason, "unload", `no prompt and keep_alive 0 answers done_reason "unload", got ${JSON.stringify(un.done_reason)}`);
  await waitPs((n) => !n.includes("babble"), "after an unload request, babble is unloaded");
  // chat with no messages loads too.
  const cl = await ollama.chat({ model: "tern-stories", messages: [] });
  assert.equal(cl.done_reason, "load", `chat with no messages answers done_reason "load", got ${JSON.stringify(cl.done_reason)}`);
  assert.ok((await loadedNames()).includes("tern-stories"), "chat with no messages loaded tern-stories");
});

// 32 requests at once, spread over the three models (generate and chat, streamed and not):
// each must get its model's single-request greedy answer.
async function concurrentMix(client) {
  const jobs = [];
  for (let i = 0; i < 32; i++) {
    const model = NAMES[i % 3];
    const kind = i % 4;
    jobs.push(
      (async () => {
        if (kind === 0) {
          const r = await client.generate({ model, prompt: PROMPT, options: greedy });
          return { i, model, what: "generate", got: r.response, want: ref.generate[model].response, name: r.model };
        }
        if (kind === 1) {
          const r = await client.chat({ model, messages: CHAT, options: greedy });
          return { i, model, what: "chat", got: r.message.content, want: ref.chat[model].message.content, name: r.model };
        }
        if (kind === 2) {
          const { text, last } = await streamText(await client.generate({ model, prompt: PROMPT, options: greedy, stream: true }), "response");
          return { i, model, what: "generate stream", got: text, want: ref.generate[model].response, name: last.model };
        }
        const { text, last } = await streamText(await client.chat({ model, messages: CHAT, options: greedy, stream: true }), "message");
        return { i, model, what: "chat stream", got: text, want: ref.chat[model].message.content, name: last.model };
      })(),
    );
  }
  const results = await Promise.allSettled(jobs);
  const failed = results.filter((r) => r.status === "rejected").map((r) => String(r.reason));
  assert.deepEqual(failed, [], "every one of the 32 concurrent requests succeeds");
  for (const { value: r } of results) {
    assert.equal(r.name, r.model, `request ${r.i} (${r.what}): answered by ${r.model}`);
    assert.equal(r.got, r.want, `request ${r.i} (${r.what} on ${r.model}): the single-request greedy answer`);
  }
}

test("32 concurrent requests over three models, room for two (--max-loaded 2)", async (t) => {
  const stopWatch = watchPs(ollama);
  try {
    await concurrentMix(ollama);
  } finally {
    const seen = await stopWatch();
    t.diagnostic(`the most models loaded at once: ${seen.maxCount} (${JSON.stringify(seen.maxNames)}), ${seen.samples} ps() samples`);
    assert.ok(seen.maxCount <= 2, `ps() never lists more than 2 models, saw ${JSON.stringify(seen.maxNames)}`);
  }
});

test("32 concurrent requests over three models under --max-memory", async (t) => {
  assert.deepEqual(await loadedNames(budgetOllama), [], "the memory-budget server has nothing loaded before its first request");
  const stopWatch = watchPs(budgetOllama);
  let seen;
  try {
    await concurrentMix(budgetOllama);
  } finally {
    seen = await stopWatch();
  }
  assert.deepEqual(seen.errors, [], "ps() answered throughout");
  t.diagnostic(`budget ${budget} bytes; the most loaded at once: ${seen.maxBytes} bytes (${JSON.stringify(seen.maxNames)} at the largest count), ${seen.samples} ps() samples`);
  assert.ok(seen.maxBytes <= budget, `the loaded models' sizes never add up past the budget (${budget} bytes), saw ${seen.maxBytes}`);
  // Each model's size there is the one run.sh measured alone.
  for (const m of (await budgetOllama.ps()).models)
    assert.equal(m.size, sizes[m.name], `${m.name}: the same size as when run.sh measured it (${sizes[m.name]})`);
  if (haveProc) {
    // The process's peak, minus what it held before any model: the models (at most the budget)
    // plus what 32 requests at once cost (HTTP threads' stacks, request and answer buffers,
    // allocator arenas): allowed 64 MiB. Without a budget all three would fit anyway, so this
    // bounds the overhead; the budget itself is the ps() check above.
    const hwm = vmKiB(process.env.TERN_BUDGET_PID, "VmHWM");
    const overheadKiB = 64 * 1024;
    t.diagnostic(`memory-budget server: idle RSS ${budgetBaselineKiB} KiB, peak RSS ${hwm} KiB (+${hwm - budgetBaselineKiB} KiB; budget ${Math.round(budget / 1024)} KiB)`);
    assert.ok(hwm - budgetBaselineKiB <= budget / 1024 + overheadKiB,
      `the memory-budget server's peak RSS (${hwm} KiB) stays within its idle RSS (${budgetBaselineKiB} KiB) + the budget (${Math.round(budget / 1024)} KiB) + ${overheadKiB} KiB`);
  }
});

test("embed: vectors of the model's n_embd, the same on every call", async () => {
  const inputs = ["The cat", "Tom had a red ball."];
  const vectors = {};
  for (const model of NAMES) {
    const r = await ollama.embed({ model, input: inputs });
    assert.equal(r.model, model, `${model}: embed() names its model`);
    assert.equal(r.embeddings.length, 2, `${model}: one vector per input`);
    for (const v of r.embeddings) {
      assert.equal(v.length, MODELS[model].n_embd, `${model}: vectors have n_embd (${MODELS[model].n_embd}) components`);
      assert.ok(v.every(Number.isFinite), `${model}: finite components`);
      const norm = Math.sqrt(v.reduce((s, x) => s + x * x, 0));
      assert.ok(Math.abs(norm - 1) < 1e-4, `${model}: unit length (Ollama normalises), got ${norm}`);
    }
    assert.notDeepEqual(r.embeddings[0], r.embeddings[1], `${model}: different texts, different vectors`);
    assert.ok(r.prompt_eval_count > 0, `${model}: prompt_eval_count > 0`);
    const again = await ollama.embed({ model, input: inputs });
    assert.deepEqual(again.embeddings, r.embeddings, `${model}: the same input gives the same vectors`);
    const alone = await ollama.embed({ model, input: inputs[1] });
    assert.equal(alone.embeddings.length, 1, `${model}: a string input gives one vector`);
    alone.embeddings[0].forEach((x, k) =>
      assert.ok(Math.abs(x - r.embeddings[1][k]) < 1e-6, `${model}: component ${k} alone (${x}) equals in the batch (${r.embeddings[1][k]})`));
    // Ollama's /api/embed vectors are unit length; `dimensions` cuts and normalizes again.
    for (const v of r.embeddings) {
      const norm = Math.sqrt(v.reduce((s, x) => s + x * x, 0));
      assert.ok(Math.abs(norm - 1) < 1e-5, `${model}: embed() vectors are L2-normalized (norm ${norm})`);
    }
    const cut = await ollama.embed({ model, input: inputs[0], dimensions: 16 });
    assert.equal(cut.embeddings[0].length, 16, `${model}: dimensions 16 gives 16 values`);
    const head = r.embeddings[0].slice(0, 16);
    const headNorm = Math.sqrt(head.reduce((s, x) => s + x * x, 0));
    cut.embeddings[0].forEach((x, k) =>
      assert.ok(Math.abs(x - head[k] / headNorm) < 1e-5, `${model}: dimensions 16, component ${k}: the first 16 renormalized`));
    // The older /api/embeddings: the engine's vector, unnormalized, in the same direction.
    const legacy = await ollama.embeddings({ model, prompt: inputs[0] });
    assert.equal(legacy.embedding.length, MODELS[model].n_embd, `${model}: embeddings() has n_embd components`);
    const dot = legacy.embedding.reduce((s, x, k) => s + x * r.embeddings[0][k], 0);
    const n = Math.sqrt(legacy.embedding.reduce((s, x) => s + x * x, 0));
    assert.ok(dot / n > 0.9999, `${model}: embeddings() points where embed() does (cosine ${dot / n})`);
    vectors[model] = r.embeddings[0];
  }
  assert.notDeepEqual(vectors.stories, vectors.babble, "two models of the same shape give different vectors");
});

test("errors: unknown model 404, bad options 400, images 400, invalid JSON 400", async () => {
  const rejects = async (p, status, pattern, what) => {
    await assert.rejects(p, (e) => {
      assert.equal(e.name, "ResponseError", `${what}: the client raises ResponseError, got ${e.name}: ${e.message}`);
      assert.equal(e.status_code, status, `${what}: status ${status}, got ${e.status_code} (${JSON.stringify(e.error)})`);
      assert.equal(typeof e.error, "string", `${what}: the body is Ollama's {"error": "..."}, a string, got ${JSON.stringify(e.error)}`);
      assert.match(e.error, pattern, `${what}: the message matches ${pattern}, got ${JSON.stringify(e.error)}`);
      return true;
    });
  };
  const unknown = /no-such-model.*not found|not found.*no-such-model/i;
  await rejects(ollama.generate({ model: "no-such-model", prompt: PROMPT }), 404, unknown, "generate, unknown model");
  await rejects(ollama.generate({ model: "no-such-model", prompt: PROMPT, stream: true }), 404, unknown, "generate stream, unknown model");
  await rejects(ollama.chat({ model: "no-such-model", messages: CHAT }), 404, unknown, "chat, unknown model");
  await rejects(ollama.embed({ model: "no-such-model", input: "x" }), 404, unknown, "embed, unknown model");
  await rejects(ollama.show({ model: "no-such-model" }), 404, unknown, "show, unknown model");

  await rejects(ollama.generate({ model: "stories", prompt: PROMPT, options: { temperature: "hot" } }), 400, /temperature/, "options.temperature a string");
  await rejects(ollama.chat({ model: "stories", messages: CHAT, options: { num_predict: 1.5 } }), 400, /num_predict/, "options.num_predict not an integer");
  await rejects(ollama.generate({ model: "stories", prompt: PROMPT, keep_alive: "5 minutes" }), 400, /keep_alive/, "keep_alive not a duration");
  await rejects(ollama.generate({ model: "stories", prompt: PROMPT, images: ["aGVsbG8="] }), 400, /images are not supported/, "generate with images");
  await rejects(ollama.chat({ model: "stories", messages: [{ role: "user", content: "Look", images: ["aGVsbG8="] }] }), 400,
    /images are not supported/, "chat with images");
  await rejects(ollama.generate({ model: "stories", prompt: PROMPT, template: "{{ .Prompt }}" }), 400, /template is not supported/, "a template override");

  for (const [path, body, pattern] of [
    ["/api/chat", "{not json", /./],
    ["/api/generate", '{"model": "stories", "prompt": ', /./],
    ["/api/generate", '{"prompt": "The cat"}', /model is required/],
    ["/api/embed", '{"model": "stories"}', /input/],
  ]) {
    const res = await fetch(base + path, { method: "POST", headers: { ...headers, "Content-Type": "application/json" }, body });
    assert.equal(res.status, 400, `POST ${path} ${body}: 400`);
    assert.match(res.headers.get("content-type") || "", /application\/json/, `POST ${path} ${body}: a JSON error`);
    const j = await res.json();
    assert.equal(typeof j.error, "string", `POST ${path} ${body}: {"error": "..."} (Ollama's shape), got ${JSON.stringify(j)}`);
    assert.match(j.error, pattern, `POST ${path} ${body}: the message matches ${pattern}`);
  }
  // Model management is the directory's: 501 with a sentence, as the client's ResponseError.
  await rejects(ollama.pull({ model: "llama3.2" }), 501, /not supported/, "pull()");
  await rejects(ollama.delete({ model: "stories" }), 501, /not supported/, "delete()");
  // The API key guards the Ollama routes too.
  await rejects(new Ollama({ host: base }).list(), 401, /./, "list() without the API key");
});

test("the OpenAI routes take the model names too", async () => {
  const ids = (await openai.models.list()).data.map((m) => m.id).sort();
  assert.deepEqual(ids, NAMES, "/v1/models lists the three models");
  // Same messages, greedy: the Ollama route is a translation into this one (same template, same
  // sampler), so the answers and token counts agree.
  for (const model of NAMES) {
    const r = await openai.chat.completions.create({ model, messages: CHAT, max_tokens: 24, temperature: 0 });
    assert.equal(r.model, model, `/v1/chat/completions with model "${model}" is answered by ${model}`);
    assert.equal(r.choices[0].message.content, ref.chat[model].message.content, `${model}: /v1/chat/completions equals /api/chat, greedy`);
    assert.equal(r.usage.prompt_tokens, ref.chat[model].prompt_eval_count, `${model}: prompt tokens equal /api/chat's prompt_eval_count`);
    assert.equal(r.usage.completion_tokens, ref.chat[model].eval_count, `${model}: completion tokens equal /api/chat's eval_count`);
    const raw = await ollama.generate({ model, prompt: PROMPT, raw: true, options: greedy });
    const c = await openai.completions.create({ model, prompt: PROMPT, max_tokens: 24, temperature: 0 });
    assert.equal(c.choices[0].text, raw.response, `${model}: /v1/completions equals /api/generate with raw: true, greedy`);
  }
  const viaAlias = await openai.completions.create({ model: "stories260K", prompt: PROMPT, max_tokens: 24, temperature: 0 });
  assert.equal(viaAlias.choices[0].text, (await ollama.generate({ model: "stories", prompt: PROMPT, raw: true, options: greedy })).response,
    "the alias stories260K is served by stories");
  await assert.rejects(openai.chat.completions.create({ model: "no-such-model", messages: CHAT, max_tokens: 4 }), (e) => {
    assert.equal(e.status, 404, `an unknown model on /v1/chat/completions: 404, got ${e.status}`);
    assert.equal(e.code, "model_not_found", `code model_not_found, got ${e.code}`);
    return true;
  });
});

test("tern ps and tern list", async () => {
  const tern = process.env.TERN_BINARY;
  const ps = await ollama.ps();
  const { stdout } = await run(tern, ["ps", "--host", base, "--api-key", apiKey]);
  const lines = stdout.trim().split("\n");
  assert.match(lines[0], /^NAME\s+SIZE\s+CONTEXT\s+UNTIL$/, `tern ps prints a header, got ${JSON.stringify(lines[0])}`);
  assert.deepEqual(lines.slice(1).map((l) => l.split(/\s+/)[0]).sort(), ps.models.map((m) => m.name).sort(), "tern ps lists the loaded models");
  const asJson = JSON.parse((await run(tern, ["ps", "--host", base, "--api-key", apiKey, "--json"])).stdout);
  assert.deepEqual(asJson.models.map((m) => m.name).sort(), ps.models.map((m) => m.name).sort(), "tern ps --json gives /api/ps");
  await assert.rejects(run(tern, ["ps", "--host", base], { env: { ...process.env, TERN_API_KEY: "" } }), (e) => {
    assert.match(e.stderr, /API key/, `tern ps without the key says it needs one, got ${JSON.stringify(e.stderr)}`);
    return true;
  });
  const list = await run(tern, ["list", "--models", modelsDir]);
  for (const name of NAMES) assert.match(list.stdout, new RegExp(`^${name}\\b.*\\bok$`, "m"), `tern list shows ${name} as usable`);
});

test("every response has the fields and types the ollama client declares", async (t) => {
  const post = (path, body) => fetch(base + path, { method: "POST", headers: { ...headers, "Content-Type": "application/json" }, body: JSON.stringify(body) });
  const json = async (what, res, status = 200) => {
    assert.equal(res.status, status, `${what}: status ${status}`);
    assert.match(res.headers.get("content-type") || "", /^application\/json/, `${what}: application/json`);
    return res.json();
  };
  const ndjson = async (what, res) => {
    assert.equal(res.status, 200, `${what}: status 200`);
    assert.match(res.headers.get("content-type") || "", /^application\/x-ndjson/, `${what}: application/x-ndjson`);
    const lines = (await res.text()).split("\n").filter((l) => l !== "").map((l) => JSON.parse(l));
    assert.ok(lines.length > 2 && lines.at(-1).done === true, `${what}: several lines, the last done`);
    return lines;
  };
  const model = "stories";
  // The raw JSON, route by route (what every client sees), against the type the client's
  // declaration gives that route's method.
  const gen = await json("POST /api/generate", await post("/api/generate", { model, prompt: PROMPT, options: greedy, stream: false }));
  checkShape(responseTypeOf("generate"), gen, "(POST /api/generate)");
  (await ndjson("POST /api/generate stream", await post("/api/generate", { model, prompt: PROMPT, options: greedy, stream: true })))
    .forEach((l, i) => checkShape(responseTypeOf("generate"), l, `(POST /api/generate stream line ${i})`));
  for (const body of [{ model, keep_alive: "2m" }, { model: "babble", keep_alive: 0 }]) // load, unload
    checkShape(responseTypeOf("generate"), await json("POST /api/generate load/unload", await post("/api/generate", { ...body, stream: false })),
      `(POST /api/generate ${JSON.stringify(body)})`);
  const chat = await json("POST /api/chat", await post("/api/chat", { model, messages: CHAT, options: greedy, stream: false }));
  checkShape(responseTypeOf("chat"), chat, "(POST /api/chat)");
  (await ndjson("POST /api/chat stream", await post("/api/chat", { model, messages: CHAT, options: greedy, stream: true })))
    .forEach((l, i) => checkShape(responseTypeOf("chat"), l, `(POST /api/chat stream line ${i})`));
  checkShape(responseTypeOf("chat"), await json("POST /api/chat load", await post("/api/chat", { model, messages: [], stream: false })),
    "(POST /api/chat, no messages)");
  checkShape(responseTypeOf("embed"), await json("POST /api/embed", await post("/api/embed", { model, input: ["The cat", "a dog"] })), "(POST /api/embed)");
  checkShape(responseTypeOf("embeddings"), await json("POST /api/embeddings", await post("/api/embeddings", { model, prompt: PROMPT })), "(POST /api/embeddings)");
  for (const name of NAMES)
    checkShape(responseTypeOf("show"), await json(`POST /api/show ${name}`, await post("/api/show", { model: name })), `(POST /api/show ${name})`);
  const tags = await json("GET /api/tags", await fetch(base + "/api/tags", { headers }));
  assert.equal(tags.models?.length, NAMES.length, "GET /api/tags lists the three models (so their shape is checked)");
  checkShape(responseTypeOf("list"), tags, "(GET /api/tags)");
  const ps = await json("GET /api/ps", await fetch(base + "/api/ps", { headers }));
  assert.ok(ps.models?.some((m) => m.name === model), "GET /api/ps lists stories (so a loaded model's shape is checked)");
  checkShape(responseTypeOf("ps"), ps, "(GET /api/ps)");
  checkShape(responseTypeOf("version"), await json("GET /api/version", await fetch(base + "/api/version", { headers })), "(GET /api/version)");
  // Errors: Ollama's {"error": "..."} (the client's ErrorResponse, what its ResponseError reads).
  for (const [what, res, status] of [
    ["POST /api/generate unknown model", await post("/api/generate", { model: "no-such-model", prompt: PROMPT }), 404],
    ["POST /api/chat unknown model, stream", await post("/api/chat", { model: "no-such-model", messages: CHAT, stream: true }), 404],
    ["POST /api/show unknown model", await post("/api/show", { model: "no-such-model" }), 404],
    ["POST /api/generate bad option", await post("/api/generate", { model, prompt: PROMPT, options: { temperature: "hot" } }), 400],
    ["POST /api/embed no input", await post("/api/embed", { model }), 400],
    ["POST /api/pull", await post("/api/pull", { model: "llama3.2" }), 501],
    ["GET /api/tags without the key", await fetch(base + "/api/tags"), 401],
  ]) checkShape("ErrorResponse", await json(what, res, status), `(${what})`);

  // The client's own answers, each method once (the wrapper checks them; the earlier tests went
  // through it too).
  await ollama.version();
  await ollama.list();
  await ollama.show({ model });
  await ollama.generate({ model, prompt: PROMPT, options: greedy });
  await streamText(await ollama.generate({ model, prompt: PROMPT, options: greedy, stream: true }), "response");
  await ollama.chat({ model, messages: CHAT, options: greedy });
  await streamText(await ollama.chat({ model, messages: CHAT, options: greedy, stream: true }), "message");
  await ollama.embed({ model, input: PROMPT });
  await ollama.embeddings({ model, prompt: PROMPT });
  await ollama.ps();

  t.diagnostic(`${shapeSeen.checked} responses checked strictly against the ollama ${clientVersion} client's interfaces`);
  for (const e of shapeSeen.extra.values()) t.diagnostic(`not declared by the client: ${e.field} (e.g. ${e.path} = ${e.value})`);
});
