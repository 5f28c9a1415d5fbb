#!/usr/bin/env bash
# Builds tern and runs its main job on the model tern trained itself: models/tern-stories.gguf
# (a 1.2 M-parameter TinyStories model, trained and distilled by `tern distill`, stored as
# Q8_0; models/tern-stories.md is its card, scripts/train-default-model.sh made it), prompted,
# streamed, with the metrics report. Pass another model as the first argument to run that
# instead, e.g. ../shared/models/stories260K.gguf.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${TERN_SKIP_DEPS:-0}" = 1 ] || bash scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target tern
tern=build/release/tern
model=${1:-models/tern-stories.gguf}
"$tern" run -m "$model" -p "Once upon a time" -n 200 --temp 0.7 --seed 42
