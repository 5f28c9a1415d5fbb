"""tern's quant codecs against llama.cpp's own functions, called through ctypes in the peer's
libggml-base.so (installed by ../shared/peer/setup.sh):
- quantizing the same f32 rows (`tern quantize --pure`) gives llama.cpp's blocks byte for byte
  (quantize_row_<type>_ref: what llama-quantize runs without an importance matrix), for Q4_1, Q5_0,
  Q5_1, Q2_K, Q3_K and Q5_K (Q8_0 / Q4_0 / Q4_K / Q6_K have llama-quantize's own files in
  ../shared/quant-interop);
- dequantizing the same blocks gives llama.cpp's f32 values bit for bit (dequantize_row_<type>),
  on tern's blocks and on random ones (every bit pattern of the quants and packed scales; finite
  f16 scales), for all ten types.
The rows are awkward on purpose: outliers, constant and all-zero rows, tiny values, one sign only.
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
}
QUANTIZED_HERE = [3, 6, 7, 10, 11, 13]  # byte-exact quantization checked here


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


def main():
    rng = np.random.default_rng(7)
    fails = 0
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "src.gguf")
        rows = source_rows(rng)
        write_gguf(src, [(name, [a.shape[1], a.shape[0]], 0, a.tobytes()) for name, a in rows])
        for tid in QUANTIZED_HERE:
            name = TYPES[tid][0]
            q = os.path.join(tmp, f"q-{name}.gguf")
            tern("quantize", src, q, "--type", name, "--pure", "--json")
            got = read_gguf_raw(q)
            for tname, a in rows:
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
            n_blocks = 4 * 512 // blk
            raw = np.frombuffer(rng.bytes(n_blocks * nbytes), dtype=np.uint8).reshape(n_blocks, nbytes).copy()
            for o in f16_offsets:  # finite scales of both signs and many magnitudes
                scales = (rng.standard_normal(n_blocks) * np.exp2(rng.integers(-14, 4, n_blocks))).astype(np.float16)
                raw[:, o:o + 2] = scales.view(np.uint8).reshape(n_blocks, 2)
            tensors.append((f"blk.0.rand_{name}.weight", [512, 4], tid, raw.tobytes()))
        rnd = os.path.join(tmp, "random.gguf")
        write_gguf(rnd, tensors)
        back = os.path.join(tmp, "random-f32.gguf")
        tern("quantize", rnd, back, "--type", "f32", "--pure", "--json")
        got = read_gguf_raw(back)
        for tname, ne, tid, data in tensors:
            ours = np.frombuffer(got[tname][2], dtype=np.uint32)
            want = ggml_dequantize(tid, data, 4 * 512).view(np.uint32)
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
