#!/usr/bin/env bash
# Side-by-side training speed: `tern train` vs PyTorch eager (2 threads, same shapes, batch 8,
# ctx 256, AdamW step included) on the stories260K shape and a ~5M-parameter shape. Prints a
# table (tok/s, ratio, GFLOP/s, % of FMA peak, peak RSS); --json: one JSON object instead.
# The FLOP formula and the method are in bench/train_torch_bench.py's docstring.
# Usage: bench/train_compare.sh [--tern build/release/tern] [--shared ../shared] [--shapes stories260k,5m]
#                               [--rounds 3] [--long] [--json]
# About 3-5 minutes by default on an idle machine (3 alternating rounds; torch is the slow side),
# much longer when the cores are shared; --long: 5 rounds of 3x the steps.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec /usr/bin/python3 "$here/train_torch_bench.py" compare "$@"
