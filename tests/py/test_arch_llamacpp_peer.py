"""test_arch_llamacpp_peer.py — tern against llama.cpp itself (the node-llama-cpp "peer") on tiny
random models of every architecture: qwen2, qwen2moe, qwen3, qwen3moe, llama3 (rope_freqs),
mixtral (llama MoE), phi3, gemma2, gemma3, gpt-oss, mamba, mamba2, deepseek2 (V2 and V3 routing),
granitehybrid (Granite 4.0-H: Mamba-2 and attention layers), rwkv7 (RWKV-7), rwkv6 (RWKV-6), qwen3next
(Qwen3-Next: gated delta-net and gated attention layers).

For each shape NAME:
  * the model is `tern synth --shape NAME` (falls back to the python writer arch_tiny_models.py
    while tern cannot write NAME; the line says which writer made it);
  * llama.cpp (tests/models/peer/peer_logits.mjs, F32 KV cache, no flash attention) greedily
    continues three token-id prompts (BOS + a few ids) by 64 tokens, and reports its
    log-probabilities over the whole vocabulary at every position;
  * tern computes the logits of prompt + llama.cpp's continuation in one `tern logits` call:
    its argmax must be llama.cpp's next id at each of the 64 steps, and its log-softmax must equal
    llama.cpp's within 1e-3 * max(1, |logprob|) (3e-3 for gemma: ggml's CPU GELU is an fp16 table,
    which moves llama.cpp's own log-probs by ~1e-3; see arch_np._gelu_ggml_fp16), over tokens with
    logprob > -30.  An argmax difference is forgiven only at a near-tie (llama.cpp's top-2 gap
    smaller than the tolerance);
  * tern's own greedy decoding (`tern run --temp 0 --json --kv-type f32`, the incremental decode
    path) of a text prompt must give llama.cpp's greedy ids for the same prompt (after checking
    both tokenized the prompt alike), up to a near-tie.

Run:   python3 tests/py/test_arch_llamacpp_peer.py                 (TERN_BINARY=path/to/tern)
       python3 tests/py/test_arch_llamacpp_peer.py --oracle        the numpy oracle (arch_np.py) in
                                                                    tern's place: validates the oracle
       python3 tests/py/test_arch_llamacpp_peer.py --python-writer  the python writer's files, not tern synth
       TERN_ARCH_SHAPES="qwen2-tiny" PEER_DIR=~/.cache/llamacpp-peer python3 ...
Exit:  0 passed, 1 failed, 77 skipped (no numpy, no node, no peer, no tern binary).
Install the peer once with shared/peer/setup.sh.  About 30-60 s on 2 cores.
"""
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from arch_np import arch_logits, log_softmax, read_gguf  # noqa: E402
from gguf_np import tensor_types  # noqa: E402
import arch_tiny_models  # noqa: E402
from arch_tiny_models import find_tern, make_model  # noqa: E402

SHAPES = arch_tiny_models.TEST_SHAPES
PEER_JS = os.path.join(HERE, "../models/peer/peer_logits.mjs")
PEER_DIR = os.environ.get("PEER_DIR", os.path.expanduser("~/.cache/llamacpp-peer"))
N_GEN = 64
TEXT_PROMPT = "Once upon a time there"
LP_FLOOR = -30.0


def tol_for(arch):
    return 3e-3 if arch.startswith("gemma") else 1e-3


def last_line(r):
    return ((r.stderr or r.stdout or "").strip().splitlines() or ["no output"])[-1][:160]


def peer(path, prompts, text=None):
    """llama.cpp runs for the id prompts, then (if text) one for BOS + the tokenized text."""
    cmd = ["node", PEER_JS, "--model", path, "--n", str(N_GEN),
           "--ids-list", ";".join(" ".join(map(str, p)) for p in prompts)]
    if text is not None:
        cmd += ["--prompt", text, "--bos"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        errs = [ln for ln in r.stderr.splitlines() if "error" in ln.lower()] or [last_line(r)]
        raise RuntimeError(f"llama.cpp peer failed ({r.returncode}): {errs[0].strip()[:200]}")
    return json.loads(r.stdout)["runs"]


class Tern:
    name = "tern"

    def __init__(self, exe):
        self.exe = exe

    def logits(self, path, ids, V):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "l.f32")
            r = subprocess.run([self.exe, "logits", "-m", path, "--ids", " ".join(map(str, ids)), "-o", out,
                                "-t", "2", "--kv-type", "f32"], capture_output=True, text=True)
            if r.returncode != 0 or not os.path.exists(out):
                raise RuntimeError(f"tern logits exited {r.returncode}: {last_line(r)}")
            a = np.fromfile(out, dtype="<f4").astype(np.float64)
        if a.size != len(ids) * V:
            raise RuntimeError(f"tern logits wrote {a.size} floats, want {len(ids)} x {V}")
        return a.reshape(len(ids), V)

    def greedy_text(self, path, text):
        r = subprocess.run([self.exe, "run", "-m", path, "-p", text, "-n", str(N_GEN), "--temp", "0", "--top-k", "0",
                            "--top-p", "1", "--min-p", "0", "--repeat-penalty", "1", "--ignore-eos", "--json",
                            "--kv-type", "f32", "-t", "2", "-s", "1"], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"tern run exited {r.returncode}: {last_line(r)}")
        j = json.loads(r.stdout.strip().splitlines()[-1])
        return j["prompt_ids"], j["ids"]


