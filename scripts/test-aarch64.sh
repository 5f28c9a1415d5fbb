#!/usr/bin/env bash
# ARM64 on an x86 host: cross-builds tern with Debian's g++-aarch64-linux-gnu (cmake --preset
# aarch64) and runs, under qemu-aarch64, the test binaries of every layer that does not start
# other programs (the CLI, server and script-driven suites need a host that can exec the
# target's binaries), then `tern run` on stories260K against the llama2.c reference tokens.
# Tests that need ../shared skip without it.
#   bash scripts/test-aarch64.sh            # as CI runs it
#   TERN_FORCE_ISA=ref bash scripts/...     # pin a kernel variant (ARM64 has only ref so far)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
[ "${TERN_SKIP_DEPS:-0}" = 1 ] || bash scripts/install-deps.sh --aarch64

cmake --preset aarch64
cmake --build --preset aarch64 -j "$jobs"
labels="^(core|gguf|quant|kv|tokenizer|kernels|ops|sampling|models|sched|grammar|runtime|compress|engine|train|jinja)$"
# gtest's death tests (a forked child that must exit with a given code) abort inside the child
# under qemu-user, whatever the test: they are left to native runs.
ctest --preset aarch64 -j "$jobs" -L "$labels" -E "DeathTest"

# The reference tokens of llama2.c's run.c through the cross-built `tern run`.
shared=$(cd .. && pwd)/shared
ref="$shared/reference/stories260K/greedy_prompt_once_upon_a_time_n64.tokens"
if [ -f "$ref" ] && [ -f "$shared/models/stories260K.gguf" ]; then
  out=$(qemu-aarch64 build/aarch64/tern run -m "$shared/models/stories260K.gguf" \
        -p "Once upon a time" -n 59 --temp 0 --ignore-eos -t 2 --json)
  got=$(printf '%s' "$out" | /usr/bin/python3 -c 'import json,sys; j=json.load(sys.stdin); print(" ".join(map(str, j["prompt_ids"] + j["ids"])))')
  # .tokens lines are "pos input next": the 64 inputs are BOS, the prompt and 59 generated tokens.
  want=$(awk '{ printf "%s%s", (NR > 1 ? " " : ""), $2 } END { print "" }' "$ref")
  if [ "$got" != "$want" ]; then
    echo "test-aarch64: tern run under qemu-aarch64 differs from the reference"
    echo "  got:  $got"
    echo "  want: $want"
    exit 1
  fi
  echo "test-aarch64: tern run under qemu-aarch64 gives the reference's 64 tokens"
else
  echo "test-aarch64: ../shared has no stories260K reference: the tern run check is skipped"
fi
