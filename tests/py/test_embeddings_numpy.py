"""test_embeddings_numpy.py — `tern embed` and `/v1/embeddings` against an independent numpy
computation of the same hidden states (arch_np.arch_hidden: float64, shares no code with tern).

For each model — stories260K from ../shared when present, and `tern synth` files of the tiny
qwen2 and gemma3 shapes (no ../shared needed; gemma3 runs the pooled forward path, with
post-norms, sliding windows and a final soft-cap that embeddings must not see) — and several
inputs of different lengths:
  1. `tern embed -f inputs --json --pooling P --hidden-states H.npy` for P in mean, last, cls,
     and mean with --no-normalize: every vector equals numpy's pooling (in float64, then
     L2-normalised) of numpy's hidden states within 1e-5 (max abs), and the per-token hidden
     states equal numpy's within 1e-4 x their scale;
  2. `--batch 7` (a chunked prefill of every input) gives the same vectors within 1e-6;
  3. a `tern serve --kv-type f32` started here on a free loopback port: POST /v1/embeddings with
     the same inputs as strings, as token ids, float and base64, equals `tern embed` within 1e-6.
Prints the max abs errors.  Run:  python3 tests/py/test_embeddings_numpy.py  (TERN_BINARY=...)
Exit: 0 passed, 1 a failure, 77 skipped (no numpy, no tern binary).
"""
import base64
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

try:
    import numpy as np
except ImportError:
    print("SKIP: numpy not installed (apt-get install python3-numpy)")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from arch_np import arch_hidden, read_gguf  # noqa: E402
from arch_tiny_models import find_tern  # noqa: E402

TOL_NUMPY = 1e-5    # tern's normalised vectors vs numpy's (max abs)
TOL_SAME = 1e-6     # tern vs tern (chunked prefill, the server)
TIMEOUT = 120       # seconds for any one process or request

INPUTS = [
    "Once upon a time",
    "The little fox ran into the woods and found a big red ball under a tree.",
    "Lily",
    "Tom and his dog liked to play in the park every day. One day they saw a bird that could not fly, "
    "so they took it home and gave it water and seeds.",
]

failures = []


def check(ok, msg):
    print(("ok   " if ok else "FAIL ") + msg)
    if not ok:
        failures.append(msg)


def run(args):
    r = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:3])} ... exited {r.returncode}: {(r.stderr or r.stdout).strip()[-400:]}")
    return r.stdout


def pool_np(h, pooling, normalize=True):
    v = h.mean(0) if pooling == "mean" else h[-1] if pooling == "last" else h[0]
    return v / np.linalg.norm(v) if normalize else v


def tern_embed(tern, model, inputs_file, pooling, extra=()):
    out = run([tern, "embed", "-m", model, "-f", inputs_file, "--json", "--pooling", pooling, "-t", "2", *extra])
    return json.loads(out)


def check_model(tern, path, label, work):
    meta, tensors = read_gguf(path)
    inputs_file = os.path.join(work, "inputs.txt")
    with open(inputs_file, "w") as f:
        f.write("\n".join(INPUTS) + "\n")
    hidden_file = os.path.join(work, f"{label}.hidden.npy")
    results = {}
    np_hidden = None
    for pooling, normalize in (("mean", True), ("last", True), ("cls", True), ("mean", False)):
        extra = [] if normalize else ["--no-normalize"]
        if np_hidden is None:
            extra += ["--hidden-states", hidden_file]
        j = tern_embed(tern, path, inputs_file, pooling, extra)
        check(j["pooling"] == pooling and j["normalized"] == normalize and len(j["data"]) == len(INPUTS),
              f"{label}: tern embed --pooling {pooling} reports its settings and {len(INPUTS)} vectors")
        if np_hidden is None:
            np_hidden = [arch_hidden(meta, tensors, d["tokens"]) for d in j["data"]]
            got_h = np.load(hidden_file).astype(np.float64)
            want_h = np.concatenate(np_hidden)
            if got_h.shape != want_h.shape:
                check(False, f"{label}: --hidden-states has shape {got_h.shape}, numpy {want_h.shape}")
            else:
                err = np.abs(got_h - want_h).max()
                scale = np.abs(want_h).max()
                check(err <= 1e-4 * max(1.0, scale), f"{label}: per-token hidden states ({got_h.shape[0]} tokens x "
                      f"{got_h.shape[1]}) max abs error {err:.3g} (scale {scale:.3g})")
        worst = 0.0
        for d, h in zip(j["data"], np_hidden):
            got = np.array(d["embedding"], dtype=np.float64)
            want = pool_np(h, pooling, normalize)
            worst = max(worst, np.abs(got - want).max())
        tol = TOL_NUMPY if normalize else TOL_NUMPY * max(1.0, max(np.abs(pool_np(h, pooling, False)).max()
                                                                    for h in np_hidden))
        check(worst <= tol, f"{label}: tern embed {pooling}{'' if normalize else ' --no-normalize'} vs numpy: "
              f"max abs error {worst:.3g} (tolerance {tol:.3g})")
        results[(pooling, normalize)] = j
    if np.abs(np.array(results[("mean", True)]["data"][1]["embedding"]) -
              np.array(results[("last", True)]["data"][1]["embedding"])).max() < 1e-3:
        check(False, f"{label}: mean and last pooling gave the same vector")
    # Chunked prefill: steps of 7 tokens.
    j7 = tern_embed(tern, path, inputs_file, "mean", ["--batch", "7"])
    err = max(np.abs(np.array(a["embedding"]) - np.array(b["embedding"])).max()
              for a, b in zip(j7["data"], results[("mean", True)]["data"]))
    check(err <= TOL_SAME, f"{label}: --batch 7 (chunked prefill) vs one step: max abs difference {err:.3g}")
    return results[("mean", True)]


