// Bounded load test of `tern serve` on loopback (started by load_test.sh, which passes):
//   TERN_BASE_URL, TERN_SERVER_PID, TERN_LOAD_SECONDS (default 20), TERN_LOAD_CLIENTS (64)
// CLIENTS concurrent clients send completions and chat requests, most of them streamed, for
// SECONDS; some disconnect mid-stream or while waiting. Then it checks:
//   - no 5xx, and every request a client did not abandon completed (200, [DONE], a finish_reason);
//   - /metrics agrees with what the clients saw (request counts by status, token counters);
//   - once idle: no request running or waiting, every KV block free, RSS back to its baseline.
// TTFT is measured on streamed requests (first text chunk), E2E on completed ones.
// Prints one JSON summary line ("load-test: {...}") with the figures. Node only, no packages.
import http from "node:http";
import fs from "node:fs";

const base = new URL(process.env.TERN_BASE_URL);
const pid = Number(process.env.TERN_SERVER_PID);
const seconds = Number(process.env.TERN_LOAD_SECONDS || 20);
const nClients = Number(process.env.TERN_LOAD_CLIENTS || 64);
const agent = new http.Agent({ keepAlive: true, maxSockets: nClients + 4 });

// Deterministic pseudo-random choices (xorshift), so a failing run can be replayed.
let seed = 0x9e3779b9;
function rand() {
  seed ^= seed << 13; seed >>>= 0;
  seed ^= seed >>> 17;
  seed ^= seed << 5; seed >>>= 0;
  return seed / 4294967296;
}
const pick = (a) => a[Math.floor(rand() * a.length)];

const openings = ["Once upon a time", "Lily and Ben went to the park.", "The little dog", "One day, a big bird",
                  "Tom had a red ball.", "There was a girl named Sue."];
// A shared preamble so the prefix cache has something to hit.
const preamble = "Once upon a time, in a small town, there lived a kind old man who loved to tell stories. ";

function rssBytes() {
  const s = fs.readFileSync(`/proc/${pid}/status`, "utf8");
  return Number(/VmRSS:\s+(\d+) kB/.exec(s)[1]) * 1024;
}

function get(path) {
  return new Promise((resolve, reject) => {
    http.get({ host: base.hostname, port: base.port, path, agent }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (d) => (body += d));
      res.on("end", () => resolve({ status: res.statusCode, body }));
    }).on("error", reject);
  });
}

async function metrics() {
  const { body } = await get("/metrics");
  const m = new Map();
  for (const line of body.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const sp = line.lastIndexOf(" ");
    m.set(line.slice(0, sp), Number(line.slice(sp + 1)));
  }
  return m;
}
const val = (m, k) => m.get(k) ?? 0;
function requestsWith(m, status) {
  return val(m, `tern_requests_total{endpoint="/v1/completions",status="${status}"}`) +
    val(m, `tern_requests_total{endpoint="/v1/chat/completions",status="${status}"}`);
}

// One request. plan.abandonAfter: chunks (stream) or ms (not streamed) after which the client
// hangs up; null: it waits for the end.
function one(plan, via = agent) {
  return new Promise((resolve) => {
    const t0 = performance.now();
    const r = { status: 0, done: false, finish: null, usage: null, abandoned: false, ttft: null, e2e: null, gaps: [], error: null };
    const body = JSON.stringify(plan.body);
    const req = http.request({
      host: base.hostname, port: base.port, path: plan.path, method: "POST", agent: via,
      headers: { "Content-Type": "application/json", "Content-Length": Buffer.byteLength(body) },
    }, (res) => {
      r.status = res.statusCode;
      let buf = "";
      let chunks = 0;
      let last = null;
      res.setEncoding("utf8");
      res.on("data", (d) => {
        buf += d;
        if (!plan.body.stream) return;
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const ev = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          if (!ev.startsWith("data: ")) continue;
          const data = ev.slice(6);
          if (data === "[DONE]") { r.done = true; continue; }
          const j = JSON.parse(data);
          if (j.error) r.error = j.error.message;
          if (j.usage) r.usage = j.usage;
          for (const c of j.choices || []) {
            const piece = c.text ?? c.delta?.content;
            if (piece) {
              const now = performance.now();
              if (r.ttft === null) r.ttft = now - t0;
              else r.gaps.push(now - last);
              last = now;
            }
            if (c.finish_reason) r.finish = c.finish_reason;
          }
          if (plan.abandonAfter !== null && ++chunks >= plan.abandonAfter && !r.done) {
            r.abandoned = true;
            req.destroy();
            resolve(r);
            return;
          }
        }
      });
      res.on("end", () => {
        r.e2e = performance.now() - t0;
        if (!plan.body.stream && r.status === 200) {
          const j = JSON.parse(buf);
          r.done = true;
          r.usage = j.usage;
          r.finish = j.choices[0].finish_reason;
        } else if (!plan.body.stream && r.status !== 200) {
          r.error = buf;
        }
        resolve(r);
      });
      res.on("error", () => resolve(r));
    });
    req.on("error", (e) => {
      if (!r.abandoned) r.error = String(e);
      resolve(r);
    });
    if (!plan.body.stream && plan.abandonAfter !== null) {
      setTimeout(() => {
        if (!r.done) {
          r.abandoned = true;
          req.destroy();
          resolve(r);
        }
      }, plan.abandonAfter);
    }
    req.end(body);
  });
}

