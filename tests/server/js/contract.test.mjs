// Contract tests of `tern serve` with the official `openai` npm client: what a real client
// sees for completions and chat, streamed and not, n > 1, stop sequences, logprobs, usage,
// and errors raised as the client's own error classes. run.sh starts the servers:
//   TERN_BASE_URL   a server with --api-key $TERN_TEST_API_KEY (stories260K)
//   TERN_BUSY_URL   a server that runs one request and queues one (--max-running 1 --max-waiting 1)
import { test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";

const baseURL = process.env.TERN_BASE_URL + "/v1";
const apiKey = process.env.TERN_TEST_API_KEY;
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });
const model = process.env.TERN_MODEL_ID;
const greedy = { temperature: 0 };

function checkUsage(usage) {
  assert.equal(typeof usage.prompt_tokens, "number");
  assert.equal(typeof usage.completion_tokens, "number");
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
  assert.ok(usage.prompt_tokens > 0);
}

test("models.list reports the served model", async () => {
  const page = await client.models.list();
  const ids = page.data.map((m) => m.id);
  assert.deepEqual(ids, [model]);
  assert.equal(page.data[0].object, "model");
  const one = await client.models.retrieve(model);
  assert.equal(one.id, model);
});

test("completion, not streamed", async () => {
  const r = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 24, ...greedy });
  assert.equal(r.object, "text_completion");
  assert.match(r.id, /^cmpl-/);
  assert.equal(r.model, model);
  assert.equal(r.choices.length, 1);
  const c = r.choices[0];
  assert.equal(c.index, 0);
  assert.equal(typeof c.text, "string");
  assert.ok(c.text.length > 0);
  assert.ok(["stop", "length"].includes(c.finish_reason));
  checkUsage(r.usage);
  assert.equal(r.usage.prompt_tokens, 5); // BOS + "Once upon a time" (4 tokens)
  assert.ok(r.usage.completion_tokens <= 24);
  if (c.finish_reason === "length") assert.equal(r.usage.completion_tokens, 24);
});

test("completion, streamed, equals the non-streamed text", async () => {
  const args = { model, prompt: "Once upon a time", max_tokens: 40, ...greedy };
  const whole = await client.completions.create(args);
  const stream = await client.completions.create({ ...args, stream: true, stream_options: { include_usage: true } });
  let text = "";
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    assert.equal(chunk.object, "text_completion");
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      text += c.text;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.ok(chunks > 2, "streamed in several chunks");
  assert.equal(text, whole.choices[0].text);
  assert.equal(finish, whole.choices[0].finish_reason);
  assert.deepEqual(usage, whole.usage);
});

test("chat completion, not streamed", async () => {
  const r = await client.chat.completions.create({
    model,
    messages: [
      { role: "system", content: "You tell short stories." },
      { role: "user", content: "Tell me about a cat." },
    ],
    max_completion_tokens: 20,
    seed: 3,
  });
  assert.equal(r.object, "chat.completion");
  assert.match(r.id, /^chatcmpl-/);
  const c = r.choices[0];
  assert.equal(c.message.role, "assistant");
  assert.equal(typeof c.message.content, "string");
  assert.ok(["stop", "length"].includes(c.finish_reason));
  assert.equal(c.logprobs, null);
  checkUsage(r.usage);
  assert.ok(r.usage.completion_tokens <= 20);
});

