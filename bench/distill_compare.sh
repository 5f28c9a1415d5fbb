#!/usr/bin/env bash
# Does distillation help? One student shape (about 1/4 of stories260K's parameters) trained for
# the same number of tokens four ways, then `tern ppl` on the validation text at ctx 256:
#   ce       hard labels only (tern train)
#   fkl      token-level KD, forward KL from stories260K (tern distill --kd fkl)
#   rkl      token-level KD, reverse KL (--kd rkl)
#   seq      sequence-level KD: hard labels on the data plus teacher-written stories (--kd none --teacher-samples)
# Prints a plain table (variant, parameters, train tok/s, val PPL); --json prints one JSON object.
#
#   bash bench/distill_compare.sh [--tokens N] [--samples N] [--json]     (default 1,000,000 tokens, 2,000 samples)
set -euo pipefail
cd "$(dirname "$0")/.."
tokens=1000000 samples=2000 json=0
while [ $# -gt 0 ]; do
  case "$1" in
    --tokens) tokens=$2; shift 2 ;;
    --samples) samples=$2; shift 2 ;;
    --json) json=1; shift ;;
    *) echo "usage: $0 [--tokens N] [--samples N] [--json]" >&2; exit 2 ;;
  esac
done
shared=${TERN_SHARED_DIR:-../shared}
teacher=$shared/models/stories260K.gguf
train_text=$shared/data/tinystories/tinystories_train_prefix_4M.txt
val_text=$shared/data/tinystories/tinystories_val.txt
tern=${TERN:-build/release/tern}
for f in "$teacher" "$train_text" "$val_text" "$tern"; do
  [ -e "$f" ] || { echo "distill_compare: missing $f" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
student=(--vocab-from "$teacher" --n-embd 32 --n-layer 4 --n-head 4 --n-head-kv 2 --n-ff 112 --tied --ctx 256)
common=(--data "$train_text" --tokens "$tokens" --batch 16 --lr 3e-3 --seed 7 -t "$(nproc)" --json -q)

run() {  # name, command...
  local name=$1; shift
  "$@" "${student[@]}" "${common[@]}" -o "$work/$name.gguf" > "$work/$name.log"
  local ppl
  ppl=$("$tern" ppl -m "$work/$name.gguf" -f "$val_text" --ctx 256 --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["ppl"])')
  python3 - "$name" "$work/$name.log" "$ppl" >> "$work/rows.jsonl" <<'PY'
import json, sys
name, log, ppl = sys.argv[1], sys.argv[2], float(sys.argv[3])
final = [json.loads(l) for l in open(log) if '"final"' in l][-1]
print(json.dumps({"variant": name, "n_params": final["n_params"], "tokens": final["tokens"],
                  "tok_s": final["tok_s"], "seconds": final["seconds"], "val_ppl_ctx256": ppl}))
PY
}
run ce "$tern" train
run fkl "$tern" distill --teacher "$teacher" --kd fkl --temperature 1 --hard-weight 0.1
run rkl "$tern" distill --teacher "$teacher" --kd rkl --temperature 1 --hard-weight 0.1
run seq "$tern" distill --teacher "$teacher" --kd none --teacher-samples "$samples" --sample-len 256
teacher_ppl=$("$tern" ppl -m "$teacher" -f "$val_text" --ctx 256 --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["ppl"])')
python3 - "$work/rows.jsonl" "$teacher_ppl" "$json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
teacher_ppl, as_json = float(sys.argv[2]), sys.argv[3] == "1"
if as_json:
    print(json.dumps({"teacher": "stories260K", "teacher_ppl_ctx256": teacher_ppl, "rows": rows}))
else:
    print(f"{'variant':<8} {'params':>8} {'tokens':>9} {'train tok/s':>11} {'val PPL (ctx 256)':>18}")
    for r in rows:
        print(f"{r['variant']:<8} {r['n_params']:>8} {int(r['tokens']):>9} {r['tok_s']:>11.0f} {r['val_ppl_ctx256']:>18.4f}")
    print(f"teacher stories260K (292,800 parameters): PPL {teacher_ppl:.4f}")
PY
