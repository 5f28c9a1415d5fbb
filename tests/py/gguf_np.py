"""A minimal, independent GGUF reader and Llama forward pass in numpy (float64), used as a
test oracle for tern's C++ implementation. Written from the GGUF spec, shares no code with tern."""
import struct

import numpy as np

_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_gguf(path, skip_unknown=False):
    """(metadata, tensors as float64 arrays); skip_unknown: leave out tensors of types it cannot decode."""
    buf = open(path, "rb").read()
    off = 0

    def take(fmt):
        nonlocal off
        v = struct.unpack_from(fmt, buf, off)
        off += struct.calcsize(fmt)
        return v[0]

    def string():
        nonlocal off
        n = take("<Q")
        s = buf[off:off + n].decode("utf-8", "replace")
        off += n
        return s

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et = take("<I")
            n = take("<Q")
            return [value(et) for _ in range(n)]
        return take(_SCALAR[t])

    assert buf[:4] == b"GGUF"
    off = 4
    take("<I")
    n_tensors = take("<Q")
    n_kv = take("<Q")
    meta = {}
    for _ in range(n_kv):
        k = string()
        meta[k] = value(take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        nd = take("<I")
        ne = [take("<Q") for _ in range(nd)]
        typ = take("<I")
        o = take("<Q")
        infos.append((name, ne, typ, o))
    align = meta.get("general.alignment", 32)
    data_start = (off + align - 1) // align * align
    tensors = {}
    for name, ne, typ, o in infos:
        count = int(np.prod(ne))
        if typ == 0:
            arr = np.frombuffer(buf, dtype="<f4", count=count, offset=data_start + o)
        elif typ == 1:
            arr = np.frombuffer(buf, dtype="<f2", count=count, offset=data_start + o)
        elif typ == 8:   # Q8_0: per 32 values an f16 scale d, then 32 int8 q; x = q * d
            blocks = np.frombuffer(buf, dtype=np.uint8, count=count // 32 * 34, offset=data_start + o).reshape(-1, 34)
            d = blocks[:, :2].copy().view("<f2").astype(np.float32)
            arr = (blocks[:, 2:].view(np.int8).astype(np.float32) * d).reshape(-1)
        elif typ == 2:   # Q4_0: per 32 an f16 d, 16 bytes: value j < 16 low nibble of byte j, j + 16 high
            blocks = np.frombuffer(buf, dtype=np.uint8, count=count // 32 * 18, offset=data_start + o).reshape(-1, 18)
            d = blocks[:, :2].copy().view("<f2").astype(np.float32)
            q = blocks[:, 2:]
            codes = np.concatenate([q & 0x0F, q >> 4], axis=1).astype(np.int8) - 8
            arr = (codes.astype(np.float32) * d).reshape(-1)
        elif typ == 35:  # TQ2_0: per 256 values 64 bytes of 2-bit codes, then an f16 d; x = (code - 1) d
            # element 128 h + 32 l + m is bits 2l..2l+1 of byte 32 h + m
            blocks = np.frombuffer(buf, dtype=np.uint8, count=count // 256 * 66, offset=data_start + o).reshape(-1, 66)
            d = blocks[:, 64:66].copy().view("<f2").astype(np.float32)
            qs = blocks[:, :64].reshape(-1, 2, 1, 32)
            codes = (qs >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 4, 1)) & 3   # [b, h, l, m]
            arr = ((codes.reshape(-1, 256).astype(np.float32) - 1) * d).reshape(-1)
        elif typ == 39:
            arr = mxfp4_values(np.frombuffer(buf, dtype=np.uint8, count=count // 32 * 17, offset=data_start + o))
        elif skip_unknown:
            continue
        else:
            raise ValueError(f"oracle reads only F32/F16/Q8_0/Q4_0/TQ2_0/MXFP4, tensor {name} has type {typ}")
        # ggml ne[0] is the fastest dimension: numpy shape is reversed.
        tensors[name] = arr.astype(np.float64).reshape(list(reversed(ne)))
    return meta, tensors


# OCP MXFP4: per 32 values an E8M0 exponent byte, then 16 bytes of E2M1 codes (value j < 16 in
# the low nibble of byte j, value j + 16 in its high nibble). E2M1: sign bit, 2 exponent bits,
# 1 mantissa bit: magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6; the block's scale is 2^(e - 127).
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)


def mxfp4_values(raw):
    blocks = raw.reshape(-1, 17)
    scale = np.ldexp(1.0, blocks[:, 0].astype(np.int64) - 127)            # [n_blocks]
    q = blocks[:, 1:]
    codes = np.concatenate([q & 0x0F, q >> 4], axis=1)                    # [n_blocks, 32]
    return (E2M1[codes] * scale[:, None]).reshape(-1)


def llama_logits(meta, t, ids, taps=None):
    """Logits [T, n_vocab]. taps: a dict that receives every linear layer's input [T, n_in] under
    its weight's name (the layers reading one input share it)."""
    arch = meta["general.architecture"]
    E = meta[f"{arch}.embedding_length"]
    L = meta[f"{arch}.block_count"]
    H = meta[f"{arch}.attention.head_count"]
    Hkv = meta.get(f"{arch}.attention.head_count_kv", H)
    hd = E // H
    n_rot = meta.get(f"{arch}.rope.dimension_count", hd)
    base = meta.get(f"{arch}.rope.freq_base", 10000.0)
    eps = meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    T = len(ids)

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    def rope(x, nh):  # x: [T, nh, hd]; rotate pairs (2i, 2i+1) for 2i < n_rot
        pos = np.arange(T)[:, None]
        inv = base ** (-np.arange(0, n_rot, 2) / n_rot)
        ang = pos * inv[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        y = x.copy()
        x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        y[..., 0:n_rot:2] = x0 * c - x1 * s
        y[..., 1:n_rot:2] = x0 * s + x1 * c
        return y

    x = t["token_embd.weight"][ids]
    for il in range(L):
        p = f"blk.{il}."
        h = rms(x, t[p + "attn_norm.weight"])
        if taps is not None:
            for n in ("attn_q", "attn_k", "attn_v"):
                taps[p + n + ".weight"] = h
        q = rope((h @ t[p + "attn_q.weight"].T).reshape(T, H, hd), H)
        k = rope((h @ t[p + "attn_k.weight"].T).reshape(T, Hkv, hd), Hkv)
        v = (h @ t[p + "attn_v.weight"].T).reshape(T, Hkv, hd)
        rep = H // Hkv
        k = np.repeat(k, rep, axis=1)
        v = np.repeat(v, rep, axis=1)
        att = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd)
        att = att + np.triu(np.full((T, T), -np.inf), 1)[None]
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", att, v).reshape(T, E)
        if taps is not None:
            taps[p + "attn_output.weight"] = o
        x = x + o @ t[p + "attn_output.weight"].T
        h = rms(x, t[p + "ffn_norm.weight"])
        g = h @ t[p + "ffn_gate.weight"].T
        u = h @ t[p + "ffn_up.weight"].T
        a = g / (1 + np.exp(-g)) * u
        if taps is not None:
            taps[p + "ffn_gate.weight"] = taps[p + "ffn_up.weight"] = h
            taps[p + "ffn_down.weight"] = a
        x = x + a @ t[p + "ffn_down.weight"].T
    x = rms(x, t["output_norm.weight"])
    out = t.get("output.weight", t["token_embd.weight"])
    return x @ out.T


def _metadata_raw(buf):
    """The metadata of a GGUF image as [(key, raw bytes of type + value)] in file order, the
    tensor count and the offset where the tensor infos start."""
    import struct
    off = 8
    n_t, n_kv = struct.unpack_from("<QQ", buf, off)
    off += 16
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip(o, t):
        if t == 8:
            return o + 8 + struct.unpack_from("<Q", buf, o)[0]
        if t == 9:
            et, n = struct.unpack_from("<IQ", buf, o)
            o += 12
            if et in sizes:
                return o + n * sizes[et]
            for _ in range(n):
                o = skip(o, et)
            return o
        return o + sizes[t]

    kvs = []
    for _ in range(n_kv):
        n = struct.unpack_from("<Q", buf, off)[0]
        key = buf[off + 8:off + 8 + n].decode("utf-8", "replace")
        off += 8 + n
        start = off
        off = skip(off + 4, struct.unpack_from("<I", buf, off)[0])
        kvs.append((key, buf[start:off]))
    return kvs, n_t, off


def raw_kvs(path):
    """The metadata of a GGUF file as (key, raw bytes of type + value), in file order: lets a test
    copy the tokenizer into a file it writes without re-encoding each key's type."""
    return _metadata_raw(open(path, "rb").read())[0]


def tensor_types(path):
    """{tensor name: ggml type} from a GGUF header (read_gguf decodes, and so hides, the types)."""
    import struct
    with open(path, "rb") as f:
        buf = f.read(1 << 22)
    _, n_t, off = _metadata_raw(buf)
    types = {}
    for _ in range(n_t):
        n = struct.unpack_from("<Q", buf, off)[0]
        name = buf[off + 8:off + 8 + n].decode("utf-8", "replace")
        off += 8 + n
        nd = struct.unpack_from("<I", buf, off)[0]
        off += 4 + 8 * nd
        types[name] = struct.unpack_from("<I", buf, off)[0]
        off += 12
    return types