class Oracle:
    """The numpy oracle standing in for tern (validates the oracle against llama.cpp)."""
    name = "oracle"

    def __init__(self):
        self.cache = {}

    def _load(self, path):
        if path not in self.cache:
            self.cache[path] = read_gguf(path)
        return self.cache[path]

    def logits(self, path, ids, V):
        meta, t = self._load(path)
        return arch_logits(meta, t, ids)

    def greedy_text(self, path, text):
        return None  # the oracle has no tokenizer: the text-prompt check is tern's only


def compare_run(eng, path, run, V, tol):
    """Teacher-forced check of one llama.cpp run. Returns (ok, max_rel, n_argmax_bad, n_ties)."""
    P, ids = run["prompt_ids"], run["ids"]
    seq = P + ids[:-1]
    lp_peer = np.array([[(-np.inf if v is None else v) for v in row] for row in run["logprobs"]])
    assert lp_peer.shape == (len(seq), V), lp_peer.shape
    lp = log_softmax(eng.logits(path, seq, V))
    m = np.isfinite(lp_peer) & (lp_peer > LP_FLOOR)
    rel = np.where(m, np.abs(lp - lp_peer) / np.maximum(1.0, np.abs(lp_peer)), 0.0)
    bad = ties = 0
    for j, nxt in enumerate(ids):
        row = lp_peer[len(P) - 1 + j]
        if lp[len(P) - 1 + j].argmax() != nxt:
            top2 = np.sort(row[np.isfinite(row)])[-2:]
            if top2[1] - top2[0] < 2 * tol * max(1.0, abs(top2[1])):
                ties += 1
            else:
                bad += 1
    return rel.max() <= tol and bad == 0, float(rel.max()), bad, ties


def compare_text(eng, path, tol, pj):
    """pj: llama.cpp's run on BOS + TEXT_PROMPT."""
    g = eng.greedy_text(path, TEXT_PROMPT)
    if g is None:
        return None
    t_prompt, t_ids = g
    if list(t_prompt) != list(pj["prompt_ids"]):
        return False, f"prompt tokenized differently: tern {t_prompt} llama.cpp {pj['prompt_ids']}"
    for j, (a, b) in enumerate(zip(t_ids, pj["ids"])):
        if a != b:
            row = np.array([(-np.inf if v is None else v) for v in pj["logprobs"][len(t_prompt) - 1 + j]])
            top2 = np.sort(row[np.isfinite(row)])[-2:]
            tie = top2[1] - top2[0] < 2 * tol * max(1.0, abs(top2[1]))
            return tie, f"greedy text ids differ first at step {j} (tern {a}, llama.cpp {b}{', a near-tie' if tie else ''})"
    if len(t_ids) != len(pj["ids"]):
        return False, f"tern generated {len(t_ids)} ids, llama.cpp {len(pj['ids'])}"
    return True, f"greedy text: {len(t_ids)} ids equal"


def has_mxfp4(path):
    return any(t == 39 for t in tensor_types(path).values())


def write_f32_twin(src, dst):
    """src with every tensor as F32 (MXFP4 decoded by gguf_np's E2M1 table), same metadata."""
    from arch_tiny_models import write_gguf, T_U32, T_I32, T_F32, T_STR, T_ARR
    meta, t = read_gguf(src)
    kvs = []
    for k, v in meta.items():
        if isinstance(v, str):
            kvs.append((k, T_STR, v))
        elif isinstance(v, float):
            kvs.append((k, T_F32, v))
        elif isinstance(v, int):
            kvs.append((k, T_U32, v))
        elif isinstance(v, list) and v:
            et = T_STR if isinstance(v[0], str) else T_F32 if isinstance(v[0], float) else T_I32
            kvs.append((k, T_ARR, (et, v)))
    write_gguf(dst, kvs, list(t.items()))


