#!/usr/bin/env bash
# Bounded loopback load test of `tern serve` (see load_test.mjs for what it checks):
#   load_test.sh TERN_BINARY SHARED_DIR [SECONDS] [CLIENTS]
# Defaults: 20 s, 64 clients (what CTest runs); docs/server.md has the figures of a 120 s run.
# TERN_SERVE_ARGS adds flags to `tern serve` (e.g. "--http-threads 256").
# Exit 77 when node or the shared model is missing. Sends traffic to 127.0.0.1 only and stops
# by itself.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
tern="$1"
shared="$2"
export TERN_LOAD_SECONDS="${3:-${TERN_LOAD_SECONDS:-20}}"
export TERN_LOAD_CLIENTS="${4:-${TERN_LOAD_CLIENTS:-64}}"
model="$shared/models/stories260K.gguf"

[ -f "$model" ] || { echo "SKIPPED: missing $model (../shared absent)"; exit 77; }
command -v node >/dev/null 2>&1 || { echo "SKIPPED: node not found"; exit 77; }

log="$(mktemp)"
# KV for every client at once (CLIENTS x 512 tokens); the waiting queue never fills at this
# load. Each HTTP thread that serves a request keeps the stack pages and allocator caches it
# touched, so the warm-up before the baseline RSS runs as many requests at once as the server
# admits (http threads - 8), and the pool is sized to the clients plus a margin.
http_threads=$((TERN_LOAD_CLIENTS + 32))
export TERN_WARMUP_CONCURRENCY=$((http_threads - 8))
"$tern" serve -m "$model" --host 127.0.0.1 --port 0 --ctx 512 --parallel "$TERN_LOAD_CLIENTS" \
  --threads 1 --http-threads "$http_threads" --shutdown-grace 10 ${TERN_SERVE_ARGS:-} 2>"$log" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; rm -f "$log"' EXIT
url=""
for _ in $(seq 1 300); do
  url="$(grep -o 'listening on http://[0-9.:]*' "$log" | head -1 | sed 's/listening on //')"
  [ -n "$url" ] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
[ -n "$url" ] || { echo "tern serve did not start:"; cat "$log"; exit 1; }
cat "$log"

TERN_BASE_URL="$url" TERN_SERVER_PID="$pid" node "$here/load_test.mjs"
rc=$?

# Graceful stop: SIGTERM must end the idle server promptly and cleanly.
kill -TERM "$pid"
for _ in $(seq 1 150); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$pid" 2>/dev/null; then
  echo "load-test: FAIL tern serve did not stop within 15 s of SIGTERM"
  kill -KILL "$pid"
  rc=1
else
  wait "$pid"
  src=$?
  if [ "$src" -ne 0 ]; then
    echo "load-test: FAIL tern serve exited with $src after SIGTERM"
    rc=1
  fi
fi
tail -2 "$log"
exit "$rc"
