#!/usr/bin/env bash
# Side-by-side throughput of tern and llama.cpp (../shared/peer, node-llama-cpp) on the same
# GGUF files, the same thread count, alternating engines round by round so that machine noise
# hits both alike. Prints a Markdown table with medians and the tern/llama.cpp ratio.
#
#   bench/peer_compare.sh [--threads 2] [--pp 128] [--tg 32] [--reps 3] [--rounds 3] [--isa avx2]
#                         [MODEL.gguf ...]
#
# Without models it synthesizes the tinyllama-1.1b shape in q4_0, q8_0 and f16 (tern synth)
# into build/bench-models/, and adds ../shared/models/stories260K.gguf when present.
# --isa avx2 compares the engines as a CPU without AVX-512 runs them: tern with
# TERN_FORCE_ISA=avx2, llama.cpp with its AVX2 build (the package's "haswell" CPU library, in a
# copy of the peer that holds no other: ggml loads the best library it finds).
set -euo pipefail
cd "$(dirname "$0")/.."
threads=2 pp=128 tg=32 reps=3 rounds=3 isa=
models=()
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) threads=$2; shift 2 ;;
    --pp) pp=$2; shift 2 ;;
    --tg) tg=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --isa) isa=$2; shift 2 ;;
    -h|--help) sed -n 2,13p "$0"; exit 0 ;;
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
case "$isa" in
  "") ;;
  avx2)
    export TERN_FORCE_ISA=avx2
    haswell_dir=${PEER_HASWELL_DIR:-$HOME/.cache/llamacpp-peer-haswell}
    bins=node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
    if [ ! -f "$haswell_dir/$bins/libggml-cpu-haswell.so" ]; then
      [ -f "$peer_dir/$bins/libggml-cpu-haswell.so" ] || { echo "peer_compare: no AVX2 (haswell) llama.cpp library in $peer_dir" >&2; exit 1; }
      rm -rf "$haswell_dir" && mkdir -p "$haswell_dir/node_modules/@node-llama-cpp"
      cp "$peer_dir"/*.mjs "$peer_dir"/package*.json "$haswell_dir/"
      for d in "$peer_dir"/node_modules/*; do
        [ "$(basename "$d")" = @node-llama-cpp ] || cp -r "$d" "$haswell_dir/node_modules/"
      done
      cp -r "$peer_dir/node_modules/@node-llama-cpp/linux-x64" "$haswell_dir/node_modules/@node-llama-cpp/"
      find "$haswell_dir/$bins" -name 'libggml-cpu-*.so' ! -name libggml-cpu-haswell.so -delete
    fi
    peer_dir=$haswell_dir ;;
  *) echo "peer_compare: --isa $isa: only avx2 is supported (the default compares the best variants)" >&2; exit 2 ;;
esac
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
    # tern's roofline share: each tg run against the bandwidth measured beside it (tern bench)
    "$tern" bench -m "$m" -t "$threads" -p "$pp" -n "$tg" -r "$reps" --json 2>/dev/null \
      | python3 -c "import json,sys; j=json.load(sys.stdin); print(json.dumps({'engine':'tern','model':sys.argv[1],'pp':j['pp_tok_s'],'tg':j['tg_tok_s'],'bpt':j['bytes_per_token'],'bw':j['bandwidth_gb_s'],'pct':j['tg_roofline_pct']}))" "$m" >> "$results"
    node "$peer_dir/llamacpp_bench.mjs" --model "$m" --threads "$threads" --pp "$pp" --tg "$tg" --reps "$reps" 2>/dev/null \
      | python3 -c "import json,sys; j=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(json.dumps({'engine':'llama.cpp','model':sys.argv[1],'pp':j['pp_tok_s'],'tg':j['tg_tok_s']}))" "$m" >> "$results" \
      || echo "{\"engine\":\"llama.cpp\",\"model\":\"$m\",\"pp\":null,\"tg\":null}" >> "$results"
  done
done
python3 - "$results" "$threads" "$pp" "$tg" "$rounds" "${isa:-best}" <<'PY'
import json, statistics, sys, os
path, threads, pp, tg, rounds, isa = sys.argv[1:]
rows = [json.loads(l) for l in open(path)]
bws = [r["bw"] for r in rows if r.get("bw") and r.get("bpt", 0) >= 64 << 20]  # from DRAM only
bw = f"{min(bws):.1f}-{max(bws):.1f} (median {statistics.median(bws):.1f})" if bws else "n/a"
def med(model, engine, key):
    xs = [r[key] for r in rows if r["model"] == model and r["engine"] == engine and r[key] is not None]
    return statistics.median(xs) if xs else None
kernels = "the best each engine has for this CPU" if isa == "best" else f"{isa} in both engines"
print(f"threads {threads}, pp{pp}, tg{tg}, medians of {rounds} alternating rounds; kernels: {kernels}; memory read bandwidth {bw} GB/s (measured beside tern's tg runs)\n")
print(f"| model | tern pp{pp} | llama.cpp pp{pp} | ratio | tern tg{tg} | llama.cpp tg{tg} | ratio | tern tg % of roofline |")
print("|---|---|---|---|---|---|---|---|")
for model in dict.fromkeys(r["model"] for r in rows):
    tp, lp, tt, lt = med(model, "tern", "pp"), med(model, "llama.cpp", "pp"), med(model, "tern", "tg"), med(model, "llama.cpp", "tg")
    f = lambda x: "n/a" if x is None else f"{x:.1f}"
    ratio = lambda a, b: "n/a" if not a or not b else f"{a / b:.2f}"
    # Decode roofline: bandwidth / bytes a token reads (weights, tern's own count); the median
    # of tern's runs, each against the bandwidth of its own minute.
    bpt = next((r["bpt"] for r in rows if r["model"] == model and r["engine"] == "tern"), None)
    tp_pct = med(model, "tern", "pct")
    pct = "n/a" if not tp_pct else f"{tp_pct:.0f}%"
    if bpt and bpt < 64 << 20:  # the weights stay in the caches: no DRAM roofline applies
        pct = "(fits in cache)"
    print(f"| {os.path.basename(model)} | {f(tp)} | {f(lp)} | {ratio(tp, lp)} | {f(tt)} | {f(lt)} | {ratio(tt, lt)} | {pct} |")
PY
rm -f "$results"