class Server:
    def __init__(self, tern, model, log_path):
        self.log = open(log_path, "w+")
        self.proc = subprocess.Popen([tern, "serve", "-m", model, "--host", "127.0.0.1", "--port", "0", "-t", "2",
                                      "--kv-type", "f32"], stdout=self.log, stderr=subprocess.STDOUT)
        self.url = None
        end = time.time() + TIMEOUT
        while time.time() < end and self.proc.poll() is None:
            with open(log_path) as f:
                m = re.search(r"listening on (http://127\.0\.0\.1:\d+)", f.read())
            if m:
                self.url = m.group(1)
                break
            time.sleep(0.1)
        if not self.url:
            with open(log_path) as f:
                tail = f.read()[-400:]
            self.close()
            raise RuntimeError(f"tern serve did not start: {tail}")

    def post(self, path, body):
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.log.close()


def check_server(tern, path, label, work, embedded):
    srv = Server(tern, path, os.path.join(work, f"{label}.serve.log"))
    try:
        want = [np.array(d["embedding"], dtype=np.float32) for d in embedded["data"]]
        for enc in ("float", "base64"):
            status, r = srv.post("/v1/embeddings", {"input": INPUTS, "model": "x", "encoding_format": enc})
            if status != 200:
                check(False, f"{label}: /v1/embeddings ({enc}) answered {status}: {str(r)[:300]}")
                continue
            vecs = []
            for i, d in enumerate(r["data"]):
                if enc == "float":
                    vecs.append(np.array(d["embedding"], dtype=np.float32))
                else:
                    vecs.append(np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4"))
            err = max(np.abs(a.astype(np.float64) - b).max() for a, b in zip(vecs, want)) if len(vecs) == len(want) \
                else float("inf")
            order = [d["index"] for d in r["data"]] == list(range(len(INPUTS)))
            usage = r["usage"]["prompt_tokens"] == sum(len(d["tokens"]) for d in embedded["data"])
            check(err <= TOL_SAME and order and usage,
                  f"{label}: /v1/embeddings ({enc}) vs tern embed: max abs difference {err:.3g}, "
                  f"indices in order {order}, usage counts the tokens {usage}")
        # The same inputs as token ids.
        status, r = srv.post("/v1/embeddings", {"input": [d["tokens"] for d in embedded["data"]]})
        if status != 200:
            check(False, f"{label}: /v1/embeddings (token ids) answered {status}: {str(r)[:300]}")
        else:
            err = max(np.abs(np.array(d["embedding"]) - w).max() for d, w in zip(r["data"], want))
            check(err <= TOL_SAME, f"{label}: /v1/embeddings of the token ids vs tern embed: max abs difference {err:.3g}")
    finally:
        srv.close()


def main():
    tern = find_tern()
    if not tern:
        print("SKIP: no tern binary (set TERN_BINARY)")
        return 77
    shared = os.environ.get("TERN_SHARED_DIR") or os.path.join(HERE, "../../../shared")
    with tempfile.TemporaryDirectory() as work:
        models = []
        stories = os.path.join(shared, "models/stories260K.gguf")
        if os.path.exists(stories):
            models.append(("stories260K", stories))
        else:
            print("note: ../shared absent: stories260K not checked")
        for shape in ("qwen2-tiny", "gemma3-tiny"):
            p = os.path.join(work, f"{shape}.gguf")
            run([tern, "synth", "--shape", shape, "-o", p, "-t", "2"])
            models.append((shape, p))
        for label, path in models:
            try:
                embedded = check_model(tern, path, label, work)
                check_server(tern, path, label, work, embedded)
            except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError, KeyError) as e:
                check(False, f"{label}: {e}")
    print(f"{'FAILED' if failures else 'passed'}: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