function makePlan() {
  const chat = rand() < 0.5;
  const stream = rand() < 0.8;
  const prompt = (rand() < 0.5 ? preamble : "") + pick(openings);
  const body = { max_tokens: 16 + Math.floor(rand() * 180), temperature: 0.8, top_p: 0.95, stream };
  if (rand() < 0.2) body.n = 2;
  if (chat) body.messages = [{ role: "user", content: prompt }];
  else body.prompt = prompt;
  if (stream && rand() < 0.5) body.stream_options = { include_usage: true };
  let abandonAfter = null;
  if (stream && rand() < 0.15) abandonAfter = 1 + Math.floor(rand() * 12);
  if (!stream && rand() < 0.05) abandonAfter = Math.floor(rand() * 40);
  return { path: chat ? "/v1/chat/completions" : "/v1/completions", body, abandonAfter };
}

function quantile(xs, q) {
  if (!xs.length) return null;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))];
}

async function waitIdle(timeoutMs) {
  const end = Date.now() + timeoutMs;
  let m;
  while (Date.now() < end) {
    m = await metrics();
    if (val(m, "tern_num_requests_running") === 0 && val(m, "tern_num_requests_waiting") === 0 &&
        val(m, "tern_http_requests_in_flight") === 0 && val(m, "tern_kv_blocks_used") === 0) return m;
    await new Promise((r) => setTimeout(r, 50));
  }
  return m;
}

