"""tern's quant codecs against llama.cpp's own functions, called through ctypes in the peer's
libggml-base.so (installed by ../shared/peer/setup.sh):
- quantizing the same f32 rows (`tern quantize --pure`) gives llama.cpp's blocks byte for byte
  (quantize_row_<type>_ref: what llama-quantize runs without an importance matrix), for Q4_1, Q5_0,
  Q5_1, Q2_K, Q3_K, Q5_K, TQ1_0, TQ2_0 and MXFP4 (Q8_0 / Q4_0 / Q4_K / Q6_K have llama-quantize's own
  files in ../shared/quant-interop);
- dequantizing the same blocks gives llama.cpp's f32 values bit for bit (dequantize_row_<type>),
  on tern's blocks and on random ones (every bit pattern of the quants and packed scales; finite
  f16 scales; every E8M0 exponent; TQ1_0's bytes that its packing never writes and TQ2_0's code 3,
  which no trit is), for all thirteen types.
The rows are awkward on purpose: outliers, constant and all-zero rows, tiny values, one sign only;
for MXFP4 also blocks at every power of two of the f32 range (denormals to the largest f32); for
TQ1_0 / TQ2_0 also rows whose elements sit exactly on and around the rounding boundary +-amax / 2.
Exit code 77 = skipped (no peer library, no tern binary)."""
import ctypes
import glob
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

TERN = os.environ.get("TERN_BINARY", "tern")
PEER = os.environ.get("PEER_DIR", os.path.expanduser("~/.cache/llamacpp-peer"))
libs = glob.glob(os.path.join(PEER, "node_modules/@node-llama-cpp/linux-x64/bins/linux-x64/libggml-base.so"))
if not libs:
    print(f"SKIP: no llama.cpp library under {PEER} (bash ../shared/peer/setup.sh)")
    sys.exit(77)
ggml = ctypes.CDLL(libs[0])

# type id: (name, block elements, block bytes, byte offsets of the f16 fields, ggml suffix)
TYPES = {
    2: ("q4_0", 32, 18, [0], "q4_0"),
    3: ("q4_1", 32, 20, [0, 2], "q4_1"),
    6: ("q5_0", 32, 22, [0], "q5_0"),
    7: ("q5_1", 32, 24, [0, 2], "q5_1"),
    8: ("q8_0", 32, 34, [0], "q8_0"),
    10: ("q2_k", 256, 84, [80, 82], "q2_K"),
    11: ("q3_k", 256, 110, [108], "q3_K"),
    12: ("q4_k", 256, 144, [0, 2], "q4_K"),
    13: ("q5_k", 256, 176, [0, 2], "q5_K"),
    14: ("q6_k", 256, 210, [208], "q6_K"),
    34: ("tq1_0", 256, 54, [52], "tq1_0"),
    35: ("tq2_0", 256, 66, [64], "tq2_0"),
    39: ("mxfp4", 32, 17, [], "mxfp4"),
}
QUANTIZED_HERE = [3, 6, 7, 10, 11, 13, 34, 35, 39]  # byte-exact quantization checked here


