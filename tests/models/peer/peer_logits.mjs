#!/usr/bin/env node
// peer_logits.mjs — llama.cpp's greedy continuation AND its log-probabilities over the whole
// vocabulary at every evaluated position, through the npm package node-llama-cpp (the "peer",
// installed by shared/peer/setup.sh into $PEER_DIR, default ~/.cache/llamacpp-peer).
//
// What it is for: an independent reference for tern's logits (log-softmax equals logits up to a
// per-position constant) and greedy decoding, on any GGUF file llama.cpp loads.
//
//   node tests/models/peer/peer_logits.mjs --model M.gguf --ids "1 2 3" [--n 64] [--threads 1]
//   node tests/models/peer/peer_logits.mjs --model M.gguf --prompt "Once upon" [--bos] [--n 64]
//   node tests/models/peer/peer_logits.mjs --model M.gguf --ids-list "1 2 3;1 4 5" [--n 64]
//       several prompts in one process (each from an empty KV cache): {"runs":[{...}, ...]};
//       add --prompt TEXT [--bos] for one more run (last) on the tokenized text
//
// Prints one JSON object:
//   {"engine":"llama.cpp", "n_vocab":V, "prompt_ids":[...], "ids":[greedy continuation, n ids],
//    "logprobs":[[V numbers] for each evaluated position 0..len(prompt)+n-2]}
// logprobs[i] is log p(next | tokens[0..i]) over tokens = prompt_ids ++ ids, so
// argmax(logprobs[len(prompt)-1+j]) == ids[j]. Tokens whose probability is 0 in float32 print null.
// --out FILE writes the JSON there instead of stdout.
// Greedy does not stop at end-of-generation tokens: it always produces n ids.
// Options: --f16-kv keeps llama.cpp's default F16 KV cache (default here: F32, for precision);
//          --flash-attn enables flash attention (default here: off).
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";
import path from "node:path";
import os from "node:os";
import fs from "node:fs";

function arg(name, def) {
  const i = process.argv.indexOf("--" + name);
  if (i < 0) return def;
  const v = process.argv[i + 1];
  return v === undefined || v.startsWith("--") ? true : v;
}

const peerDir = process.env.PEER_DIR || path.join(os.homedir(), ".cache", "llamacpp-peer");
let nlc;
try {
  const req = createRequire(path.join(peerDir, "package.json"));
  nlc = await import(pathToFileURL(req.resolve("node-llama-cpp")).href);
} catch (e) {
  console.error(`peer_logits: cannot import node-llama-cpp from ${peerDir}/node_modules (${e.message})`);
  process.exit(3);
}
const { getLlama, LlamaLogLevel } = nlc;

const modelPath = arg("model");
if (typeof modelPath !== "string" || !fs.existsSync(modelPath)) {
  console.error('usage: --model M.gguf (--ids "1 2 3" | --prompt TEXT [--bos]) [--n 64] [--threads 2]');
  process.exit(2);
}
const n = Number(arg("n", 64));
const threads = Number(arg("threads", 1));  // 1: tiny models gain nothing from more, and a busy machine makes spinning threads slow

const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error, maxThreads: threads });
const model = await llama.loadModel({ modelPath, gpuLayers: 0 });

let prompts = [];
if (typeof arg("ids-list") === "string")
  prompts = arg("ids-list").split(";").map((p) => p.trim()).filter((p) => p.length).map((p) => p.split(/[\s,]+/).map(Number));
else if (typeof arg("ids") === "string")
  prompts = [arg("ids").trim().split(/[\s,]+/).map(Number)];
if (typeof arg("prompt") === "string") {  // with --ids-list: one more run, last
  let p = model.tokenize(arg("prompt"));
  if (arg("bos") === true && model.tokens.bos !== null) p = [model.tokens.bos, ...p];
  prompts.push(p);
}
if (prompts.length === 0) {
  console.error("need --ids, --ids-list or --prompt");
  process.exit(2);
}
const nVocab = model.vocabularySize ?? model.fileInsights?.vocabularySize;

const longest = Math.max(...prompts.map((p) => p.length));
const context = await model.createContext({
  contextSize: Math.max(64, longest + n + 8), threads, batchSize: Math.max(longest, 32),
  flashAttention: arg("flash-attn") === true,
  ...(arg("f16-kv") === true ? {} : { experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32" }),
  batching: { dispatchSchedule: (dispatch) => dispatch() },
});
const seq = context.getSequence();
const want = { generateNext: { probabilities: true, token: true, options: { temperature: 0 } } };

async function greedy(prompt) {
  const logprobs = [];
  const ids = [];
  const record = (out) => {
    const probs = out?.next?.probabilities;
    if (!probs) throw new Error("no probabilities returned");
    const row = new Array(nVocab).fill(null);
    for (const [tok, p] of probs) row[tok] = p > 0 ? Math.log(p) : null;
    logprobs.push(row);
    return out.next.token;
  };
  await seq.clearHistory();
  let res = await seq.controlledEvaluate(prompt.map((t) => [t, want]));
  let next = null;
  for (let i = 0; i < prompt.length; i++) next = record(res[i]);
  while (ids.length < n) {
    ids.push(next);
    if (ids.length >= n) break;
    res = await seq.controlledEvaluate([[next, want]]);
    next = record(res[0]);
  }
  return { prompt_ids: prompt, ids, logprobs };
}

const runs = [];
for (const p of prompts) runs.push(await greedy(p));
const head = { engine: "llama.cpp", via: "node-llama-cpp", model: modelPath, n_vocab: nVocab };
const text = JSON.stringify(typeof arg("ids-list") === "string" ? { ...head, runs } : { ...head, ...runs[0] }) + "\n";
if (typeof arg("out") === "string") { fs.writeFileSync(arg("out"), text); process.exit(0); }
// exit only once the pipe has taken everything: process.exit() right after a write cuts it short
process.stdout.write(text, () => process.exit(0));
