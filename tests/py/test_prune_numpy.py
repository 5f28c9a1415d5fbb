"""tern prune's Wanda and SparseGPT against a float64 numpy implementation of each paper's
algorithm: the calibration inputs of every linear layer come from an independent numpy forward
pass (gguf_np.py) over the same tokens, the masks and updates from the formulas written here.
Exit code 77 = skipped (no numpy, no ../shared, or no tern binary)."""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    print("SKIP: numpy not installed (apt-get install python3-numpy)")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(__file__))
from gguf_np import llama_logits, read_gguf  # noqa: E402

SHARED = os.environ.get("TERN_SHARED_DIR", os.path.join(os.path.dirname(__file__), "../../../shared"))
TERN = os.environ.get("TERN_BINARY", "tern")
MODEL = os.path.join(SHARED, "models/stories260K.gguf")
TEXT = os.path.join(SHARED, "data/tinystories/tinystories_val.txt")
N_CALIB = 200  # one calibration sequence: BOS + the text's last 200 tokens

if not os.path.exists(MODEL) or not os.path.exists(TEXT):
    print("SKIP: ../shared not present")
    sys.exit(77)

meta, t = read_gguf(MODEL)
LINEARS = [n for n in t if n.startswith("blk.") and t[n].ndim == 2]

# The calibration tokens exactly as tern takes them (compress/calibrate.h).
ids = subprocess.run([TERN, "tokenize", "-m", MODEL, "-f", TEXT, "--no-bos", "--json"], check=True,
                     capture_output=True, text=True).stdout
import json  # noqa: E402

ids = json.loads(ids)
calib_ids = [1] + ids[-N_CALIB:]
taps = {}
llama_logits(meta, t, calib_ids, taps)


def wanda(w, x, frac):
    norm = np.sqrt((x * x).sum(0))
    score = np.abs(w) * norm[None, :]
    k = int(np.floor(w.shape[1] * frac))
    out = w.copy()
    order = np.argsort(score, axis=1, kind="stable")[:, :k]
    np.put_along_axis(out, order, 0.0, axis=1)
    return out


def sparsegpt(w, x, frac, damp=0.01):
    n_out, n_in = w.shape
    block = min(128, max(8, (n_in + 3) // 4))  # tern's choice for short rows (docs/prune.md)
    h = x.T @ x
    dead = np.diag(h) == 0
    h[dead, dead] = 1.0
    w = w.copy()
    w[:, dead] = 0.0
    h += damp * np.mean(np.diag(h)) * np.eye(n_in)
    u = np.linalg.cholesky(np.linalg.inv(h)).T  # upper, U^T U = H^-1
    mask = np.zeros_like(w, dtype=bool)
    for b0 in range(0, n_in, block):
        b1 = min(n_in, b0 + block)
        s = w[:, b0:b1] ** 2 / np.diag(u)[None, b0:b1] ** 2
        k = int(np.floor(s.size * frac))
        flat = np.argsort(s.ravel(), kind="stable")[:k]
        m = np.zeros(s.size, dtype=bool)
        m[flat] = True
        mask[:, b0:b1] = m.reshape(s.shape)
        for j in range(b0, b1):
            e = np.where(mask[:, j], w[:, j] / u[j, j], 0.0)
            w[:, j:] -= e[:, None] * u[j, j:][None, :]
            w[mask[:, j], j] = 0.0
    w[mask] = 0.0
    return w


failures = 0
with tempfile.TemporaryDirectory() as d:
    for method, ref in (("wanda", wanda), ("sparsegpt", sparsegpt)):
        out = os.path.join(d, method + ".gguf")
        subprocess.run([TERN, "prune", MODEL, out, "--method", method, "--sparsity", "0.5", "--one-shot", "--calib", TEXT,
                        "--calib-tokens", str(N_CALIB), "-t", "2", "--json"], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        _, got = read_gguf(out)
        worst_mask, worst_w = 0.0, 0.0
        for name in LINEARS:
            want = ref(t[name], taps[name], 0.5)
            g = got[name]
            mask_diff = np.mean((g == 0) != (want == 0))
            rows_same = np.all((g == 0) == (want == 0), axis=1)
            # Where a row's mask agrees, its kept weights must agree too (SparseGPT's updates).
            wd = np.abs(g[rows_same] - want[rows_same]).max() / max(1e-30, np.abs(want).max()) if rows_same.any() else 0.0
            worst_mask = max(worst_mask, mask_diff)
            worst_w = max(worst_w, wd)
            # tern's activations are f32 sums in another order: near-ties may flip a few entries.
            if mask_diff > 0.002 or wd > 1e-3:
                print(f"FAIL {method} {name}: mask differs at {mask_diff:.4%}, kept weights by {wd:.2e} (relative)")
                failures += 1
        print(f"{method}: {len(LINEARS)} matrices; worst mask difference {worst_mask:.4%}, "
              f"worst kept-weight difference {worst_w:.2e} of the largest weight")

if failures:
    sys.exit(1)
print("OK")
