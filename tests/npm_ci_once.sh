# Sourced by the JS-driven tests' run.sh (tests/server/js, tests/tokenizer/js, tests/jinja/js):
#   npm_ci_once DIR   runs `npm ci` in DIR once per checkout (again when its package-lock.json
#                     changes); returns non-zero when it fails (no registry). Tests that may
#                     start together under ctest -j share the lock, kept outside the tree
#                     because npm ci empties node_modules, so the second one waits.
npm_ci_once() {
  local dir="$1"
  (
    flock 9
    local stamp="$dir/node_modules/.tern-installed"
    if [ ! -f "$stamp" ] || [ "$dir/package-lock.json" -nt "$stamp" ]; then
      echo "npm ci in $dir"
      (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error) || exit 1
      touch "$stamp"
    fi
  ) 9>"${TMPDIR:-/tmp}/tern-npm-$(printf '%s' "$dir" | cksum | cut -d' ' -f1).lock"
}