def ggml_quantize(tid, x):
    _, blk, nbytes, _, sfx = TYPES[tid]
    out = ctypes.create_string_buffer(x.size // blk * nbytes)
    f = getattr(ggml, f"quantize_row_{sfx}_ref")
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    xc = np.ascontiguousarray(x, dtype=np.float32)
    f(xc.ctypes.data, out, x.size)
    return out.raw


def ggml_dequantize(tid, data, n):
    y = np.zeros(n, dtype=np.float32)
    f = getattr(ggml, f"dequantize_row_{TYPES[tid][4]}")
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    buf = ctypes.create_string_buffer(data, len(data))
    f(buf, y.ctypes.data, n)
    return y


def gguf_string(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def write_gguf(path, tensors):
    """tensors: [(name, ne, type id, bytes)]; a llama-flavoured header, 32-byte alignment."""
    kv = [("general.architecture", "llama")]
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)))
    for k, v in kv:
        out += gguf_string(k) + struct.pack("<I", 8) + gguf_string(v)
    off = 0
    offsets = []
    for name, ne, tid, data in tensors:
        out += gguf_string(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        out += struct.pack("<IQ", tid, off)
        offsets.append(off)
        off = (off + len(data) + 31) // 32 * 32
    out += b"\0" * ((32 - len(out) % 32) % 32)
    base = len(out)
    for (_, _, _, data), o in zip(tensors, offsets):
        out += b"\0" * (base + o - len(out)) + data
    with open(path, "wb") as f:
        f.write(out)


def read_gguf_raw(path):
    """{name: (ne, type id, bytes)} for every tensor (sizes from this test's table and f32/f16)."""
    buf = open(path, "rb").read()
    off = 4

    def take(fmt):
        nonlocal off
        v = struct.unpack_from(fmt, buf, off)[0]
        off += struct.calcsize(fmt)
        return v

    def string():
        nonlocal off
        n = take("<Q")
        s = buf[off:off + n].decode()
        off += n
        return s

    def skip_value(t):
        if t == 8:
            string()
        elif t == 9:
            et, n = take("<I"), take("<Q")
            for _ in range(n):
                skip_value(et)
        else:
            take({0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
                  12: "<d"}[t])

    take("<I")
    n_tensors, n_kv = take("<Q"), take("<Q")
    align = 32
    for _ in range(n_kv):
        k = string()
        t = take("<I")
        if k == "general.alignment":
            align = take("<I")
        else:
            skip_value(t)
    infos = []
    for _ in range(n_tensors):
        name = string()
        ne = [take("<Q") for _ in range(take("<I"))]
        tid = take("<I")
        infos.append((name, ne, tid, take("<Q")))
    start = (off + align - 1) // align * align
    out = {}
    for name, ne, tid, o in infos:
        n = int(np.prod(ne))
        size = n * 4 if tid == 0 else n * 2 if tid == 1 else n // TYPES[tid][1] * TYPES[tid][2]
        out[name] = (ne, tid, buf[start + o:start + o + size])
    return out


def tern(*args):
    r = subprocess.run([TERN, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: tern {' '.join(args)}: {r.stderr.strip()}")


def source_rows(rng):
    """[name, rows x 512 f32] with the awkward cases."""
    n = 512
    normal = rng.standard_normal((6, n)).astype(np.float32) * 0.02
    outliers = normal.copy()
    outliers[:, ::37] *= 40.0
    special = np.zeros((6, n), dtype=np.float32)
    special[1] = 0.5                                               # constant
    special[2] = np.abs(rng.standard_normal(n)) * 1e-3             # one sign only
    special[3] = -np.abs(rng.standard_normal(n))                   # negative only
    special[4] = rng.standard_normal(n) * 1e-6                     # tiny
    special[5, :128] = rng.uniform(-1, 1, 128)                     # half zero
    return [("blk.0.normal.weight", normal), ("blk.0.outliers.weight", outliers), ("blk.0.special.weight", special)]


def mxfp4_range_rows(rng):
    """[name, rows x 512 f32] for MXFP4's exponent rule over the whole f32 range: blocks of 32 whose
    largest magnitude is m 2^k for every k from -149 (the smallest denormal) to 127, m random in [1, 2)
    and, per block kind, exactly 1 (a power of two), just below 2 (log2f rounding up to the next
    integer) or the largest f32; blocks of one sign, a lone non-zero element, -0.0, values exactly
    halfway between two of the grid's values (the first index wins), denormals; then Gaussian blocks
    spread over 2^-140 .. 2^120."""
    n = 512
    blocks = []
    for k in range(-149, 128):
        for kind in range(4):
            b = rng.standard_normal(32)
            b = b / np.abs(b).max()                         # amax 1
            if kind == 0:
                b *= rng.uniform(1, 2)
            elif kind == 1:
                b[rng.integers(32)] = 1.0 if rng.integers(2) else -1.0
            elif kind == 2:
                b = np.abs(b) * np.nextafter(np.float32(2), np.float32(0))
            else:
                b[:] = 0.0
                b[rng.integers(32)] = -1.5
            b = (b.astype(np.float64) * 2.0 ** k)
            blocks.append(np.clip(b, -3.4028234e38, 3.4028234e38).astype(np.float32))
    blocks.append(np.full(32, np.finfo(np.float32).max, dtype=np.float32))
    blocks.append(np.full(32, -0.0, dtype=np.float32))
    tie = np.zeros(32, dtype=np.float32)
    # amax 1.5: e = 125, d = 2^-3, the grid 0, 0.125, ..., 1.5; the points halfway between neighbours
    tie[0] = 1.5
    grid = np.array([0, 1, 2, 3, 4, 6, 8, 12], dtype=np.float32) * 0.125
    mids = (grid[:-1] + grid[1:]) / 2
    tie[1:1 + len(mids)] = mids
    tie[8:8 + len(mids)] = -mids
    blocks.append(tie)
    blocks.append(np.array([1e-45 * (i + 1) for i in range(32)], dtype=np.float32))  # denormals
    while len(blocks) % (n // 32):
        blocks.append((rng.standard_normal(32) * 2.0 ** rng.integers(-140, 120)).astype(np.float32))
    for _ in range(64 * n // 32):
        blocks.append((rng.standard_normal(32) * 2.0 ** rng.integers(-140, 120)).astype(np.float32))
    a = np.concatenate(blocks).reshape(-1, n)
    assert np.all(np.isfinite(a))
    return [("blk.0.range.weight", a)]


def ternary_rows(rng):
    """[name, rows x 512 f32] for the ternary types' rule lroundf(x / amax): elements at exactly
    +-amax / 2 (ties away from zero), one ulp either side of it, +-amax, -0.0, and amax that are
    powers of two and not (so that 1 / amax and x * (1 / amax) round)."""
    n = 512
    rows = []
    for amax in (1.0, 0.75, 3.0e-5, 1234.5678, 2.0 ** -20):
        a = np.float32(amax)
        half = np.float32(a / np.float32(2))
        vals = [a, -a, half, -half, np.nextafter(half, np.float32(0)), np.nextafter(half, a),
                -np.nextafter(half, np.float32(0)), -np.nextafter(half, a), np.float32(-0.0), np.float32(0)]
        r = rng.choice(np.array(vals, dtype=np.float32), n)
        r[::256] = a  # amax in every block
        rows.append(r)
    rows.append((rng.standard_normal(n) * 0.02).astype(np.float32))
    return [("blk.0.ternary.weight", np.stack(rows).astype(np.float32))]


def main():
    rng = np.random.default_rng(7)
    fails = 0
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "src.gguf")
        rows = source_rows(rng)
        write_gguf(src, [(name, [a.shape[1], a.shape[0]], 0, a.tobytes()) for name, a in rows])
        src_range = os.path.join(tmp, "src-range.gguf")
        range_rows = mxfp4_range_rows(rng)
        tern_rows = ternary_rows(rng)
        src_tern = os.path.join(tmp, "src-ternary.gguf")
        write_gguf(src_tern, [(name, [a.shape[1], a.shape[0]], 0, a.tobytes()) for name, a in tern_rows])
        write_gguf(src_range, [(name, [a.shape[1], a.shape[0]], 0, a.tobytes()) for name, a in range_rows])
        for tid in QUANTIZED_HERE:
            name = TYPES[tid][0]
            q = os.path.join(tmp, f"q-{name}.gguf")
            tern("quantize", src, q, "--type", name, "--pure", "--json")
            got = read_gguf_raw(q)
            cases = list(rows)
            if tid == 39:  # MXFP4's exponent over the whole f32 range (ggml's f16-scaled types overflow there)
                q_range = os.path.join(tmp, f"q-{name}-range.gguf")
                tern("quantize", src_range, q_range, "--type", name, "--pure", "--json")
                got.update(read_gguf_raw(q_range))
                cases += range_rows
            if tid in (34, 35):  # the ternary rule's rounding boundary
                q_tern = os.path.join(tmp, f"q-{name}-ternary.gguf")
                tern("quantize", src_tern, q_tern, "--type", name, "--pure", "--json")
                got.update(read_gguf_raw(q_tern))
                cases += tern_rows
            for tname, a in cases:
                ne, t, data = got[tname]
                want = ggml_quantize(tid, a.reshape(-1))
                if t != tid or data != want:
                    nb = TYPES[tid][2]
                    bad = next((i for i in range(len(want) // nb) if data[i * nb:(i + 1) * nb] != want[i * nb:(i + 1) * nb]),
                               None)
                    print(f"FAIL quantize {name} {tname}: type {t}, first differing block {bad}")
                    fails += 1
                else:
                    print(f"ok   quantize {name} {tname}: {len(data)} bytes equal llama.cpp's")

        # Dequantization: random blocks of every type in one file, read back as f32 by tern.
        tensors = []
        for tid, (name, blk, nbytes, f16_offsets, _) in TYPES.items():
            n_rows = 32 if tid in (34, 35, 39) else 4  # (the ternary types: every byte value in many places)
            n_blocks = n_rows * 512 // blk
            raw = np.frombuffer(rng.bytes(n_blocks * nbytes), dtype=np.uint8).reshape(n_blocks, nbytes).copy()
            for o in f16_offsets:  # finite scales of both signs and many magnitudes
                scales = (rng.standard_normal(n_blocks) * np.exp2(rng.integers(-14, 4, n_blocks))).astype(np.float16)
                raw[:, o:o + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
            if tid == 39:  # every E8M0 exponent twice, denormal scales (0, 1) and overflow to inf (255) included
                raw[:, 0] = np.arange(n_blocks) % 256
            tensors.append((f"blk.0.rand_{name}.weight", [512, n_rows], tid, raw.tobytes()))
        rnd = os.path.join(tmp, "random.gguf")
        write_gguf(rnd, tensors)
        back = os.path.join(tmp, "random-f32.gguf")
        tern("quantize", rnd, back, "--type", "f32", "--pure", "--json")
        got = read_gguf_raw(back)
        for tname, ne, tid, data in tensors:
            ours = np.frombuffer(got[tname][2], dtype=np.uint32)
            want = ggml_dequantize(tid, data, ne[0] * ne[1]).view(np.uint32)
            diff = np.flatnonzero(ours != want)
            if diff.size:
                i = diff[0]
                print(f"FAIL dequantize {TYPES[tid][0]}: {diff.size} values differ, first at {i}: "
                      f"{ours[i:i + 1].view(np.float32)[0]} vs {want[i:i + 1].view(np.float32)[0]}")
                fails += 1
            else:
                print(f"ok   dequantize {TYPES[tid][0]}: {want.size} random-block values bit-identical")
    if fails:
        sys.exit(f"FAIL: {fails} mismatches")
    print("PASS")


main()
