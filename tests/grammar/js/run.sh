#!/usr/bin/env bash
# Samples `tern run --grammar-file / --json-schema` outputs and checks every one with validators
# that share no code with tern (docs/grammar.md, "Validation"):
#   run.sh TERN_BINARY SHARED_DIR [SAMPLES]
# llama.cpp's example grammars (json, arithmetic, list, c) come from the npm package
# node-llama-cpp; outputs are checked by an Earley recognizer over the .gbnf files (gbnf.mjs),
# JSON.parse, and ajv for the JSON-schema case. Exit 77 (CTest's SKIP_RETURN_CODE) when
# something it needs is missing: the shared model, node/npm, or the npm registry for `npm ci`.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
tern="$1"
shared="$2"
samples="${3:-1000}"
model="$shared/models/llama-2-tiny-random.gguf"

skip() {
  echo "SKIPPED: $*"
  exit 77
}

[ -f "$model" ] || skip "missing $model (../shared absent)"
command -v node >/dev/null 2>&1 || skip "node not found (scripts/install-deps.sh installs it)"
command -v npm >/dev/null 2>&1 || skip "npm not found (scripts/install-deps.sh installs it)"

# npm ci once per checkout (tests/npm_ci_once.sh).
source "$here/../../npm_ci_once.sh"
npm_ci_once "$here" || skip "npm ci failed (is the npm registry reachable?)"
[ -d "$here/node_modules/node-llama-cpp/llama/grammars" ] || skip "node-llama-cpp has no llama/grammars folder"

exec node "$here/validate.mjs" "$tern" "$model" "$here/node_modules/node-llama-cpp/llama/grammars" "$samples"
