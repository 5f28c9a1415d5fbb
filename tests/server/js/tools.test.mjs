// Structured output and tool calling through the official `openai` npm client: what an agent
// framework or JSON-extraction code does first. The model is stories260K (it knows no JSON and
// no tools), so everything valid here is the grammar's doing: response_format json_schema
// answers are checked with ajv (an independent JSON Schema validator), forced tool calls must
// carry arguments valid against their tool's schema, streamed and not. run.sh starts the server:
//   TERN_BASE_URL   a server with --api-key $TERN_TEST_API_KEY (stories260K)
import { test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import Ajv from "ajv";

const baseURL = process.env.TERN_BASE_URL + "/v1";
const apiKey = process.env.TERN_TEST_API_KEY;
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120_000 });
const model = process.env.TERN_MODEL_ID;
const ajv = new Ajv({ allErrors: true, strict: false });
// The tool-call formats under test: NAME=URL pairs (run.sh starts one server per template).
const toolServers = (process.env.TERN_TOOL_SERVERS || `generic=${process.env.TERN_BASE_URL}`).split(",").map((kv) => {
  const [name, url] = kv.split("=");
  return { name, client: new OpenAI({ baseURL: url + "/v1", apiKey, maxRetries: 0, timeout: 120_000 }) };
});

// Nested objects, enums, arrays with bounds, required fields; strings bounded so that a model
// that never stops writing one still finishes within max_tokens.
const personSchema = {
  type: "object",
  properties: {
    name: { type: "string", minLength: 1, maxLength: 12 },
    age: { type: "integer", minimum: 0 },
    mood: { enum: ["happy", "sad", "sleepy"] },
    pets: {
      type: "array",
      minItems: 1,
      maxItems: 3,
      items: {
        type: "object",
        properties: { kind: { enum: ["cat", "dog", "bird"] }, legs: { enum: [0, 2, 4, 6, 8] } },
        required: ["kind", "legs"],
        additionalProperties: false,
      },
    },
    home: {
      type: "object",
      properties: { town: { type: "string", maxLength: 10 }, big: { type: "boolean" } },
      required: ["town"],
      additionalProperties: false,
    },
  },
  required: ["name", "mood", "pets", "home"],
  additionalProperties: false,
};

const weatherTool = {
  type: "function",
  function: {
    name: "get_weather",
    description: "The current weather in a city",
    parameters: {
      type: "object",
      properties: {
        city: { type: "string", minLength: 1, maxLength: 16 },
        unit: { enum: ["celsius", "fahrenheit"] },
      },
      required: ["city", "unit"],
      additionalProperties: false,
    },
  },
};
const timeTool = {
  type: "function",
  function: {
    name: "get_time",
    description: "The time in a time zone",
    parameters: {
      type: "object",
      properties: { zone: { type: "string", maxLength: 12 } },
      required: ["zone"],
      additionalProperties: false,
    },
  },
};
const toolSchemas = { get_weather: weatherTool.function.parameters, get_time: timeTool.function.parameters };

function checkCall(call) {
  assert.equal(call.type, "function");
  // OpenAI's ids are "call_..."; Mistral's templates require 9 letters and digits.
  assert.match(call.id, /^(call_[A-Za-z0-9]{8,}|[A-Za-z0-9]{9})$/);
  assert.ok(call.function.name in toolSchemas, `known tool: ${call.function.name}`);
  const args = JSON.parse(call.function.arguments);
  const validate = ajv.compile(toolSchemas[call.function.name]);
  assert.ok(validate(args), `arguments ${call.function.arguments}: ${ajv.errorsText(validate.errors)}`);
  return args;
}

test("response_format json_schema: every answer is valid under ajv", async () => {
  const validate = ajv.compile(personSchema);
  const seen = new Set();
  for (let seed = 1; seed <= 12; seed++) {
    const r = await client.chat.completions.create({
      model,
      messages: [{ role: "user", content: "Describe a person." }],
      response_format: { type: "json_schema", json_schema: { name: "person", schema: personSchema, strict: true } },
      temperature: 1.0,
      seed,
      max_tokens: 400,
    });
    const c = r.choices[0];
    assert.equal(c.finish_reason, "stop", `seed ${seed} finished: ${c.message.content}`);
    const value = JSON.parse(c.message.content);
    assert.ok(validate(value), `seed ${seed}: ${c.message.content}: ${ajv.errorsText(validate.errors)}`);
    seen.add(c.message.content);
  }
  assert.ok(seen.size > 1, "different seeds give different instances");
});

