#!/usr/bin/env bash
# Goodput against request rate (open loop, Poisson arrivals, as vLLM's benchmark_serving): for
# each rate, `tern bench-serve` with its TBT target (auto unless TERN_TARGET says otherwise) and
# with the fixed --batch-tokens budget alone (off), and optionally llama.cpp's batching replaying
# the same prompts at the same arrival times (bench/llamacpp_serve.mjs --open-loop, needs
# ../shared/peer/setup.sh run once). Every engine is judged at the same objectives.
#
#   bash bench/goodput_curve.sh MODEL.gguf [--peer]
#
# Environment (defaults in brackets): TERN [build/release/tern], THREADS [2], RATES
# ["0.5 1 1.5 2 3"] (requests/s), NUM_PROMPTS [48], INPUT_LEN [64], MAX_TOKENS [64], SLOTS [16]
# (sequences each engine runs at once; tern's --parallel and llama.cpp's sequences),
# TTFT_MS [2500] and GAP_MS [250] (the objectives: time to first token, and no gap between two
# tokens of a request longer than GAP_MS: a stream that never freezes), TERN_TARGET [auto], OUT
# [/tmp/tern_goodput_curve]. Prints a Markdown table; writes goodput.svg (the curves) in OUT.
set -euo pipefail
model=${1:?usage: goodput_curve.sh MODEL.gguf [--peer]}
peer=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
TERN=${TERN:-$here/../build/release/tern}
THREADS=${THREADS:-2}
RATES=${RATES:-"0.5 1 1.5 2 3"}
NUM_PROMPTS=${NUM_PROMPTS:-48}
INPUT_LEN=${INPUT_LEN:-64}
MAX_TOKENS=${MAX_TOKENS:-64}
SLOTS=${SLOTS:-16}
TTFT_MS=${TTFT_MS:-2500}
GAP_MS=${GAP_MS:-250}
TERN_TARGET=${TERN_TARGET:-auto}
OUT=${OUT:-/tmp/tern_goodput_curve}
CTX=$((INPUT_LEN + MAX_TOKENS + 16))
mkdir -p "$OUT"

field() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); v=j.get(sys.argv[2]); print(round(v,2) if isinstance(v,float) else v)" "$1" "$2"; }

echo "objectives: TTFT <= $TTFT_MS ms, every gap between tokens <= $GAP_MS ms; $NUM_PROMPTS requests of $INPUT_LEN in / $MAX_TOKENS out, $SLOTS sequences at once"
echo
echo "| rate req/s | tern ($TERN_TARGET) goodput req/s | attained % | TBT p99 ms | TTFT p99 ms | tern (budget alone) goodput req/s | attained % | TBT p99 ms |${peer:+ llama.cpp goodput req/s | attained % | TBT p99 ms |} load avg |"
echo "|---|---|---|---|---|---|---|---|${peer:+---|---|---|}---|"
for r in $RATES; do
  common=(-m "$model" -t "$THREADS" --num-prompts "$NUM_PROMPTS" --input-len "$INPUT_LEN" --max-tokens "$MAX_TOKENS"
          --request-rate "$r" --ctx "$CTX" --parallel "$SLOTS" --max-running "$SLOTS"
          --goodput "ttft:$TTFT_MS" "tbt:$GAP_MS" --json)
  "$TERN" bench-serve "${common[@]}" --tbt-target-ms "$TERN_TARGET" --save-prompts "$OUT/prompts_r$r.json" > "$OUT/tern_r$r.json"
  "$TERN" bench-serve "${common[@]}" --tbt-target-ms off > "$OUT/fixed_r$r.json"
  t="$OUT/tern_r$r.json"
  f="$OUT/fixed_r$r.json"
  row="| $r | $(field "$t" goodput_req_s) | $(field "$t" slo_attainment_pct) | $(field "$t" tbt_ms_p99) | $(field "$t" ttft_ms_p99) | $(field "$f" goodput_req_s) | $(field "$f" slo_attainment_pct) | $(field "$f" tbt_ms_p99) |"
  if [ -n "$peer" ]; then
    node "$here/llamacpp_serve.mjs" --model "$model" --prompts "$OUT/prompts_r$r.json" --concurrency "$SLOTS" \
      --threads "$THREADS" --ctx-per-seq "$CTX" --open-loop --goodput "ttft:$TTFT_MS,tbt:$GAP_MS" > "$OUT/peer_r$r.json"
    p="$OUT/peer_r$r.json"
    row="$row $(field "$p" goodput_req_s) | $(field "$p" slo_attainment_pct) | $(field "$p" tbt_ms_p99) |"
  fi
  echo "$row $(cut -d' ' -f1 /proc/loadavg) |"
done
python3 "$here/goodput_chart.py" "$OUT" "$RATES" "$OUT/goodput.svg" "TTFT <= $TTFT_MS ms, every gap <= $GAP_MS ms"
echo
echo "chart: $OUT/goodput.svg"
