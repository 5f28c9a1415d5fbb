"""tern's logits on real GGUF files equal an independent numpy (float64) Llama implementation.
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

CASES = [
    # (file, token ids, absolute tolerance)
    ("models/llama-2-tiny-random.gguf", [1, 15043, 3186, 29892, 920, 526, 366, 29973, 31999, 2, 0, 13], 1e-4),
    ("models/stories260K.gguf", [1, 403, 407, 261, 378, 432, 10, 300, 77, 5, 511], 1e-4),
]

failures = 0
ran = 0
for rel, ids, tol in CASES:
    path = os.path.join(SHARED, rel)
    if not os.path.exists(path):
        print(f"SKIP {rel}: missing {path}")
        continue
    meta, tensors = read_gguf(path)
    want = llama_logits(meta, tensors, ids)
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "logits.f32")
        cmd = [TERN, "logits", "-m", path, "--ids", " ".join(map(str, ids)), "-o", out, "-t", "2"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        got = np.fromfile(out, dtype="<f4").reshape(len(ids), -1).astype(np.float64)
    err = np.abs(got - want).max()
    scale = np.abs(want).max()
    ran += 1
    ok = err <= tol * max(1.0, scale)
    print(f"{'ok  ' if ok else 'FAIL'} {rel}: {len(ids)} positions x {want.shape[1]} logits, "
          f"max abs error {err:.3g} (logit scale {scale:.3g})")
    failures += not ok

if ran == 0:
    print("SKIP: no shared model files")
    sys.exit(77)
print(f"{ran - failures} passed, {failures} failed")
sys.exit(1 if failures else 0)