test("response_format json_object: the answer is JSON", async () => {
  let finished = 0;
  // stories260K writes stories inside strings: a logit_bias on its '"' and '}' tokens (ids from
  // /tokenize) makes strings and objects end within the budget.
  const t = await fetch(process.env.TERN_BASE_URL + "/tokenize", {
    method: "POST",
    headers: { Authorization: `Bearer ${apiKey}` },
    body: JSON.stringify({ content: '"}', add_special_tokens: false }),
  }).then((r) => r.json());
  const logit_bias = { [t.tokens[0]]: 5, [t.tokens[1]]: 8 };
  for (let seed = 1; seed <= 12; seed++) {
    const r = await client.chat.completions.create({
      model,
      messages: [{ role: "user", content: "Answer in JSON." }],
      response_format: { type: "json_object" },
      temperature: 0.7,
      seed,
      max_tokens: 300,
      logit_bias,
    });
    const c = r.choices[0];
    if (c.finish_reason !== "stop") continue; // a long object cut by max_tokens is a valid prefix only
    finished++;
    const v = JSON.parse(c.message.content);
    assert.equal(typeof v, "object");
    assert.ok(v !== null && !Array.isArray(v), "json_object is an object");
  }
  assert.ok(finished > 0, "some answers finished");
});

test("llama.cpp's grammar and json_schema fields", async () => {
  const r = await client.chat.completions.create({
    model,
    messages: [{ role: "user", content: "Yes or no?" }],
    grammar: 'root ::= ("yes" | "no") "."',
    temperature: 1.0,
    seed: 3,
    max_tokens: 20,
  });
  assert.match(r.choices[0].message.content, /^(yes|no)\.$/);
  const c = await client.completions.create({
    model,
    prompt: "The number is",
    json_schema: { type: "integer", minimum: 0 },
    temperature: 1.0,
    seed: 4,
    max_tokens: 20,
  });
  assert.match(c.choices[0].text.trim(), /^-?\d+$/);
});

test("structured output streams the same text as without streaming", async () => {
  const args = {
    model,
    messages: [{ role: "user", content: "Describe a person." }],
    response_format: { type: "json_schema", json_schema: { name: "person", schema: personSchema } },
    temperature: 1.0,
    seed: 42,
    max_tokens: 400,
  };
  const whole = await client.chat.completions.create(args);
  const stream = await client.chat.completions.create({ ...args, stream: true });
  let text = "";
  for await (const chunk of stream) for (const c of chunk.choices) text += c.delta.content || "";
  assert.equal(text, whole.choices[0].message.content);
});

for (const { name, client: tc } of toolServers) {
  test(`${name} tool calling: forced call, tool result, final answer (not streamed)`, async () => {
    const messages = [
      { role: "system", content: "You can call tools." },
      { role: "user", content: "What is the weather in Paris?" },
    ];
    const r = await tc.chat.completions.create({
      model,
      messages,
      tools: [weatherTool, timeTool],
      tool_choice: "required",
      parallel_tool_calls: false,
      temperature: 0.8,
      seed: 11,
      max_tokens: 200,
    });
    const c = r.choices[0];
    assert.equal(c.finish_reason, "tool_calls");
    assert.equal(c.message.role, "assistant");
    assert.equal(c.message.tool_calls.length, 1, "parallel_tool_calls: false gives one call");
    checkCall(c.message.tool_calls[0]);

    // The client sends the call back with the tool's result; the model answers in text.
    messages.push(c.message);
    messages.push({ role: "tool", tool_call_id: c.message.tool_calls[0].id, content: '{"temperature": 21}' });
    const final = await tc.chat.completions.create({
      model,
      messages,
      tools: [weatherTool, timeTool],
      tool_choice: "none",
      temperature: 0,
      max_tokens: 30,
    });
    const f = final.choices[0];
    assert.ok(["stop", "length"].includes(f.finish_reason));
    assert.equal(typeof f.message.content, "string");
    assert.ok(!f.message.tool_calls || f.message.tool_calls.length === 0);
  });

  test(`${name} tool calling: a named tool_choice calls that function, streamed equals not streamed`, async () => {
    const args = {
      model,
      messages: [{ role: "user", content: "What time is it in Tokyo?" }],
      tools: [weatherTool, timeTool],
      tool_choice: { type: "function", function: { name: "get_time" } },
      temperature: 0.9,
      seed: 5,
      max_tokens: 200,
    };
    const whole = await tc.chat.completions.create(args);
    const w = whole.choices[0];
    assert.equal(w.finish_reason, "tool_calls");
    assert.ok(w.message.tool_calls.length >= 1);
    for (const call of w.message.tool_calls) {
      assert.equal(call.function.name, "get_time");
      checkCall(call);
    }

    // Streamed as OpenAI streams calls: the first delta of a call has its id, type and name,
    // later deltas carry fragments of the arguments; the client joins them by index.
    const stream = await tc.chat.completions.create({ ...args, stream: true });
    const calls = [];
    let finish = null;
    let argumentChunks = 0;
    for await (const chunk of stream) {
      for (const c of chunk.choices) {
        if (c.finish_reason) finish = c.finish_reason;
        for (const d of c.delta.tool_calls || []) {
          if (!calls[d.index]) {
            assert.ok(d.id && d.type === "function" && d.function.name, "a call's first delta names it");
            calls[d.index] = { id: d.id, type: d.type, function: { name: d.function.name, arguments: "" } };
          }
          if (d.function && d.function.arguments) {
            calls[d.index].function.arguments += d.function.arguments;
            argumentChunks++;
          }
        }
      }
    }
    assert.equal(finish, "tool_calls");
    assert.equal(calls.length, w.message.tool_calls.length);
    calls.forEach((call, i) => {
      assert.equal(call.function.name, w.message.tool_calls[i].function.name);
      assert.deepEqual(JSON.parse(call.function.arguments), JSON.parse(w.message.tool_calls[i].function.arguments));
      checkCall(call);
    });
    assert.ok(argumentChunks >= 1);
  });

  test(`${name} tool calling: tool_choice auto lets the model answer in text`, async () => {
    const r = await tc.chat.completions.create({
      model,
      messages: [{ role: "user", content: "Tell me a story." }],
      tools: [weatherTool],
      temperature: 0,
      max_tokens: 24,
    });
    const c = r.choices[0];
    // stories260K never writes a call: the answer is its text, as without tools.
    assert.ok(["stop", "length"].includes(c.finish_reason));
    assert.equal(typeof c.message.content, "string");
    assert.ok(c.message.content.length > 0);
  });

  test(`${name} tool calling: forced calls are valid for many seeds`, async () => {
    for (let seed = 100; seed < 112; seed++) {
      const r = await tc.chat.completions.create({
        model,
        messages: [{ role: "user", content: "Use a tool." }],
        tools: [weatherTool, timeTool],
        tool_choice: "required",
          temperature: 1.2,
        seed,
        max_tokens: 300,
      });
      const c = r.choices[0];
      assert.equal(c.finish_reason, "tool_calls", `seed ${seed}: ${JSON.stringify(c.message)}`);
      for (const call of c.message.tool_calls) checkCall(call);
    }
  });
}

