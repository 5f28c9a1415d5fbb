"""Weights interleaved at load time (kernels/matmul.h, the default) give a real model the logits of
its rows as stored (TERN_REPACK=0): bit for bit with the AVX-512 kernels; with the AVX2 ones within
the noise of activation quantization (their interleaved tiles sum in another order than their
stored-row tiles, and a last-bit difference upstream can move one activation across a rounding
boundary of its int8 grid: measured, one such flip at position 8 moved Q8_0's logits by 1.2% of
their largest; a wrong layout moves them by their whole size). stories260K requantized to Q8_0
and Q4_0 by tern (its 64-wide projections and output are interleaved; the 172-wide FFN rows are
not: 172 rows is not a multiple of 16), and to Q4_1 / Q5_0 / Q5_1 / MXFP4 (--pure), whose
interleaved tiles sum in another order on either ISA (within that noise too); and in F16 and F32, whose matrices are
interleaved per group of 16 rows and per element (the 172-row FFN weights too: 10 groups and 12 rows as
stored), bit for bit with either ISA (and with the reference kernels: one FMA chain per output). TERN_REPACK is read once per process, hence one
`tern logits` run per setting.
Exit code 77 = skipped (no ../shared, no tern binary, or no SIMD variant on this CPU)."""
import os
import struct
import subprocess
import sys
import tempfile

SHARED = os.environ.get("TERN_SHARED_DIR", os.path.join(os.path.dirname(__file__), "../../../shared"))
TERN = os.environ.get("TERN_BINARY", "tern")
MODEL = os.path.join(SHARED, "models/stories260K.gguf")
IDS = [1, 403, 407, 261, 378, 432, 10, 300, 77, 5, 511]

if not os.path.exists(MODEL):
    print(f"SKIP: missing {MODEL}")
    sys.exit(77)


def logits(path, isa, repack, out):
    env = dict(os.environ, TERN_FORCE_ISA=isa, TERN_REPACK="1" if repack else "0")
    r = subprocess.run([TERN, "logits", "-m", path, "--ids", " ".join(map(str, IDS)), "-o", out, "-t", "2"],
                       env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        if "cannot run the" in r.stderr:
            return None  # this CPU lacks the variant
        sys.exit(f"FAIL: tern logits ({isa}, repack {repack}): {r.stderr.strip()}")
    with open(out, "rb") as f:
        data = f.read()
    return list(struct.unpack(f"<{len(data) // 4}f", data))


failures = 0
ran = 0
with tempfile.TemporaryDirectory() as d:
    for qtype in ("q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "mxfp4", "f16", "f32"):
        q = os.path.join(d, f"stories260K-{qtype}.gguf")
        # mxfp4 --pure: llama-quantize's MXFP4_MOE rule would leave a dense model all q8_0
        subprocess.run([TERN, "quantize", MODEL, q, "--type", qtype] + (["--pure"] if qtype == "mxfp4" else []),
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for isa in ("avx512", "avx2"):
            stored = logits(q, isa, False, os.path.join(d, "stored.f32"))
            if stored is None:
                print(f"skip {qtype} {isa}: not supported by this CPU")
                continue
            repacked = logits(q, isa, True, os.path.join(d, "repacked.f32"))
            ran += 1
            scale = max(abs(v) for v in stored)
            err = max(abs(a - b) for a, b in zip(stored, repacked))
            same = stored == repacked
            # float weights: the same FMAs in the same order on either layout, any ISA
            # (Q4_1 / Q5_0 / Q5_1 / MXFP4's interleaved tiles sum in another order than their
            # stored-row tiles on either ISA: within the noise of activation quantization, as AVX2's)
            exact = qtype.startswith("f") or (isa == "avx512" and qtype in ("q8_0", "q4_0"))
            ok = same if exact else err <= 0.05 * scale
            print(f"{qtype} {isa}: {len(stored)} logits, bit-identical {same}, max |diff| {err:.3g} "
                  f"(max |logit| {scale:.3g}) -> {'ok' if ok else 'FAIL'}")
            failures += not ok

if ran == 0:
    print("SKIP: no SIMD kernel variant on this CPU")
    sys.exit(77)
sys.exit(1 if failures else 0)