test("chat completion, streamed, with usage", async () => {
  const stream = await client.chat.completions.create({
    model,
    messages: [{ role: "user", content: "Hello" }],
    max_tokens: 16,
    stream: true,
    stream_options: { include_usage: true },
    ...greedy,
  });
  let role = null;
  let content = "";
  let finish = null;
  let usage = null;
  let sawUsageLast = false;
  for await (const chunk of stream) {
    assert.equal(chunk.object, "chat.completion.chunk");
    if (chunk.usage) {
      usage = chunk.usage;
      sawUsageLast = chunk.choices.length === 0;
    }
    for (const c of chunk.choices) {
      if (c.delta.role) role = c.delta.role;
      if (c.delta.content) content += c.delta.content;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(role, "assistant");
  assert.ok(content.length > 0);
  assert.ok(["stop", "length"].includes(finish));
  assert.ok(sawUsageLast, "usage comes in a last chunk with no choices");
  checkUsage(usage);
  const whole = await client.chat.completions.create({
    model, messages: [{ role: "user", content: "Hello" }], max_tokens: 16, ...greedy,
  });
  assert.equal(content, whole.choices[0].message.content);
});

test("n > 1 gives n indexed choices, streamed and not", async () => {
  const r = await client.completions.create({ model, prompt: "The dog", max_tokens: 12, n: 3, seed: 9, temperature: 1 });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  const one = await client.completions.create({ model, prompt: "The dog", max_tokens: 1 });
  assert.equal(r.usage.prompt_tokens, one.usage.prompt_tokens); // counted once, not per choice
  let sum = 0;
  for (const c of r.choices) sum += c.text.length > 0 ? 1 : 0;
  assert.ok(sum >= 1);

  const chat = await client.chat.completions.create({
    model, messages: [{ role: "user", content: "Hi" }], max_tokens: 8, n: 2, seed: 4,
  });
  assert.deepEqual(chat.choices.map((c) => c.index), [0, 1]);

  const stream = await client.chat.completions.create({
    model, messages: [{ role: "user", content: "Hi" }], max_tokens: 8, n: 2, seed: 4, stream: true,
  });
  const texts = ["", ""];
  const finishes = [null, null];
  for await (const chunk of stream)
    for (const c of chunk.choices) {
      texts[c.index] += c.delta.content ?? "";
      if (c.finish_reason) finishes[c.index] = c.finish_reason;
    }
  assert.ok(finishes.every((f) => f === "stop" || f === "length"));
  // Same seed, same request: the streamed choices equal the non-streamed ones.
  assert.deepEqual(texts, chat.choices.map((c) => c.message.content));
});

test("seed reproduces a sampled completion", async () => {
  const args = { model, prompt: "Lily and Ben", max_tokens: 20, temperature: 1, top_p: 0.9, seed: 1234 };
  const a = await client.completions.create(args);
  const b = await client.completions.create(args);
  assert.equal(a.choices[0].text, b.choices[0].text);
});

test("stop sequences end the text before the stop string", async () => {
  const base = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 40, ...greedy });
  const full = base.choices[0].text;
  // A word from the middle of the greedy continuation: generation must stop right before it.
  const words = full.split(" ").filter((w) => w.length >= 3);
  assert.ok(words.length >= 2, full);
  const stop = " " + words[1];
  const cut = full.indexOf(stop);
  const r = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 40, stop: [stop, "zzzz"], ...greedy });
  assert.equal(r.choices[0].text, full.slice(0, cut));
  assert.equal(r.choices[0].finish_reason, "stop");
  // Streamed, the same.
  const stream = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 40, stop, stream: true, ...greedy });
  let text = "";
  for await (const chunk of stream) for (const c of chunk.choices) text += c.text;
  assert.equal(text, full.slice(0, cut));
});

test("logprobs: completions and chat", async () => {
  const r = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 6, logprobs: 3, ...greedy });
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.length, r.usage.completion_tokens);
  assert.equal(lp.token_logprobs.length, lp.tokens.length);
  assert.equal(lp.top_logprobs.length, lp.tokens.length);
  assert.equal(lp.text_offset.length, lp.tokens.length);
  for (let i = 0; i < lp.tokens.length; i++) {
    assert.ok(lp.token_logprobs[i] <= 0);
    assert.ok(Object.keys(lp.top_logprobs[i]).length >= 1);
    // Greedy: the chosen token is the most likely one.
    const best = Math.max(...Object.values(lp.top_logprobs[i]));
    assert.ok(Math.abs(best - lp.token_logprobs[i]) < 1e-4);
  }
  assert.equal(lp.tokens.join(""), r.choices[0].text);

  const c = await client.chat.completions.create({
    model, messages: [{ role: "user", content: "Hi" }], max_tokens: 5, logprobs: true, top_logprobs: 2, ...greedy,
  });
  const content = c.choices[0].logprobs.content;
  assert.equal(content.length, c.usage.completion_tokens);
  for (const t of content) {
    assert.equal(typeof t.token, "string");
    assert.ok(t.logprob <= 0);
    assert.ok(Array.isArray(t.bytes));
    assert.equal(t.top_logprobs.length, 2);
  }
});

