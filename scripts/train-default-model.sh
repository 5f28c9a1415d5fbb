#!/usr/bin/env bash
# Makes tern's default model, models/tern-stories.gguf: a small TinyStories model trained and
# distilled by tern itself (teacher: stories260K.gguf, the same 512-token vocabulary), then
# stored as Q8_0. Needs ../shared (the teacher and the data); about 40 minutes on 2 cores.
#
#   bash scripts/train-default-model.sh            # the committed model's recipe
#   TOKENS=2000000 bash scripts/train-default-model.sh   # a shorter run (a few minutes)
#
# Steps: (1) the teacher writes SAMPLES stories (sequence-level KD: cased, in-distribution text
# beside the lowercased train prefix); (2) `tern distill` trains the student on the train prefix
# plus those stories with the teacher's forward KL at every position (token-level KD) and a
# small hard-label term; (3) `tern quantize` stores it as Q8_0; (4) `tern ppl` measures it and
# the teacher on the validation text at ctx 256. models/tern-stories.md is the model card.
set -euo pipefail
cd "$(dirname "$0")/.."
shared=${TERN_SHARED_DIR:-../shared}
teacher=$shared/models/stories260K.gguf
train_text=$shared/data/tinystories/tinystories_train_prefix_4M.txt
val_text=$shared/data/tinystories/tinystories_val.txt
for f in "$teacher" "$train_text" "$val_text"; do
  [ -f "$f" ] || { echo "train-default-model: missing $f (../shared)" >&2; exit 1; }
done
TOKENS=${TOKENS:-12000000}
SAMPLES=${SAMPLES:-8000}
THREADS=${THREADS:-$(nproc)}
SEED=${SEED:-20261202}
out=${OUT:-models/tern-stories.gguf}
work=build/default-model
mkdir -p "$work"

cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target tern
tern=build/release/tern

# The student: 6 layers of width 128 (8 heads, 4 KV heads), SwiGLU 352, tied output, ctx 256:
# 1.17 M parameters, 1.25 MB as Q8_0.
"$tern" distill --teacher "$teacher" --vocab-from "$teacher" \
  --n-embd 128 --n-layer 6 --n-head 8 --n-head-kv 4 --n-ff 352 --tied --ctx 256 \
  --data "$train_text" --teacher-samples "$SAMPLES" --sample-len 256 --save-samples "$work/teacher-samples.txt" \
  --kd fkl --temperature 1 --hard-weight 0.1 \
  --val "$val_text" --val-windows 32 --tokens "$TOKENS" --batch 16 --lr 2e-3 --min-lr 1e-4 --weight-decay 0.1 \
  --checkpoint-every 200 --seed "$SEED" -t "$THREADS" --json -o "$work/student-f32.gguf" | tee "$work/train-log.jsonl"

"$tern" quantize "$work/student-f32.gguf" "$out" --type q8_0
echo "train-default-model: $out, $(stat -c %s "$out") bytes"
echo "perplexity at ctx 256 on $(basename "$val_text"):"
"$tern" ppl -m "$out" -f "$val_text" --ctx 256 -t "$THREADS" 2>&1 | tail -1
"$tern" ppl -m "$teacher" -f "$val_text" --ctx 256 -t "$THREADS" 2>&1 | tail -1
