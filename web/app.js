// tern's chat page: talks to /v1/chat/completions with stream: true and shows, per answer,
// the metrics a user can feel: time to first token (TTFT) and decode speed (tok/s).
// Plain browser JavaScript, no build step and no CDN: the server embeds this file.
"use strict";

const $ = (id) => document.getElementById(id);
const turns = [];  // [{role, content}] of the conversation so far
let controller = null;  // AbortController of the request in flight

const SETTINGS = ["system", "temperature", "top_p", "top_k", "min_p", "max_tokens", "seed",
                  "presence_penalty", "frequency_penalty", "api_key"];

function loadSettings() {
  for (const id of SETTINGS) {
    const v = localStorage.getItem("tern." + id);
    if (v !== null) $(id).value = v;
  }
}
function saveSettings() {
  for (const id of SETTINGS) localStorage.setItem("tern." + id, $(id).value);
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api_key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function setStatus(text, isError = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", isError);
}

async function loadModel() {
  try {
    const r = await fetch("/v1/models", { headers: headers() });
    const j = await r.json();
    if (!r.ok) throw new Error(j.error ? j.error.message : r.statusText);
    const m = j.data[0];
    $("model").textContent = m.id + (m.max_model_len ? ` · ctx ${m.max_model_len}` : "");
  } catch (e) {
    $("model").textContent = "(model unknown)";
    setStatus(String(e.message || e), true);
  }
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.dataset.role = role;
  const body = document.createElement("div");
  body.className = "text";
  body.textContent = text;
  div.appendChild(body);
  $("conversation").appendChild(div);
  div.scrollIntoView({ block: "end" });
  return div;
}

function numberOr(id, fallback) {
  const v = $(id).value.trim();
  if (v === "") return fallback;
  const x = Number(v);
  return Number.isFinite(x) ? x : fallback;
}

function requestBody() {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...turns);
  const body = {
    messages,
    stream: true,
    stream_options: { include_usage: true },
    temperature: numberOr("temperature", 0.8),
    top_p: numberOr("top_p", 0.95),
    top_k: Math.trunc(numberOr("top_k", 40)),
    min_p: numberOr("min_p", 0.05),
    max_tokens: Math.trunc(numberOr("max_tokens", 256)),
    presence_penalty: numberOr("presence_penalty", 0),
    frequency_penalty: numberOr("frequency_penalty", 0),
  };
  const seed = numberOr("seed", null);
  if (seed !== null) body.seed = Math.trunc(seed);
  return body;
}

// Reads a Server-Sent Events body, calling onData with each parsed `data:` payload.
async function readEvents(response, onData) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        onData(JSON.parse(data));
      }
    }
  }
}

function showMetrics(div, m) {
  let el = div.querySelector(".metrics");
  if (!el) {
    el = document.createElement("div");
    el.className = "metrics";
    div.appendChild(el);
  }
  const parts = [];
  if (m.ttft !== null) parts.push(`TTFT ${m.ttft.toFixed(0)} ms`);
  if (m.tokS !== null) parts.push(`${m.tokS.toFixed(1)} tok/s`);
  if (m.tokens !== null) parts.push(`${m.tokens} tokens`);
  if (m.total !== null) parts.push(`${(m.total / 1000).toFixed(2)} s`);
  if (m.finish) parts.push(`finish: ${m.finish}`);
  el.textContent = parts.join(" · ");
}

async function send(text) {
  turns.push({ role: "user", content: text });
  addMessage("user", text);
  const div = addMessage("assistant", "");
  div.classList.add("streaming");
  const textEl = div.querySelector(".text");
  $("send").disabled = true;
  $("stop").hidden = false;
  setStatus("generating…");
  controller = new AbortController();

  const t0 = performance.now();
  let tFirst = null, tLast = null, nChunks = 0, answer = "";
  const m = { ttft: null, tokS: null, tokens: null, total: null, finish: null };
  try {
    const r = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(), body: JSON.stringify(requestBody()), signal: controller.signal,
    });
    if (!r.ok) {
      const j = await r.json().catch(() => ({}));
      throw new Error(j.error ? j.error.message : `HTTP ${r.status}`);
    }
    await readEvents(r, (ev) => {
      if (ev.error) throw new Error(ev.error.message);
      if (ev.usage) m.tokens = ev.usage.completion_tokens;
      for (const c of ev.choices || []) {
        const piece = c.delta && c.delta.content;
        if (piece) {
          const now = performance.now();
          if (tFirst === null) { tFirst = now; m.ttft = now - t0; }
          tLast = now;
          nChunks++;
          answer += piece;
          window.ternMarkdown.renderInto(textEl, answer);
          div.scrollIntoView({ block: "end" });
        }
        if (c.finish_reason) m.finish = c.finish_reason;
      }
      // Live figures while the answer streams; exact ones once usage arrives.
      const n = m.tokens !== null ? m.tokens : nChunks;
      if (tFirst !== null && tLast > tFirst && n > 1) m.tokS = (n - 1) / ((tLast - tFirst) / 1000);
      m.total = performance.now() - t0;
      showMetrics(div, m);
    });
    setStatus("");
  } catch (e) {
    if (e.name === "AbortError") {
      m.finish = "stopped";
      setStatus("");
    } else {
      const err = document.createElement("div");
      err.className = "error";
      err.textContent = "Error: " + (e.message || e);
      div.appendChild(err);
      setStatus("error", true);
    }
  } finally {
    m.total = performance.now() - t0;
    showMetrics(div, m);
    div.classList.remove("streaming");
    div.dataset.done = "true";
    turns.push({ role: "assistant", content: answer });
    controller = null;
    $("send").disabled = false;
    $("stop").hidden = true;
  }
}

$("composer").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("prompt").value;
  if (!text.trim() || controller) return;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", () => controller && controller.abort());
$("new-chat").addEventListener("click", () => {
  if (controller) controller.abort();
  turns.length = 0;
  $("conversation").replaceChildren();
});
$("toggle-settings").addEventListener("click", () => {
  const s = $("settings");
  s.hidden = !s.hidden;
  $("toggle-settings").setAttribute("aria-expanded", String(!s.hidden));
});
for (const id of SETTINGS) $(id).addEventListener("change", () => { saveSettings(); if (id === "api_key") loadModel(); });

loadSettings();
loadModel();