async function main() {
  // Warm-up with every HTTP thread busy at once (TERN_WARMUP_CONCURRENCY, set by load_test.sh
  // to what the server admits): thread stacks, allocator caches and the KV arena reach their
  // steady state, so the baseline RSS is a warm idle server's, not a cold one's.
  const warm = Number(process.env.TERN_WARMUP_CONCURRENCY || nClients);
  const warmAgent = new http.Agent({ keepAlive: false, maxSockets: warm });
  for (let round = 0; round < 2; round++) {
    await Promise.all(Array.from({ length: warm }, (_, i) => one({
      path: i % 2 ? "/v1/chat/completions" : "/v1/completions",
      body: i % 2 ? { messages: [{ role: "user", content: preamble }], max_tokens: 64, stream: true, n: 2 }
                  : { prompt: preamble, max_tokens: 64, stream: true, logprobs: 2 },
      abandonAfter: null,
    }, warmAgent)));
  }
  warmAgent.destroy();
  await waitIdle(10_000);
  await new Promise((r) => setTimeout(r, 300));
  const rssBase = rssBytes();
  const before = await metrics();

  const results = [];
  let rssPeak = rssBase;
  const sampler = setInterval(() => { rssPeak = Math.max(rssPeak, rssBytes()); }, 250);
  const t0 = performance.now();
  const deadline = t0 + seconds * 1000;
  await Promise.all(Array.from({ length: nClients }, async () => {
    while (performance.now() < deadline) results.push(await one(makePlan()));
  }));
  const wall = (performance.now() - t0) / 1000;
  clearInterval(sampler);

  const after = await waitIdle(15_000);
  await new Promise((r) => setTimeout(r, 300));
  const rssAfter = rssBytes();

  // ---- what the clients saw ----
  const byStatus = {};
  for (const r of results) byStatus[r.status] = (byStatus[r.status] || 0) + 1;
  const abandoned = results.filter((r) => r.abandoned);
  const kept = results.filter((r) => !r.abandoned);
  const completed = kept.filter((r) => r.status === 200 && r.done && r.finish && !r.error);
  const failures = kept.filter((r) => !(r.status === 200 && r.done && r.finish && !r.error));
  const fivexx = results.filter((r) => r.status >= 500);
  const withUsage = completed.filter((r) => r.usage);
  const seenCompletion = withUsage.reduce((s, r) => s + r.usage.completion_tokens, 0);
  const seenPrompt = withUsage.reduce((s, r) => s + r.usage.prompt_tokens, 0);
  const ttfts = results.filter((r) => r.ttft !== null && r.status === 200).map((r) => r.ttft);
  const gaps = results.flatMap((r) => r.gaps);
  const e2es = completed.map((r) => r.e2e);

  // ---- what /metrics says happened in the same window ----
  const d = (k) => val(after, k) - val(before, k);
  const d200 = requestsWith(after, 200) - requestsWith(before, 200);
  const d499 = requestsWith(after, 499) - requestsWith(before, 499);
  let dOther = 0;
  for (const [k, v] of after) {
    if (!k.startsWith("tern_requests_total{") || !k.includes("completions")) continue;
    if (k.includes('status="200"') || k.includes('status="499"')) continue;
    dOther += v - (before.get(k) ?? 0);
  }
  const dGen = d("tern_generation_tokens_total");
  const dPrompt = d("tern_prompt_tokens_total");

  const checks = {
    no_5xx: fivexx.length === 0,
    every_kept_request_completed: failures.length === 0,
    // A client that hangs up just as its answer ends may be counted 200 rather than 499; one
    // that aborts within a few ms (non-streamed plans abandon after 0-39 ms) may close the
    // connection before the server has read its request, which the server then never counts
    // (seen once in CI: 2502 counted of 2503, with 30 aborted before any response header).
    metrics_request_count_matches: d200 + d499 <= results.length &&
      d200 + d499 >= results.length - abandoned.filter((r) => r.status === 0).length &&
      d200 >= completed.length && d499 <= abandoned.length && dOther === 0,
    metrics_tokens_cover_what_clients_saw: dGen >= seenCompletion && dPrompt >= seenPrompt,
    idle_after: val(after, "tern_num_requests_running") === 0 && val(after, "tern_num_requests_waiting") === 0 &&
      val(after, "tern_http_requests_in_flight") === 0,
    kv_blocks_all_free: val(after, "tern_kv_blocks_used") === 0 &&
      val(after, "tern_kv_blocks_free") === val(after, "tern_kv_blocks_total"),
    // glibc keeps some freed memory in its arenas; "back to baseline" allows 10% or 16 MiB.
    rss_back_to_baseline: rssAfter <= Math.max(rssBase * 1.10, rssBase + 16 * 1024 * 1024),
  };
  const summary = {
    seconds: Number(wall.toFixed(1)), clients: nClients, requests: results.length, completed: completed.length,
    abandoned_by_client: abandoned.length, by_status: byStatus,
    requests_per_s: Number((results.length / wall).toFixed(1)),
    generated_tokens_per_s: Number((dGen / wall).toFixed(0)),
    client_ttft_ms: { p50: quantile(ttfts, 0.5), p90: quantile(ttfts, 0.9), p99: quantile(ttfts, 0.99) },
    client_tbt_ms: { p50: quantile(gaps, 0.5), p99: quantile(gaps, 0.99) },
    client_e2e_ms: { p50: quantile(e2es, 0.5), p99: quantile(e2es, 0.99) },
    metrics: { status_200: d200, status_499: d499, other_status: dOther, generation_tokens: dGen, prompt_tokens: dPrompt,
               client_seen_completion_tokens: seenCompletion, prefix_cache_hit_rate: val(after, "tern_prefix_cache_hit_rate"),
               kv_blocks_used_after: val(after, "tern_kv_blocks_used"), kv_blocks_total: val(after, "tern_kv_blocks_total") },
    rss_mib: { baseline: +(rssBase / 2 ** 20).toFixed(1), peak: +(rssPeak / 2 ** 20).toFixed(1), after: +(rssAfter / 2 ** 20).toFixed(1) },
    checks,
  };
  for (const k of Object.keys(summary.client_ttft_ms)) if (summary.client_ttft_ms[k] !== null) summary.client_ttft_ms[k] = +summary.client_ttft_ms[k].toFixed(1);
  for (const k of Object.keys(summary.client_e2e_ms)) if (summary.client_e2e_ms[k] !== null) summary.client_e2e_ms[k] = +summary.client_e2e_ms[k].toFixed(1);
  for (const k of Object.keys(summary.client_tbt_ms)) if (summary.client_tbt_ms[k] !== null) summary.client_tbt_ms[k] = +summary.client_tbt_ms[k].toFixed(2);
  console.log("load-test: " + JSON.stringify(summary));
  if (failures.length) console.log("first failures:", JSON.stringify(failures.slice(0, 5)));
  const ok = Object.values(checks).every(Boolean);
  console.log(ok ? "load-test: PASS" : "load-test: FAIL " + Object.entries(checks).filter(([, v]) => !v).map(([k]) => k).join(", "));
  agent.destroy();
  process.exit(ok ? 0 : 1);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
