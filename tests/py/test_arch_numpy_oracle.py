"""test_arch_numpy_oracle.py — tern's logits equal the float64 numpy oracle (arch_np.py) on tiny
random models of every architecture: qwen2, qwen2moe, qwen3, qwen3moe, llama3 (rope_freqs),
mixtral (llama MoE), phi3, gemma2, gemma3, gpt-oss, mamba (Mamba-1), mamba2 (Mamba-2), deepseek2
(DeepSeek-V2 multi-head latent attention; V3's sigmoid / grouped routing: deepseek3-tiny),
granitehybrid (Granite 4.0-H: Mamba-2 and attention layers, Granite's multipliers), rwkv7 (RWKV-7), rwkv6 (RWKV-6),
qwen3next (Qwen3-Next: gated delta-net and gated attention layers).

For each shape NAME it checks two files:
  1. `tern synth --shape NAME -o F.gguf` (tern's own writer); if tern cannot write NAME, the
     independent python writer (arch_tiny_models.py) writes F instead, and the line says so;
  2. the python writer's file (an independent writer: a second check of tern's loader).
On each, `tern logits -m F --ids "..." -o out.f32 -t 2` must match the oracle for every position
and vocabulary entry: max abs error <= 1e-4 * max(1, max |logit|).  The id sequence (48 tokens)
is longer than the sliding windows of the tiny gemma and gpt-oss models, so SWA layers are
exercised.

MXFP4 tensors (tern synth writes gpt-oss experts as MXFP4, as released): the oracle decodes them
exactly (gguf_np), but tern, like ggml, multiplies them with the activations rounded to Q8_0
(int8 per 32-block, f32 scale), which moves a tiny model's logits by ~0.1-0.4 and can change its
expert choice.  For those matmuls the oracle rounds its activations the same way
(arch_np.q8_0_round), and the same tolerance holds; the line says "Q8_0 activations emulated".
The python writer's file is all F32: the exact check of the same graph.

Run:   python3 tests/py/test_arch_numpy_oracle.py            (TERN_BINARY=path/to/tern to pick one)
       TERN_ARCH_SHAPES="qwen2-tiny gemma3-tiny" python3 ...   (a subset)
Exit:  0 all passed, 1 a failure (tern wrong, or tern cannot load the file), 77 skipped
       (no numpy, no tern binary).
"""
import os
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
from arch_np import arch_logits, read_gguf  # noqa: E402
from gguf_np import tensor_types  # noqa: E402
import arch_tiny_models  # noqa: E402
from arch_tiny_models import find_tern, make_model  # noqa: E402

SHAPES = arch_tiny_models.TEST_SHAPES + arch_tiny_models.ORACLE_ONLY_SHAPES
TOL = 1e-4


def ids_for(meta, n=48):
    V = len(meta["tokenizer.ggml.tokens"]) if "tokenizer.ggml.tokens" in meta else 256
    bos = meta.get("tokenizer.ggml.bos_token_id", 1)
    rng = np.random.default_rng(7)
    return [int(bos)] + [int(x) for x in rng.integers(3, V, n - 1)]


def check(tern, path, label):
    meta, tensors = read_gguf(path)
    ids = ids_for(meta)
    mxfp4 = {n for n, ty in tensor_types(path).items() if ty == 39}
    want = arch_logits(meta, tensors, ids, act_q8=mxfp4)
    if mxfp4:
        label = label[:-1] + f"; {len(mxfp4)} MXFP4 tensors, Q8_0 activations emulated]"
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "logits.f32")
        try:
            r = subprocess.run([tern, "logits", "-m", path, "--ids", " ".join(map(str, ids)), "-o", out, "-t", "2"],
                               capture_output=True, text=True)
        except OSError as e:
            print(f"FAIL {label}: cannot run tern: {e}")
            return False
        if r.returncode != 0 or not os.path.exists(out):
            msg = ((r.stderr or r.stdout).strip().splitlines() or ["no output"])[-1]
            print(f"FAIL {label}: tern logits exited {r.returncode}: {msg[:160]}")
            return False
        got = np.fromfile(out, dtype="<f4").astype(np.float64)
    if got.size != want.size:
        print(f"FAIL {label}: tern wrote {got.size} floats, want {want.shape[0]} x {want.shape[1]}")
        return False
    got = got.reshape(want.shape)
    err = np.abs(got - want)
    scale = np.abs(want).max()
    ok = err.max() <= TOL * max(1.0, scale)
    worst = np.unravel_index(err.argmax(), err.shape)
    am = (got.argmax(-1) == want.argmax(-1)).mean()
    print(f"{'ok  ' if ok else 'FAIL'} {label}: {want.shape[0]} positions x {want.shape[1]} logits, max abs error "
          f"{err.max():.3g} (pos {worst[0]}, token {worst[1]}; logit scale {scale:.3g}); argmax agrees at {am:.0%}")
    return ok


def main():
    tern = find_tern()
    if not tern:
        print("SKIP: no tern binary (set TERN_BINARY)")
        return 77
    shapes = os.environ.get("TERN_ARCH_SHAPES", "").split() or SHAPES
    failures = ran = 0
    with tempfile.TemporaryDirectory() as d:
        for shape in shapes:
            f_tern = os.path.join(d, shape + ".synth.gguf")
            how = make_model(tern, shape, f_tern)
            print(f"# {shape}: file 1 written by {how}")
            if how != "tern synth":  # tern writes every shape: its failure to is a failure
                print(f"FAIL {shape}: {how}")
                failures += 1
            ran += 1
            failures += not check(tern, f_tern, f"{shape} [{how.split(' (')[0]}]")
            if how == "tern synth":
                f_py = os.path.join(d, shape + ".py.gguf")
                arch_tiny_models.write_shape(shape, f_py)
                ran += 1
                failures += not check(tern, f_py, f"{shape} [python writer]")
    print(f"{ran - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
