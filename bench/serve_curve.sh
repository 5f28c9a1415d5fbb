#!/usr/bin/env bash
# Serving throughput curve: `tern bench-serve` at concurrency 1, 2, 4, 8, 16, 32 (closed loop),
# the single-request decode rate from `tern run`, and optionally llama.cpp's own batching on
# the same prompts (bench/llamacpp_serve.mjs, needs ../shared/peer/setup.sh run once).
#
#   bash bench/serve_curve.sh MODEL.gguf [--peer]
#
# Environment (defaults in brackets): TERN [build/release/tern], THREADS [2], CONCURRENCY
# ["1 2 4 8 16 32"], PROMPTS_PER_C [2] (requests = C x this), INPUT_LEN [64] (synthetic
# prompts) or PROMPTS (a ShareGPT JSON file), MAX_TOKENS [64], CTX (tokens of KV per request in
# flight, for both engines [INPUT_LEN + MAX_TOKENS + 16, or 1024 with PROMPTS]), EXTRA (more
# bench-serve flags). Both engines get KV room for CTX x C tokens, both in f16 (bench-serve's
# default --kv-type; llama.cpp's default cache type), so the same bytes.
# Prints a Markdown table (with the 1-minute load average after each run: on a shared machine,
# figures taken under load are not comparable); the JSON of every run is kept in $OUT
# [/tmp/tern_serve_curve].
set -euo pipefail
model=${1:?usage: serve_curve.sh MODEL.gguf [--peer]}
peer=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
TERN=${TERN:-$here/../build/release/tern}
THREADS=${THREADS:-2}
CONCURRENCY=${CONCURRENCY:-"1 2 4 8 16 32"}
PROMPTS_PER_C=${PROMPTS_PER_C:-2}
INPUT_LEN=${INPUT_LEN:-64}
MAX_TOKENS=${MAX_TOKENS:-64}
OUT=${OUT:-/tmp/tern_serve_curve}
EXTRA=${EXTRA:-}
if [ -n "${PROMPTS:-}" ]; then CTX=${CTX:-1024}; else CTX=${CTX:-$((INPUT_LEN + MAX_TOKENS + 16))}; fi
mkdir -p "$OUT"

field() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); v=j.get(sys.argv[2]); print(round(v,2) if isinstance(v,float) else v)" "$1" "$2"; }

# Single-request decode rate (the baseline of the 4x target).
"$TERN" run -m "$model" -t "$THREADS" -c 512 -p "Once upon a time" -n "$MAX_TOKENS" --temp 0 --ignore-eos --json > "$OUT/run.json"
single=$(python3 -c "import json; print(round(json.load(open('$OUT/run.json'))['metrics']['decode_tok_s'],2))")
echo "single-request decode (tern run): $single tok/s"
echo
echo "| concurrency | requests | output tok/s | x single decode | total tok/s | TTFT p50 ms | TBT p50 ms | TBT p99 ms | KV waste % | peak RSS MiB | load avg |${peer:+ llama.cpp output tok/s | tern / llama.cpp |}"
echo "|---|---|---|---|---|---|---|---|---|---|---|${peer:+---|---|}"
for c in $CONCURRENCY; do
  n=$((c * PROMPTS_PER_C))
  src=(--input-len "$INPUT_LEN")
  [ -n "${PROMPTS:-}" ] && src=(--prompts "$PROMPTS")
  # KV arena: room for every request in flight at its full length.
  "$TERN" bench-serve -m "$model" -t "$THREADS" --num-prompts "$n" --concurrency "$c" --max-tokens "$MAX_TOKENS" \
    "${src[@]}" --ctx "$CTX" --parallel "$c" --save-prompts "$OUT/prompts_c$c.json" --json $EXTRA > "$OUT/tern_c$c.json"
  f="$OUT/tern_c$c.json"
  out=$(field "$f" output_tok_s)
  ratio=$(python3 -c "print(round($out / $single, 2) if $single > 0 else 0)")
  rss=$(python3 -c "import json; print(round(json.load(open('$f'))['peak_rss_bytes']/2**20))")
  row="| $c | $n | $out | $ratio | $(field "$f" total_tok_s) | $(field "$f" ttft_ms_p50) | $(field "$f" tbt_ms_p50) | $(field "$f" tbt_ms_p99) | $(field "$f" kv_waste_pct) | $rss | $(cut -d' ' -f1 /proc/loadavg) |"
  if [ -n "$peer" ]; then
    node "$here/llamacpp_serve.mjs" --model "$model" --prompts "$OUT/prompts_c$c.json" --concurrency "$c" \
      --threads "$THREADS" --ctx-per-seq "$CTX" > "$OUT/peer_c$c.json"
    pout=$(field "$OUT/peer_c$c.json" output_tok_s)
    row="$row $pout | $(python3 -c "print(round($out / $pout, 2) if $pout > 0 else 0)") |"
  fi
  echo "$row"
done
