#!/usr/bin/env bash
# Builds tern and runs the whole test suite: the release build under CTest, the ARM64 kernel and
# op tests under qemu-aarch64, then the malformed-input, tokenizer, sampling, KV, model and training
# tests and the server's adversarial suite again under AddressSanitizer + UndefinedBehaviorSanitizer.
# Tests that need ../shared skip with a message when it is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
# Each stage's end, in seconds since the start: where CI's time goes (keep the whole under 30 min).
started=$SECONDS
stage_done() { echo "test.sh: $1 done after $((SECONDS - started)) s"; }
[ "${TERN_SKIP_DEPS:-0}" = 1 ] || bash scripts/install-deps.sh

# The libraries as unity sources (TERN_UNITY: about 500 CPU-s instead of 1100 on a clean build;
# the debug stage below builds the same way). TERN_UNITY=OFF keeps one object per file.
cmake --preset release -DTERN_UNITY="${TERN_UNITY:-ON}"
cmake --build --preset release -j "$jobs"
stage_done "release build"
ctest --preset release -j "$jobs"
stage_done "release tests"

# ARM64: the kernel and op tests cross-built and run under qemu-aarch64, every ARM variant
# against the reference (scripts/test-aarch64.sh --quick; without --quick it runs everything).
# Skipped with a message where the cross toolchain cannot be installed.
if [ "${TERN_SKIP_ARM64:-0}" != 1 ]; then
  if [ "${TERN_SKIP_DEPS:-0}" = 1 ] || bash scripts/install-deps.sh --aarch64; then
    TERN_SKIP_DEPS=1 bash scripts/test-aarch64.sh --quick
    stage_done "ARM64 (qemu) tests"
  else
    echo "test.sh: the ARM64 cross toolchain could not be installed: the ARM64 stage is skipped"
  fi
fi

if [ "${TERN_SKIP_SANITIZERS:-0}" != 1 ]; then
  cmake --preset debug
  asan_targets=(test_gguf test_tokenizer test_sampling test_kv test_sched test_spec test_models test_train test_server_adversarial)
  cmake --build --preset debug -j "$jobs" --target tern "${asan_targets[@]}"
  stage_done "sanitizer build"
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  # Only the binaries built above: select their tests by label (one label per layer).
  # server_adversarial: the ASan/UBSan `tern serve` under the adversarial suite.
  # Less the statistical and perplexity tests: 4-10x slower under the sanitizers (about a minute
  # of CI between them), and the code they run is what the other tests of their binaries run.
  ctest --test-dir build/debug -j "$jobs" --output-on-failure -L "^(gguf|tokenizer|sampling|kv|sched|spec|models|train|server_adversarial)$" \
    -E "^(SamplerDistribution\.|DefaultModel\.PerplexityIsWithinTenPercentOfItsTeacher$)"
  stage_done "sanitizer tests"
fi