def compare_quantized(eng, mx_path, exact_path, prompts, V):
    """Matmuls with MXFP4 weights pair them with 8-bit activations in both engines (ggml: q8_0 with
    an f16 scale; tern: the same integers with an f32 scale), and a tiny MoE model turns the
    small differences into different experts now and then: the two cannot agree to 1e-3. What
    must hold: on llama.cpp's continuations of the MXFP4 file, tern's log-probabilities are as
    close to the exact model's (the f32 twin through tern, checked against llama.cpp above) as
    llama.cpp's are: tern's max error <= 1.5 x llama.cpp's + 1e-3."""
    runs = peer(mx_path, prompts)
    err_t = err_p = 0.0
    agree = total = 0
    for run in runs:
        P, ids = run["prompt_ids"], run["ids"]
        seq = P + ids[:-1]
        lp_peer = np.array([[(-np.inf if v is None else v) for v in row] for row in run["logprobs"]])
        lp_t = log_softmax(eng.logits(mx_path, seq, V))
        lp_x = log_softmax(eng.logits(exact_path, seq, V))
        m = np.isfinite(lp_peer) & (lp_x > LP_FLOOR)
        err_t = max(err_t, float(np.where(m, np.abs(lp_t - lp_x), 0).max()))
        err_p = max(err_p, float(np.where(m, np.abs(lp_peer - lp_x), 0).max()))
        for j, nxt in enumerate(ids):
            agree += int(lp_t[len(P) - 1 + j].argmax() == nxt)
            total += 1
    ok = err_t <= 1.5 * err_p + 1e-3
    return ok, (f"max |log-prob - exact|: tern {err_t:.3f}, llama.cpp {err_p:.3f} (tern must be <= 1.5x + 1e-3); "
                f"tern's argmax = llama.cpp's next id at {agree}/{total} steps")


def main():
    use_oracle = "--oracle" in sys.argv[1:]
    if not shutil.which("node"):
        print("SKIP: no node")
        return 77
    if not os.path.isdir(os.path.join(PEER_DIR, "node_modules", "node-llama-cpp")):
        print(f"SKIP: no llama.cpp peer in {PEER_DIR} (bash shared/peer/setup.sh)")
        return 77
    tern = find_tern()
    if use_oracle:
        eng = Oracle()
    elif not tern:
        print("SKIP: no tern binary (set TERN_BINARY; or --oracle to check the numpy oracle)")
        return 77
    else:
        eng = Tern(tern)
    shapes = os.environ.get("TERN_ARCH_SHAPES", "").split() or SHAPES
    failures = 0
    with tempfile.TemporaryDirectory() as d:
        for shape in shapes:
            path = os.path.join(d, shape + ".gguf")
            want_synth = "--python-writer" not in sys.argv[1:]
            how = make_model(tern if want_synth else None, shape, path)
            if want_synth and how != "tern synth":  # tern writes every shape: its failure to is a failure
                print(f"FAIL {shape}: tern synth could not write it")
                failures += 1
            meta = read_gguf(path)[0]
            arch = meta["general.architecture"]
            V = len(meta["tokenizer.ggml.tokens"])
            bos = int(meta.get("tokenizer.ggml.bos_token_id", 1))
            tol = tol_for(arch)
            prompts = [[bos, 5, 70, 100], [bos, 300 % V, 301 % V, 40, 41, 42, 200],
                       [bos] + [int(x) for x in np.random.default_rng(3).integers(3, V, 12)]]
            mx_path = None
            if has_mxfp4(path):
                # MXFP4 experts (gpt-oss): the strict comparison runs on the same model with the
                # experts written as their exact f32 values (decoded by gguf_np, not by tern);
                # the MXFP4 file itself is checked for accuracy below.
                mx_path, path = path, os.path.join(d, shape + "-f32.gguf")
                write_f32_twin(mx_path, path)
                how += ", experts decoded to f32"
            try:
                runs = peer(path, prompts, TEXT_PROMPT)
                text_run, runs = runs[-1], runs[:-1]
                res = [compare_run(eng, path, r, V, tol) for r in runs]
                ok = all(r[0] for r in res)
                msg = (f"log-softmax max rel err {max(r[1] for r in res):.2e} (tol {tol:g}), "
                       f"argmax != llama.cpp at {sum(r[2] for r in res)}/{len(runs) * N_GEN} steps"
                       f" ({sum(r[3] for r in res)} near-ties forgiven)")
                t = compare_text(eng, path, tol, text_run)
                if t is not None:
                    ok = ok and t[0]
                    msg += "; " + t[1]
            except (RuntimeError, OSError, subprocess.TimeoutExpired, ValueError) as e:
                ok, msg = False, str(e)
            print(f"{'ok  ' if ok else 'FAIL'} {shape} ({arch}, {how}, {eng.name} vs llama.cpp): {msg}", flush=True)
            failures += not ok
            if mx_path and isinstance(eng, Tern):
                try:
                    ok, msg = compare_quantized(eng, mx_path, path, prompts, V)
                except (RuntimeError, OSError, subprocess.TimeoutExpired, ValueError) as e:
                    ok, msg = False, str(e)
                print(f"{'ok  ' if ok else 'FAIL'} {shape} (MXFP4 experts, {eng.name} vs llama.cpp): {msg}", flush=True)
                failures += not ok
    print(f"{len(shapes) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