test("errors are raised as the client's error classes", async () => {
  // 400: out-of-range parameter, named in the error.
  await assert.rejects(
    client.completions.create({ model, prompt: "x", temperature: 5 }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === "temperature" &&
      e.type === "invalid_request_error",
  );
  // 404: unknown model (the server has --alias: names are checked).
  await assert.rejects(
    client.chat.completions.create({ model: "gpt-nope", messages: [{ role: "user", content: "x" }] }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404 && e.code === "model_not_found",
  );
  // 400: prompt longer than the context; max_tokens past the context.
  await assert.rejects(
    client.completions.create({ model, prompt: "Once upon a time ".repeat(1000) }),
    (e) => e instanceof OpenAI.BadRequestError && e.code === "context_length_exceeded",
  );
  await assert.rejects(
    client.completions.create({ model, prompt: "x", max_tokens: 1_000_000 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === "max_tokens",
  );
  // 400: wrong type.
  await assert.rejects(
    client.chat.completions.create({ model, messages: "hello" }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === "messages",
  );
  // 401: wrong key.
  const wrong = new OpenAI({ baseURL, apiKey: "wrong-key", maxRetries: 0 });
  await assert.rejects(wrong.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
  // 429: a full queue, with Retry-After. The busy server runs one request and queues one;
  // of eight sent at once, the ones that find the queue full are refused.
  const busy = new OpenAI({ baseURL: process.env.TERN_BUSY_URL + "/v1", apiKey: "none", maxRetries: 0 });
  const results = await Promise.allSettled(
    Array.from({ length: 8 }, () => busy.completions.create({ model, prompt: "Once", max_tokens: 1500, ignore_eos: true })),
  );
  const refused = results.filter((r) => r.status === "rejected");
  assert.ok(refused.length >= 1, "some requests found the queue full");
  for (const r of refused) {
    const e = r.reason;
    assert.ok(e instanceof OpenAI.RateLimitError, String(e));
    assert.equal(e.status, 429);
    assert.equal(e.headers.get("retry-after"), "1");
  }
  for (const r of results.filter((r) => r.status === "fulfilled")) assert.equal(r.value.usage.completion_tokens, 1500);
  // 404: an endpoint this server does not have.
  await assert.rejects(client.moderations.create({ model, input: "x" }), (e) => e instanceof OpenAI.NotFoundError);
});

test("a client that cancels mid-stream frees its request at once", async () => {
  // A stream cancelled by the client: the iterator ends, and the server frees the request.
  const controller = new AbortController();
  const stream = await client.completions.create(
    { model, prompt: "Once", max_tokens: 1500, stream: true, ...greedy },
    { signal: controller.signal },
  );
  let n = 0;
  // The client's stream ends quietly once its signal aborts.
  for await (const chunk of stream) {
    void chunk;
    if (++n === 3) controller.abort();
  }
  assert.ok(n >= 3 && n < 1500, `stopped after ${n} chunks`);
  // The server notices at once: soon nothing runs and no KV block is in use.
  const deadline = Date.now() + 3000;
  let used = -1;
  while (Date.now() < deadline) {
    const r = await fetch(process.env.TERN_BASE_URL + "/metrics", { headers: { Authorization: `Bearer ${apiKey}` } });
    const m = await r.text();
    used = Number(/^tern_kv_blocks_used (\S+)$/m.exec(m)[1]);
    const running = Number(/^tern_num_requests_running (\S+)$/m.exec(m)[1]);
    if (used === 0 && running === 0) break;
    await new Promise((res) => setTimeout(res, 20));
  }
  assert.equal(used, 0);
});
