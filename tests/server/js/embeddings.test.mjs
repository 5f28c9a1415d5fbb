// /v1/embeddings with the official `openai` npm client: embeddings.create as a real client calls
// it (no encoding_format: the client asks for base64 and decodes little-endian float32 itself),
// with "float", batches of strings and of token ids, usage, and errors as the client's own
// error classes. run.sh starts the server:
//   TERN_BASE_URL   a server with --api-key $TERN_TEST_API_KEY --ctx 2048 (stories260K, n_embd 64)
import { test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";

const baseURL = process.env.TERN_BASE_URL + "/v1";
const apiKey = process.env.TERN_TEST_API_KEY;
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });
const model = process.env.TERN_MODEL_ID;
const N_EMBD = 64; // stories260K

function norm(v) {
  return Math.sqrt(v.reduce((s, x) => s + x * x, 0));
}

test("embeddings.create, the client's default (base64), one string", async () => {
  const r = await client.embeddings.create({ model, input: "Once upon a time" });
  assert.equal(r.object, "list");
  assert.equal(r.model, model);
  assert.equal(r.data.length, 1);
  const e = r.data[0];
  assert.equal(e.object, "embedding");
  assert.equal(e.index, 0);
  assert.ok(Array.isArray(e.embedding), "the client decodes base64 into an array of numbers");
  assert.equal(e.embedding.length, N_EMBD);
  for (const x of e.embedding) assert.ok(Number.isFinite(x));
  assert.ok(Math.abs(norm(e.embedding) - 1) < 1e-5, "normalised");
  assert.equal(r.usage.prompt_tokens, 5); // BOS + "Once upon a time" (4 tokens)
  assert.equal(r.usage.total_tokens, 5);
});

test("float and base64 give the same float32 values", async () => {
  const input = ["Once upon a time", "The little fox ran home.", "Lily liked to play in the park with her dog."];
  const asFloat = await client.embeddings.create({ model, input, encoding_format: "float" });
  const asDefault = await client.embeddings.create({ model, input });
  assert.equal(asFloat.data.length, 3);
  assert.equal(asDefault.data.length, 3);
  for (let i = 0; i < 3; i++) {
    assert.equal(asFloat.data[i].index, i);
    assert.equal(asDefault.data[i].index, i);
    // JSON numbers are the float32 values printed exactly: rounding them to float32 is the identity.
    const f = asFloat.data[i].embedding.map(Math.fround);
    assert.deepEqual(f, asFloat.data[i].embedding);
    assert.deepEqual(asDefault.data[i].embedding, f);
  }
  // Different texts, different vectors.
  assert.notDeepEqual(asFloat.data[0].embedding, asFloat.data[1].embedding);
  // A raw base64 string when asked for explicitly.
  const raw = await client.embeddings.create({ model, input: input[0], encoding_format: "base64" });
  assert.equal(typeof raw.data[0].embedding, "string");
  const bytes = Buffer.from(raw.data[0].embedding, "base64");
  assert.equal(bytes.length, 4 * N_EMBD);
  const decoded = Array.from({ length: N_EMBD }, (_, k) => bytes.readFloatLE(4 * k));
  assert.deepEqual(decoded, asFloat.data[0].embedding);
});

test("a batch is independent of its neighbours; token ids equal their text", async () => {
  const alone = await client.embeddings.create({ model, input: "The little fox ran home.", encoding_format: "float" });
  const batch = await client.embeddings.create({
    model,
    input: ["Once upon a time", "The little fox ran home.", "Tom had a red ball."],
    encoding_format: "float",
  });
  const a = alone.data[0].embedding;
  const b = batch.data[1].embedding;
  for (let k = 0; k < N_EMBD; k++) assert.ok(Math.abs(a[k] - b[k]) < 1e-6, `component ${k}: ${a[k]} vs ${b[k]}`);
  // The same tokens given as ids.
  const tok = await fetch(process.env.TERN_BASE_URL + "/tokenize", {
    method: "POST",
    headers: { Authorization: `Bearer ${apiKey}`, "Content-Type": "application/json" },
    body: JSON.stringify({ prompt: "The little fox ran home." }),
  }).then((res) => res.json());
  const ids = await client.embeddings.create({ model, input: [tok.tokens], encoding_format: "float" });
  assert.deepEqual(ids.data[0].embedding, a);
  assert.equal(ids.usage.prompt_tokens, tok.tokens.length);
});

test("errors are the client's error classes", async () => {
  await assert.rejects(client.embeddings.create({ model, input: "x", dimensions: 8 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.equal(e.status, 400);
    assert.equal(e.param, "dimensions");
    return true;
  });
  await assert.rejects(client.embeddings.create({ model, input: "" }), (e) => e instanceof OpenAI.BadRequestError);
  await assert.rejects(client.embeddings.create({ model, input: [[1, 2], "x"] }), (e) => e instanceof OpenAI.BadRequestError);
  const long = Array.from({ length: 2100 }, () => 300);
  await assert.rejects(client.embeddings.create({ model, input: [long] }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.equal(e.code, "context_length_exceeded");
    return true;
  });
  await assert.rejects(client.embeddings.create({ model: "no-such-model", input: "x" }), (e) => e instanceof OpenAI.NotFoundError);
  const bad = new OpenAI({ baseURL, apiKey: "wrong", maxRetries: 0 });
  await assert.rejects(bad.embeddings.create({ model, input: "x" }), (e) => e instanceof OpenAI.AuthenticationError);
});
