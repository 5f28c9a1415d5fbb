#!/usr/bin/env bash
# Builds tern and runs its main job on a default it generates itself: a random-weight model
# with the stories260K architecture (tern synth), prompted, streamed, with the metrics report.
# Random weights produce gibberish text; the point is the pipeline and the figures. Pass a
# real model as the first argument to run that instead, e.g. ../shared/models/stories260K.gguf.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${TERN_SKIP_DEPS:-0}" = 1 ] || bash scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target tern
tern=build/release/tern
model=${1:-}
if [ -z "$model" ]; then
  model=build/demo-stories260k-q8_0.gguf
  [ -f "$model" ] || "$tern" synth --shape stories260k --type q8_0 -o "$model"
fi
"$tern" run -m "$model" -p "Once upon a time" -n 64 --seed 42
