"""numpy float64 oracle for `tern lowrank` (docs/lowrank.md): on stories260K (f32), `--method svd
--rank R --merge` must write, for every linear layer, numpy.linalg.svd's rank-R reconstruction
U_r diag(s_r) V_r^T of the source matrix (to f32 rounding), leave every other tensor as it was,
and a factored run (no --merge) must write lr_a / lr_b pairs whose product is the same matrix.
Also checks Eckart-Young through the tool's JSON: rel_error^2 = discarded s^2 / all s^2.
Exit code 77 = skipped (no numpy, no ../shared or no tern binary)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    print("SKIP: numpy not installed (apt-get install python3-numpy)")
    sys.exit(77)

from gguf_np import read_gguf  # noqa: E402

SHARED = os.environ.get("TERN_SHARED_DIR", os.path.join(os.path.dirname(__file__), "../../../shared"))
TERN = os.environ.get("TERN_BINARY", "tern")
MODEL = os.path.join(SHARED, "models/stories260K.gguf")
RANK = 12
LINEARS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")

if not os.path.exists(MODEL):
    print(f"SKIP: missing {MODEL}")
    sys.exit(77)
if shutil.which(TERN) is None and not os.path.exists(TERN):
    print(f"SKIP: no tern binary ({TERN})")
    sys.exit(77)


def lowrank(out, *args):
    r = subprocess.run([TERN, "lowrank", MODEL, out, "--method", "svd", "--rank", str(RANK), "-t", "2", "--json", *args],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: tern lowrank {' '.join(args)}: {r.stderr.strip()}")
    return json.loads(r.stdout)


def main():
    _, src = read_gguf(MODEL)
    with tempfile.TemporaryDirectory() as tmp:
        merged_path, factored_path = os.path.join(tmp, "merged.gguf"), os.path.join(tmp, "factored.gguf")
        rep = lowrank(merged_path, "--merge")
        lowrank(factored_path)
        _, merged = read_gguf(merged_path)
        _, factored = read_gguf(factored_path)
    errors = {m["name"]: m for m in rep["matrices"]}
    worst, n_checked = 0.0, 0
    for name, w in src.items():
        stem = name[: -len(".weight")]
        if not (name.startswith("blk.") and stem.split(".")[-1] in LINEARS):
            if not np.array_equal(merged[name], w) or not np.array_equal(factored[name], w):
                sys.exit(f"FAIL: {name} changed, but it is not a linear layer")
            continue
        # numpy shape [n_out, n_in] (ggml ne reversed): y = W x.
        u, s, vt = np.linalg.svd(w, full_matrices=False)
        ref = (u[:, :RANK] * s[:RANK]) @ vt[:RANK]
        scale = np.abs(w).max()
        d = np.abs(merged[name] - ref).max() / scale
        a, b = factored[stem + ".lr_a.weight"], factored[stem + ".lr_b.weight"]
        if a.shape != (RANK, w.shape[1]) or b.shape != (w.shape[0], RANK):
            sys.exit(f"FAIL: {stem} factors have shapes {a.shape}, {b.shape}; expected {(RANK, w.shape[1])}, "
                     f"{(w.shape[0], RANK)}")
        df = np.abs(b @ a - ref).max() / scale
        ey = np.sqrt((s[RANK:] ** 2).sum() / (s ** 2).sum())
        de = abs(errors[name]["rel_error"] - ey)
        print(f"{name:28s} {w.shape[0]:4d}x{w.shape[1]:<4d} merged {d:.2e} factored {df:.2e} "
              f"rel_error {errors[name]['rel_error']:.6f} (numpy {ey:.6f})")
        if d > 1e-5 or df > 1e-5 or de > 1e-6:
            sys.exit(f"FAIL: {name}: differs from numpy's rank-{RANK} SVD")
        worst = max(worst, d, df)
        n_checked += 1
    if n_checked != 35:
        sys.exit(f"FAIL: checked {n_checked} linears, expected 35")
    print(f"OK: {n_checked} matrices match numpy's rank-{RANK} SVD (worst {worst:.2e} of max |w|)")


if __name__ == "__main__":
    main()
