#!/usr/bin/env bash
# ARM64 on an x86 host: cross-builds tern with Debian's g++-aarch64-linux-gnu (cmake --preset
# aarch64) and runs its tests under qemu-aarch64, whose default CPU ("max") has NEON, dotprod and
# i8mm, so the kernel tests check every ARM variant (neon, dotprod, i8mm) against the reference.
#   bash scripts/test-aarch64.sh           # everything: the test binaries of every layer that
#                                          # does not start other programs (the CLI, server and
#                                          # script-driven suites need a host that can exec the
#                                          # target's binaries), then `tern run` on stories260K
#                                          # against the llama2.c reference with each variant
#   bash scripts/test-aarch64.sh --quick   # what scripts/test.sh (CI) runs: the kernel and op
#                                          # tests alone, on a subset of the kernel shapes
# Both also run the dispatch tests on a CPU without dotprod (qemu's cortex-a53): the variant
# chosen there is neon, and forcing dotprod is refused. Tests that need ../shared skip without it.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
quick=0
case "${1:-}" in
  "") ;;
  --quick) quick=1 ;;
  *) echo "usage: bash scripts/test-aarch64.sh [--quick]" >&2; exit 2 ;;
esac
[ "${TERN_SKIP_DEPS:-0}" = 1 ] || bash scripts/install-deps.sh --aarch64

cmake --preset aarch64
if [ "$quick" = 1 ]; then
  cmake --build --preset aarch64 -j "$jobs" --target test_kernels test_ops
  # qemu-user emulates a test's thread on one host core: the two binaries' tests run as $jobs
  # gtest shards side by side (CI's 2 cores: about 100 s instead of 180), each shard's log
  # printed when it ends.
  pids=()
  for ((shard = 0; shard < jobs; ++shard)); do
    (
      export GTEST_TOTAL_SHARDS=$jobs GTEST_SHARD_INDEX=$shard
      TERN_KERNEL_TESTS=quick qemu-aarch64 build/aarch64/tests/test_kernels --gtest_brief=1 --gtest_filter=-*DeathTest*
      qemu-aarch64 build/aarch64/tests/test_ops --gtest_brief=1
    ) > "build/aarch64/quick-shard-$shard.log" 2>&1 &
    pids+=($!)
  done
  failed=0
  for shard in "${!pids[@]}"; do
    wait "${pids[$shard]}" || failed=1
    echo "test-aarch64: shard $shard of $jobs:"
    cat "build/aarch64/quick-shard-$shard.log"
  done
  if [ "$failed" = 1 ]; then
    echo "test-aarch64: a shard of the ARM64 kernel/op tests failed (its log is above)"
    exit 1
  fi
else
  cmake --build --preset aarch64 -j "$jobs"
  labels="^(core|gguf|quant|kv|tokenizer|kernels|ops|sampling|models|sched|grammar|runtime|compress|engine|train|jinja)$"
  # gtest's death tests (a forked child that must exit with a given code) abort inside the child
  # under qemu-user, whatever the test: they are left to native runs.
  ctest --preset aarch64 -j "$jobs" -L "$labels" -E "DeathTest"
fi

# A CPU with NEON only: the dispatch picks neon; TERN_FORCE_ISA=dotprod is a clear error.
QEMU_CPU=cortex-a53 qemu-aarch64 build/aarch64/tests/test_kernels --gtest_brief=1 \
  --gtest_filter='KernelsDispatch.SelectedIsaIsSupported:KernelsDispatch.ArmFloatInterleavedRowRanges'
if err=$(QEMU_CPU=cortex-a53 TERN_FORCE_ISA=dotprod qemu-aarch64 build/aarch64/tests/test_kernels \
           --gtest_filter=KernelsDispatch.SelectedIsaIsSupported 2>&1); then
  echo "test-aarch64: TERN_FORCE_ISA=dotprod on a CPU without dotprod was not refused"
  exit 1
fi
case "$err" in
  *"TERN_FORCE_ISA=dotprod: this CPU cannot run the dotprod kernels"*) ;;
  *) echo "test-aarch64: forcing dotprod on a cortex-a53 failed without tern's error:"; echo "$err"; exit 1 ;;
esac
echo "test-aarch64: on a CPU without dotprod the neon variant is chosen and forcing dotprod is refused"
[ "$quick" = 1 ] && exit 0

# The reference tokens of llama2.c's run.c through the cross-built `tern run`, per variant.
shared=$(cd .. && pwd)/shared
ref="$shared/reference/stories260K/greedy_prompt_once_upon_a_time_n64.tokens"
if [ -f "$ref" ] && [ -f "$shared/models/stories260K.gguf" ]; then
  # .tokens lines are "pos input next": the 64 inputs are BOS, the prompt and 59 generated tokens.
  want=$(awk '{ printf "%s%s", (NR > 1 ? " " : ""), $2 } END { print "" }' "$ref")
  for isa in ref neon dotprod i8mm; do
    out=$(TERN_FORCE_ISA=$isa qemu-aarch64 build/aarch64/tern run -m "$shared/models/stories260K.gguf" \
          -p "Once upon a time" -n 59 --temp 0 --ignore-eos -t 2 --json)
    got=$(printf '%s' "$out" | /usr/bin/python3 -c 'import json,sys; j=json.load(sys.stdin); print(" ".join(map(str, j["prompt_ids"] + j["ids"])))')
    if [ "$got" != "$want" ]; then
      echo "test-aarch64: tern run (TERN_FORCE_ISA=$isa) under qemu-aarch64 differs from the reference"
      echo "  got:  $got"
      echo "  want: $want"
      exit 1
    fi
    echo "test-aarch64: tern run (TERN_FORCE_ISA=$isa) under qemu-aarch64 gives the reference's 64 tokens"
  done
else
  echo "test-aarch64: ../shared has no stories260K reference: the tern run check is skipped"
fi