test("bad structured-output and tool requests get a 400 with an OpenAI error", async () => {
  const base = { model, messages: [{ role: "user", content: "Hi" }], max_tokens: 4 };
  const bad = [
    { ...base, response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "frobnicate" } } } },
    { ...base, response_format: { type: "yaml" } },
    { ...base, grammar: "root ::= (" },
    { ...base, grammar: "root ::= undefined-rule" },
    { ...base, tools: [{ type: "function", function: { name: "f", parameters: { type: "object", properties: { a: { type: 7 } } } } }] },
    { ...base, tools: [weatherTool], tool_choice: { type: "function", function: { name: "nope" } } },
    { ...base, logit_bias: { "999999": 5 } },
  ];
  for (const body of bad) {
    await assert.rejects(
      client.chat.completions.create(body),
      (e) => {
        assert.ok(e instanceof OpenAI.BadRequestError, `${JSON.stringify(body)} -> ${e}`);
        assert.equal(e.status, 400);
        assert.ok(e.error && typeof e.error.message === "string" && e.error.message.length > 0);
        return true;
      },
    );
  }
});

test("system_fingerprint and llama.cpp's timings are on every answer", async () => {
  const r = await client.chat.completions.create({ model, messages: [{ role: "user", content: "Hi" }], max_tokens: 8, temperature: 0 });
  assert.match(r.system_fingerprint, /^fp_[0-9a-f]{16}$/);
  const t = r.timings;
  assert.ok(t && t.prompt_n > 0 && t.predicted_n === r.usage.completion_tokens, JSON.stringify(t));
  for (const k of ["prompt_ms", "prompt_per_second", "predicted_ms", "predicted_per_second"]) assert.equal(typeof t[k], "number");
  const again = await client.chat.completions.create({ model, messages: [{ role: "user", content: "Hi" }], max_tokens: 8 });
  assert.equal(again.system_fingerprint, r.system_fingerprint);
  const stream = await client.chat.completions.create({ model, messages: [{ role: "user", content: "Hi" }], max_tokens: 8, stream: true });
  let last = null;
  for await (const chunk of stream) {
    assert.equal(chunk.system_fingerprint, r.system_fingerprint);
    if (chunk.choices.length && chunk.choices[0].finish_reason) last = chunk;
  }
  assert.ok(last && last.timings && last.timings.predicted_n > 0);
});

test("truncate_prompt_tokens keeps the end of a prompt that does not fit", async () => {
  const long = "Once upon a time there was a little girl. ".repeat(400);
  await assert.rejects(client.completions.create({ model, prompt: long, max_tokens: 8 }), (e) => {
    assert.equal(e.status, 400);
    assert.match(e.error.message, /maximum context length is \d+ tokens/);
    return true;
  });
  const r = await client.completions.create({ model, prompt: long, max_tokens: 8, truncate_prompt_tokens: 100, temperature: 0 });
  assert.equal(r.usage.prompt_tokens, 100);
});
