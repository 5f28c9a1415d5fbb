#!/usr/bin/env node
// llama.cpp's own batching, side by side with `tern bench-serve`: the same prompts (token ids
// written by `tern bench-serve --save-prompts FILE`), the same closed-loop concurrency, greedy,
// a fixed number of output tokens. llama.cpp runs them as parallel sequences of one context
// (node-llama-cpp batches every sequence's pending tokens into one llama_decode per step).
// With --open-loop, the requests arrive at the times the prompts file holds (`arrival_s`,
// saved by `tern bench-serve --request-rate R --save-prompts FILE`: the same Poisson arrivals
// tern saw) and wait for a free sequence (llama-server's --parallel slots); TTFT counts from
// the arrival.
//
//   bash ../shared/peer/setup.sh      # installs node-llama-cpp into $PEER_DIR once
//   node bench/llamacpp_serve.mjs --model M.gguf --prompts prompts.json --concurrency 16 \
//        [--threads 2] [--ctx-per-seq 512] [--batch 512] [--open-loop] [--goodput ttft:MS,tpot:MS,tbt:MS]
//
// Prints one JSON line: output_tok_s, total_tok_s, request_throughput, ttft/tbt percentiles,
// and with --goodput the requests that met every objective (vLLM's definition: TTFT, mean time
// per output token, end-to-end latency; and tbt: the request's longest gap between tokens).
import { readFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { performance } from "node:perf_hooks";

function arg(name, def) {
  const i = process.argv.indexOf("--" + name);
  if (i < 0) return def;
  const v = process.argv[i + 1];
  return v === undefined || v.startsWith("--") ? true : v;
}
function pct(xs, p) {
  if (xs.length === 0) return 0;
  const s = [...xs].sort((a, b) => a - b);
  const r = (p / 100) * (s.length - 1), lo = Math.floor(r), hi = Math.ceil(r);
  return s[lo] + (s[hi] - s[lo]) * (r - lo);
}
const mean = (xs) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0);

const modelPath = arg("model");
const promptsPath = arg("prompts");
if (!modelPath || !promptsPath) {
  console.error("usage: --model M.gguf --prompts prompts.json [--concurrency C] [--threads N] [--ctx-per-seq N] [--batch N]");
  process.exit(2);
}
const peerDir = process.env.PEER_DIR || join(homedir(), ".cache", "llamacpp-peer");
const { getLlama, LlamaLogLevel } = await import(
  pathToFileURL(join(peerDir, "node_modules", "node-llama-cpp", "dist", "index.js")).href);

const spec = JSON.parse(readFileSync(promptsPath, "utf8"));
const prompts = spec.prompts, maxTokens = Number(arg("max-tokens", spec.max_tokens));
const concurrency = Math.min(Number(arg("concurrency", 1)), prompts.length);
const threads = Number(arg("threads", 2));
const longest = Math.max(...prompts.map((p) => p.length)) + maxTokens;
const ctxPerSeq = Number(arg("ctx-per-seq", longest + 8));
const batchSize = Number(arg("batch", 512));

const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error, maxThreads: threads });
const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
const context = await model.createContext({ sequences: concurrency, contextSize: ctxPerSeq, batchSize, threads,
  flashAttention: false });
const seqs = Array.from({ length: concurrency }, () => context.getSequence());

// Warm-up: page the weights in.
{
  let n = 0;
  for await (const _ of seqs[0].evaluate(prompts[0].slice(0, 16), { temperature: 0 })) if (++n >= 4) break;
  await seqs[0].clearHistory();
}

const openLoop = arg("open-loop", false) === true;
const arrivals = openLoop ? spec.arrival_s : null;
if (openLoop && (!Array.isArray(arrivals) || arrivals.length !== prompts.length)) {
  console.error("--open-loop needs the prompts file's arrival_s (tern bench-serve --request-rate R --save-prompts FILE)");
  process.exit(2);
}
const slo = { ttft: 0, tpot: 0, e2el: 0, tbt: 0 };
for (const item of String(arg("goodput", "")).split(",").filter((x) => x)) {
  const [k, v] = item.split(":");
  if (!(k in slo) || !(Number(v) > 0)) {
    console.error(`--goodput takes ttft:MS,tpot:MS,e2el:MS,tbt:MS, got ${item}`);
    process.exit(2);
  }
  slo[k] = Number(v);
}

const ttft = [], tbt = [], e2e = [];
let next = 0, nOut = 0, nIn = 0, nGood = 0, goodTokens = 0;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const t0 = performance.now();
async function worker(seq) {
  while (next < prompts.length) {
    const i = next++;
    const p = prompts[i];
    // Open loop: the request exists from its arrival; it waits here for this free sequence.
    const arrival = openLoop ? t0 + arrivals[i] * 1000 : performance.now();
    if (openLoop && arrival > performance.now()) await sleep(arrival - performance.now());
    await seq.clearHistory();
    const start = openLoop ? arrival : performance.now();
    let last = start, n = 0;
    const gaps = [];
    let first = 0;
    for await (const _ of seq.evaluate(p, { temperature: 0 })) {
      const t = performance.now();
      if (n === 0) first = t - start; else gaps.push(t - last);
      last = t;
      if (++n >= maxTokens) break;
    }
    ttft.push(first);
    tbt.push(...gaps);
    e2e.push(last - start);
    nOut += n;
    nIn += p.length;
    const tpot = gaps.length ? mean(gaps) : 0;
    const longest = gaps.length ? Math.max(...gaps) : 0;
    if ((!slo.ttft || first <= slo.ttft) && (!slo.tpot || tpot <= slo.tpot) && (!slo.e2el || last - start <= slo.e2el) &&
        (!slo.tbt || longest <= slo.tbt)) {
      ++nGood;
      goodTokens += n;
    }
  }
}
await Promise.all(seqs.map(worker));
const dur = (performance.now() - t0) / 1000;
console.log(JSON.stringify({
  engine: "llama.cpp", via: "node-llama-cpp", model: modelPath, threads, concurrency, num_prompts: prompts.length,
  max_tokens: maxTokens, ctx_per_seq: context.contextSize, kv_cache_type: "f16", duration_s: +dur.toFixed(3),
  request_throughput: +(prompts.length / dur).toFixed(4), output_tok_s: +(nOut / dur).toFixed(3),
  total_tok_s: +((nIn + nOut) / dur).toFixed(3),
  ttft_ms_mean: +mean(ttft).toFixed(2), ttft_ms_p50: +pct(ttft, 50).toFixed(2), ttft_ms_p99: +pct(ttft, 99).toFixed(2),
  tbt_ms_mean: +mean(tbt).toFixed(2), tbt_ms_p50: +pct(tbt, 50).toFixed(2), tbt_ms_p99: +pct(tbt, 99).toFixed(2),
  e2e_ms_mean: +mean(e2e).toFixed(2), e2e_ms_p99: +pct(e2e, 99).toFixed(2),
  request_rate: openLoop ? spec.request_rate ?? null : null, goodput_slo: slo, good_requests: nGood,
  goodput_req_s: +(nGood / dur).toFixed(4), goodput_tok_s: +(goodTokens / dur).toFixed(3),
  slo_attainment_pct: +(100 * nGood / prompts.length).toFixed(2),
}));
process.exit(0);
