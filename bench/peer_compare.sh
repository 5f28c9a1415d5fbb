#!/usr/bin/env bash
# Side-by-side throughput of tern and llama.cpp (../shared/peer, node-llama-cpp) on the same
# GGUF files, the same thread count, alternating engines round by round so that machine noise
# hits both alike. Prints a Markdown table with medians and the tern/llama.cpp ratio.
#
#   bench/peer_compare.sh [--threads 2] [--pp 128] [--tg 32] [--reps 3] [--rounds 3] [MODEL.gguf ...]
#
# Without models it synthesizes the tinyllama-1.1b shape in q4_0, q8_0 and f16 (tern synth)
# into build/bench-models/, and adds ../shared/models/stories260K.gguf when present.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=2 pp=128 tg=32 reps=3 rounds=3
models=()
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads=$2; shift 2 ;;
    --pp) pp=$2; shift 2 ;;
    --tg) tg=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -h|--help) sed -n 2,9p "$0"; exit 0 ;;
    *) models+=("$1"); shift ;;
  esac
done
tern=build/release/tern
[ -x "$tern" ] || { cmake --preset release >/dev/null && cmake --build --preset release --target tern; }
peer_dir=${PEER_DIR:-$HOME/.cache/llamacpp-peer}
if [ ! -f "$peer_dir/llamacpp_bench.mjs" ]; then
  [ -f ../shared/peer/setup.sh ] || { echo "peer_compare: ../shared/peer is absent" >&2; exit 1; }
  bash ../shared/peer/setup.sh >&2
fi
if [ ${#models[@]} -eq 0 ]; then
  mkdir -p build/bench-models
  for t in q4_0 q8_0 f16; do
    m=build/bench-models/tinyllama-1.1b-$t.gguf
    [ -f "$m" ] || "$tern" synth --shape tinyllama-1.1b --type $t -o "$m" >&2
    models+=("$m")
  done
  [ -f ../shared/models/stories260K.gguf ] && models+=(../shared/models/stories260K.gguf)
fi
results=$(mktemp)
for round in $(seq 1 "$rounds"); do
  for m in "${models[@]}"; do
    echo "round $round/$rounds: $m" >&2
    "$tern" bench -m "$m" -t "$threads" -p "$pp" -n "$tg" -r "$reps" --no-bandwidth --json 2>/dev/null \
      | python3 -c "import json,sys; j=json.load(sys.stdin); print(json.dumps({'engine':'tern','model':sys.argv[1],'pp':j['pp_tok_s'],'tg':j['tg_tok_s'],'bpt':j['bytes_per_token']}))" "$m" >> "$results"
    node "$peer_dir/llamacpp_bench.mjs" --model "$m" --threads "$threads" --pp "$pp" --tg "$tg" --reps "$reps" 2>/dev/null \
      | python3 -c "import json,sys; j=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(json.dumps({'engine':'llama.cpp','model':sys.argv[1],'pp':j['pp_tok_s'],'tg':j['tg_tok_s']}))" "$m" >> "$results" \
      || echo "{\"engine\":\"llama.cpp\",\"model\":\"$m\",\"pp\":null,\"tg\":null}" >> "$results"
  done
done
bw=$("$tern" bench -m "${models[0]}" -t "$threads" -p 0 -n 1 -r 1 --json 2>/dev/null | python3 -c "import json,sys; print(round(json.load(sys.stdin)['bandwidth_gb_s'],1))")
python3 - "$results" "$threads" "$pp" "$tg" "$rounds" "$bw" <<'PY'
import json, statistics, sys, os
path, threads, pp, tg, rounds, bw = sys.argv[1:]
rows = [json.loads(l) for l in open(path)]
def med(model, engine, key):
    xs = [r[key] for r in rows if r["model"] == model and r["engine"] == engine and r[key] is not None]
    return statistics.median(xs) if xs else None
print(f"threads {threads}, pp{pp}, tg{tg}, medians of {rounds} alternating rounds; memory read bandwidth {bw} GB/s\n")
print(f"| model | tern pp{pp} | llama.cpp pp{pp} | ratio | tern tg{tg} | llama.cpp tg{tg} | ratio | tern tg % of roofline |")
print("|---|---|---|---|---|---|---|---|")
for model in dict.fromkeys(r["model"] for r in rows):
    tp, lp, tt, lt = med(model, "tern", "pp"), med(model, "llama.cpp", "pp"), med(model, "tern", "tg"), med(model, "llama.cpp", "tg")
    f = lambda x: "n/a" if x is None else f"{x:.1f}"
    ratio = lambda a, b: "n/a" if not a or not b else f"{a / b:.2f}"
    # Decode roofline: bandwidth / bytes a token reads (weights, tern's own count).
    bpt = next((r["bpt"] for r in rows if r["model"] == model and r["engine"] == "tern"), None)
    roof = float(bw) * 1e9 / bpt if bpt and float(bw) > 0 else None
    pct = "n/a" if not roof or tt is None else f"{100 * tt / roof:.0f}%"
    if bpt and bpt < 64 << 20:  # the weights stay in the caches: no DRAM roofline applies
        pct = "(fits in cache)"
    print(f"| {os.path.basename(model)} | {f(tp)} | {f(lp)} | {ratio(tp, lp)} | {f(tt)} | {f(lt)} | {ratio(tt, lt)} | {pct} |")
PY
rm -f "$results"
