"""train_torch_ref.py: an independent PyTorch implementation of tern's Llama-family training model
(forward, loss, autograd gradients) and of `tern train`'s AdamW loop, its data packing and its
learning-rate schedule. It is the oracle for tests/py/test_train_torch_oracle.py and the
PyTorch side of bench/train_torch_bench.py. Written from tern's training spec (docs / the
brief in the test); shares no code with tern's C++.

Model (weights as numpy/torch [n_out, n_in], i.e. ggml ne reversed):
  x = token_embd[ids]
  per layer: h = rms(x) * attn_norm; q,k,v = h W^T; RoPE on adjacent pairs (2i, 2i+1) of each head
             with angle pos * base^(-2i/n_rot); causal GQA softmax(q k^T / sqrt(hd)) v;
             x += o Wo^T; h2 = rms(x) * ffn_norm; x += (silu(h2 Wg^T) * h2 Wu^T) Wd^T
  logits = (rms(x) * output_norm) output^T   (output = token_embd when absent: tied)
  loss = mean cross-entropy over all B*T positions.
Per-layer shapes (a structured-pruned model): head_count, head_count_kv and feed_forward_length
may be arrays (one value per layer), head_dim is attention.key_length when given, and a layer
may have attn_output.bias / ffn_down.bias ([n_embd], added to that projection's output).

Self-checks:  /usr/bin/python3 tests/py/train_torch_ref.py [--tern build/release/tern]
  * the torch forward vs gguf_np.llama_logits (numpy float64) and, with --tern, `tern logits`;
  * float64 autograd gradients vs central finite differences on a few coordinates;
  * the data packing vs `tern tokenize` (with --tern).
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gguf_np import raw_kvs, read_gguf  # noqa: E402


# ----------------------------------------------------------------------------------------------
# hyper-parameters and weights

class HParams:
    def __init__(self, meta, tensors):
        arch = meta.get("general.architecture", "llama")
        self.arch = arch
        self.n_embd = int(meta[f"{arch}.embedding_length"])
        self.n_layer = int(meta[f"{arch}.block_count"])

        def per_layer(v):  # one value for every layer, or a list of one per layer
            return [int(x) for x in v] if isinstance(v, list) else [int(v)] * self.n_layer
        self.n_head_l = per_layer(meta[f"{arch}.attention.head_count"])
        self.n_head_kv_l = per_layer(meta.get(f"{arch}.attention.head_count_kv", self.n_head_l))
        self.n_ff_l = per_layer(meta.get(f"{arch}.feed_forward_length", 0))
        self.n_head, self.n_head_kv, self.n_ff = self.n_head_l[0], self.n_head_kv_l[0], self.n_ff_l[0]
        self.head_dim = int(meta.get(f"{arch}.attention.key_length", self.n_embd // self.n_head))
        self.biases = sorted(n for n in tensors if n.endswith("attn_output.bias") or n.endswith("ffn_down.bias"))
        self.n_rot = int(meta.get(f"{arch}.rope.dimension_count", self.head_dim))
        self.rope_base = float(meta.get(f"{arch}.rope.freq_base", 10000.0))
        self.eps = float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5))
        self.n_vocab = int(tensors["token_embd.weight"].shape[0])
        self.tied = "output.weight" not in tensors

    @staticmethod
    def make(n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff, eps=1e-5, rope_base=10000.0, tied=False):
        h = HParams.__new__(HParams)
        h.arch = "llama"
        h.n_embd, h.n_layer, h.n_head, h.n_head_kv, h.n_ff = n_embd, n_layer, n_head, n_head_kv, n_ff
        h.head_dim = n_embd // n_head
        h.n_head_l, h.n_head_kv_l, h.n_ff_l = [n_head] * n_layer, [n_head_kv] * n_layer, [n_ff] * n_layer
        h.biases = []
        h.n_rot = h.head_dim
        h.rope_base, h.eps, h.n_vocab, h.tied = rope_base, eps, n_vocab, tied
        return h

    def __repr__(self):
        if self.uniform():
            return (f"HParams(vocab={self.n_vocab}, embd={self.n_embd}, layer={self.n_layer}, head={self.n_head}, "
                    f"head_kv={self.n_head_kv}, ff={self.n_ff}, rot={self.n_rot}, base={self.rope_base}, "
                    f"eps={self.eps:g}, tied={self.tied})")
        return (f"HParams(vocab={self.n_vocab}, embd={self.n_embd}, layer={self.n_layer}, head={self.n_head_l}, "
                f"head_kv={self.n_head_kv_l}, ff={self.n_ff_l}, head_dim={self.head_dim}, rot={self.n_rot}, "
                f"biases={len(self.biases)}, tied={self.tied})")

    def uniform(self):
        return (len(set(self.n_head_l)) == 1 and len(set(self.n_head_kv_l)) == 1 and len(set(self.n_ff_l)) == 1
                and self.head_dim * self.n_head == self.n_embd and not self.biases)


def param_names(hp):
    names = ["token_embd.weight"]
    for il in range(hp.n_layer):
        p = f"blk.{il}."
        names += [p + n for n in ("attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                                  "attn_output.weight", "ffn_norm.weight", "ffn_gate.weight",
                                  "ffn_up.weight", "ffn_down.weight")]
        names += [n for n in getattr(hp, "biases", []) if n.startswith(p)]
    names.append("output_norm.weight")
    if not hp.tied:
        names.append("output.weight")
    return names


def load_model(path, dtype=torch.float32):
    """Returns (hp, meta, params): params is an ordered dict name -> leaf tensor (requires_grad)."""
    meta, t = read_gguf(path)
    hp = HParams(meta, t)
    params = {}
    for n in param_names(hp):
        params[n] = torch.tensor(np.ascontiguousarray(t[n]), dtype=dtype).requires_grad_(True)
    return hp, meta, params


def random_params(hp, dtype=torch.float32, seed=0, std=0.02):
    g = torch.Generator().manual_seed(seed)
    E, F_, hd = hp.n_embd, hp.n_ff, hp.head_dim
    shapes = {"token_embd.weight": (hp.n_vocab, E), "output_norm.weight": (E,), "output.weight": (hp.n_vocab, E)}
    for il in range(hp.n_layer):
        p = f"blk.{il}."
        shapes.update({p + "attn_norm.weight": (E,), p + "attn_q.weight": (hp.n_head * hd, E),
                       p + "attn_k.weight": (hp.n_head_kv * hd, E), p + "attn_v.weight": (hp.n_head_kv * hd, E),
                       p + "attn_output.weight": (E, hp.n_head * hd), p + "ffn_norm.weight": (E,),
                       p + "ffn_gate.weight": (F_, E), p + "ffn_up.weight": (F_, E), p + "ffn_down.weight": (E, F_)})
    params = {}
    for n in param_names(hp):
        s = shapes[n]
        if len(s) == 1:
            w = torch.ones(s, dtype=dtype)
        else:
            w = torch.randn(s, generator=g, dtype=torch.float32).to(dtype) * std
        params[n] = w.requires_grad_(True)
    return params


def write_llama_gguf(path, vocab_path, meta, P):
    """An F32 llama GGUF: `meta` (key -> int (u32), float (f32), or list of ints (i32 array)), the
    tokenizer.* keys of vocab_path copied as they are, and the tensors of P (name -> [n_out, n_in]
    array, numpy order) in order."""
    import struct

    def s(x):
        b = x.encode()
        return struct.pack("<Q", len(b)) + b
    kvs = [("general.architecture", struct.pack("<I", 8) + s("llama"))]
    for k, v in meta.items():
        if isinstance(v, list):
            kvs.append((k, struct.pack("<IIQ", 9, 5, len(v)) + b"".join(struct.pack("<i", int(x)) for x in v)))
        elif isinstance(v, float):
            kvs.append((k, struct.pack("<If", 6, v)))
        else:
            kvs.append((k, struct.pack("<II", 4, int(v))))
    kvs += [(k, raw) for k, raw in raw_kvs(vocab_path) if k.startswith("tokenizer.")]
    out = bytearray(b"GGUF") + struct.pack("<IQQ", 3, len(P), len(kvs))
    for k, raw in kvs:
        out += s(k) + raw
    blobs, off = [], 0
    for name, arr in P.items():
        a = np.ascontiguousarray(np.asarray(arr, dtype=np.float64), dtype="<f4")
        ne = list(reversed(a.shape))
        out += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        out += struct.pack("<IQ", 0, off)
        b = a.tobytes() + b"\0" * ((-a.nbytes) % 32)
        blobs.append(b)
        off += len(b)
    out += b"\0" * ((-len(out)) % 32)
    with open(path, "wb") as f:
        f.write(bytes(out) + b"".join(blobs))


# ----------------------------------------------------------------------------------------------
# forward

def rmsnorm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rope_tables(hp, T, dtype):
    # angle(pos, i) = pos * base^(-2i / n_rot), computed in float64 then cast
    inv = hp.rope_base ** (-torch.arange(0, hp.n_rot, 2, dtype=torch.float64) / hp.n_rot)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).to(dtype), torch.sin(ang).to(dtype)  # [T, n_rot/2]


def apply_rope(x, cos, sin, n_rot):
    # x: [B, T, nh, hd]; rotate adjacent pairs (2i, 2i+1) for 2i < n_rot
    B, T, nh, hd = x.shape
    xr = x[..., :n_rot].reshape(B, T, nh, n_rot // 2, 2)
    x0, x1 = xr[..., 0], xr[..., 1]
    c = cos[None, :, None, :]
    s = sin[None, :, None, :]
    y = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).reshape(B, T, nh, n_rot)
    if n_rot == hd:
        return y
    return torch.cat((y, x[..., n_rot:]), dim=-1)


def forward_logits(hp, P, ids, rope=None, lora=None, alpha=None):
    """ids: LongTensor [B, T] -> logits [B, T, n_vocab]. lora: {base tensor name: (A [r, n_in],
    B [n_out, r])}: that linear adds (alpha / r) (x A^T) B^T (LoRA, llama.cpp's rule)."""
    B, T = ids.shape

    def lin(x, name):
        y = x @ P[name].t()
        if lora is not None and name in lora:
            A, Bm = lora[name]
            y = y + (alpha / A.shape[0]) * ((x @ A.t()) @ Bm.t())
        return y
    dtype = P["token_embd.weight"].dtype
    hd = hp.head_dim
    cos, sin = rope if rope is not None else rope_tables(hp, T, dtype)
    mask = torch.full((T, T), float("-inf"), dtype=dtype).triu(1)
    scale = 1.0 / math.sqrt(hd)
    x = P["token_embd.weight"][ids]
    for il in range(hp.n_layer):
        p = f"blk.{il}."
        H, Hkv = hp.n_head_l[il], hp.n_head_kv_l[il]
        rep = H // Hkv
        h = rmsnorm(x, P[p + "attn_norm.weight"], hp.eps)
        q = lin(h, p + "attn_q.weight").view(B, T, H, hd)
        k = lin(h, p + "attn_k.weight").view(B, T, Hkv, hd)
        v = lin(h, p + "attn_v.weight").view(B, T, Hkv, hd)
        q = apply_rope(q, cos, sin, hp.n_rot).transpose(1, 2)            # [B, H, T, hd]
        k = apply_rope(k, cos, sin, hp.n_rot).transpose(1, 2)            # [B, Hkv, T, hd]
        v = v.transpose(1, 2)
        if rep > 1:  # query head h uses kv head h // rep
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        att = (q @ k.transpose(-1, -2)) * scale + mask
        att = torch.softmax(att, dim=-1)
        o = (att @ v).transpose(1, 2).reshape(B, T, H * hd)
        x = x + lin(o, p + "attn_output.weight")
        if p + "attn_output.bias" in P:
            x = x + P[p + "attn_output.bias"]
        h2 = rmsnorm(x, P[p + "ffn_norm.weight"], hp.eps)
        g = lin(h2, p + "ffn_gate.weight")
        u = lin(h2, p + "ffn_up.weight")
        x = x + lin(F.silu(g) * u, p + "ffn_down.weight")
        if p + "ffn_down.bias" in P:
            x = x + P[p + "ffn_down.bias"]
    x = rmsnorm(x, P["output_norm.weight"], hp.eps)
    if hp.tied:
        return x @ P["token_embd.weight"].t()
    return lin(x, "output.weight")


def loss_fn(hp, P, windows, rope=None):
    """windows: LongTensor [B, T+1]; mean cross-entropy of targets windows[:, 1:]."""
    logits = forward_logits(hp, P, windows[:, :-1], rope)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))


def grads(hp, P, windows):
    for p in P.values():
        p.grad = None
    loss = loss_fn(hp, P, windows)
    loss.backward()
    return loss.item(), {n: p.grad.detach().clone() for n, p in P.items()}


# ----------------------------------------------------------------------------------------------
# data: documents, tokens, windows

def split_documents(data: bytes):
    """Documents = maximal runs of non-empty lines (a whitespace-only line is empty), joined by \\n."""
    docs, cur = [], []
    for line in data.split(b"\n"):
        if line.strip() == b"":
            if cur:
                docs.append(b"\n".join(cur))
                cur = []
        else:
            cur.append(line)
    if cur:
        docs.append(b"\n".join(cur))
    return docs


def tokenize_documents(tern, model, docs):
    """Each document's ids with BOS, as `tern tokenize -f FILE --json` prints them."""
    out = []
    with tempfile.TemporaryDirectory() as d:
        f = os.path.join(d, "doc.txt")
        for doc in docs:
            with open(f, "wb") as fh:
                fh.write(doc)
            r = subprocess.run([tern, "tokenize", "-m", model, "-f", f, "--json"], check=True,
                               capture_output=True, text=True)
            out.append(json.loads(r.stdout.strip().splitlines()[-1]))
    return out


def token_stream(tern, model, data: bytes):
    S = []
    for ids in tokenize_documents(tern, model, split_documents(data)):
        S.extend(ids)
    return S


def make_windows(S, T):
    n = (len(S) - 1) // T
    if n < 1:
        raise ValueError(f"{len(S)} tokens are too few for one window of {T} + 1")
    return torch.tensor([S[w * T: w * T + T + 1] for w in range(n)], dtype=torch.long)


def micro_batch(windows, m, B):
    """--no-shuffle order: micro-batch m holds windows (m*B + b) % n_windows."""
    n = windows.shape[0]
    return windows[[(m * B + b) % n for b in range(B)]]


# ----------------------------------------------------------------------------------------------
# what the oracles (tests/py/test_*_torch_oracle.py) share: paths, running tern, data, skipping

SHARED = os.environ.get("TERN_SHARED_DIR", os.path.join(HERE, "../../../shared"))
TERN = os.environ.get("TERN_BINARY", "tern")
MODEL = os.path.join(SHARED, "models/stories260K.gguf")
VAL = os.path.join(SHARED, "data/tinystories/tinystories_val.txt")

# `--targets` kinds -> the per-layer tensor names they adapt
KIND_TENSOR = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate",
               "up": "ffn_up", "down": "ffn_down"}


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        raise RuntimeError(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r


def write_docs(path, n_docs):
    """The first n_docs blank-line-separated documents of VAL, blank-line-separated, into path."""
    docs = split_documents(open(VAL, "rb").read())[:n_docs]
    with open(path, "wb") as f:
        f.write(b"\n\n".join(docs) + b"\n")


def skip_reason(command):
    """Why an oracle of `tern COMMAND` must skip (no ../shared model or data, no tern, no such
    command), or None."""
    if not os.path.exists(MODEL) or not os.path.exists(VAL):
        return f"missing {MODEL} or {VAL}"
    try:
        h = subprocess.run([TERN, command, "--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot run {TERN}: {e}"
    if h.returncode != 0:
        return f"`{TERN} {command} --help` failed (no {command} command)"
    return None


def check_dump_loss(tag, tg, loss, tol):
    """tern's train.loss in the --dump-grads file tg against torch's loss (a float), printed with
    `tag`: -> failures (0 or 1, beyond `tol` relative)."""
    tl = float(np.asarray(tg["train.loss"]).reshape(-1)[0])
    rel = abs(tl - loss) / abs(loss)
    ok = rel <= tol
    print(f"{'ok  ' if ok else 'FAIL'} [{tag}] loss tern {tl:.8f} torch {loss:.8f} rel {rel:.3g}")
    return int(not ok)


def run_in_workdir(keep, prefix, body):
    """body(d) -> failures, in `keep` or else a fresh temporary directory (removed after); prints
    PASS or FAILED: N -> the exit code (0 or 1)."""
    d = keep or tempfile.mkdtemp(prefix=prefix)
    os.makedirs(d, exist_ok=True)
    try:
        fails = body(d)
    finally:
        if not keep:
            shutil.rmtree(d, ignore_errors=True)
    print("PASS" if fails == 0 else f"FAILED: {fails}")
    return 0 if fails == 0 else 1


# ----------------------------------------------------------------------------------------------
# optimizer loop

def lr_at(s, lr, min_lr, warmup, steps):
    if s < warmup:
        return lr * (s + 1) / warmup
    p = (s - warmup) / max(1, steps - warmup)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * p))


def train(hp, P, windows, steps, B, A=1, lr=1e-3, min_lr=None, warmup=0, weight_decay=0.0,
          beta1=0.9, beta2=0.999, eps=1e-8, clip=0.0, log=None):
    """AdamW (torch.optim.AdamW) over all tensors, decay only on 2-D ones. Returns per-step records
    {step (1-based), loss (mean over the step's micro-batches, before the update), lr, grad_norm
    (global L2 before clipping)}; P is updated in place."""
    if min_lr is None:
        min_lr = lr
    params = list(P.values())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(beta1, beta2), eps=eps)
    T = windows.shape[1] - 1
    rope = rope_tables(hp, T, params[0].dtype)
    recs = []
    for s in range(steps):
        lr_s = lr_at(s, lr, min_lr, warmup, steps)
        for g in opt.param_groups:
            g["lr"] = lr_s
        opt.zero_grad(set_to_none=True)
        tot = 0.0
        for a in range(A):
            mb = micro_batch(windows, s * A + a, B)
            loss = loss_fn(hp, P, mb, rope)
            (loss / A).backward()
            tot += loss.item()
        if clip > 0:
            gn = torch.nn.utils.clip_grad_norm_(params, clip).item()
        else:
            gn = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params)).item()
        with torch.no_grad():
            opt.step()
        rec = {"step": s + 1, "loss": tot / A, "lr": lr_s, "grad_norm": gn}
        recs.append(rec)
        if log:
            log(rec)
    return recs


# ----------------------------------------------------------------------------------------------
# self-checks

def _selfcheck():
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--tern", default=os.environ.get("TERN_BINARY"))
    ap.add_argument("--shared", default=os.environ.get("TERN_SHARED_DIR", os.path.join(HERE, "../../../shared")))
    a = ap.parse_args()
    from gguf_np import llama_logits
    model = os.path.join(a.shared, "models/stories260K.gguf")
    meta, t = read_gguf(model)
    ids = [1, 403, 407, 261, 378, 432, 10, 300, 77, 5, 511, 42, 99, 1, 7]
    want = llama_logits(meta, t, ids)
    ok = True
    for dt, tol in ((torch.float64, 1e-9), (torch.float32, 1e-4)):
        hp, _, P = load_model(model, dt)
        with torch.no_grad():
            got = forward_logits(hp, P, torch.tensor([ids])).double().numpy()[0]
        err = np.abs(got - want).max()
        print(f"forward {str(dt):14s} vs numpy oracle: max abs {err:.3g} (scale {np.abs(want).max():.3g})")
        ok &= err <= tol * max(1.0, np.abs(want).max())
    if a.tern:
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "l.f32")
            subprocess.run([a.tern, "logits", "-m", model, "--ids", " ".join(map(str, ids)), "-o", out,
                            "-t", "2"], check=True, stdout=subprocess.DEVNULL)
            tl = np.fromfile(out, dtype="<f4").reshape(len(ids), -1).astype(np.float64)
        hp, _, P = load_model(model, torch.float64)
        with torch.no_grad():
            got = forward_logits(hp, P, torch.tensor([ids])).numpy()[0]
        err = np.abs(got - tl).max()
        print(f"forward float64 vs tern logits: max abs {err:.3g}")
        ok &= err <= 1e-4 * max(1.0, np.abs(tl).max())

    # gradients: float64 autograd vs central differences on a few coordinates of each kind
    hp, _, P = load_model(model, torch.float64)
    g = torch.Generator().manual_seed(1)
    win = torch.randint(0, hp.n_vocab, (2, 17), generator=g)
    loss, G = grads(hp, P, win)
    worst = 0.0
    for n in ["token_embd.weight", "blk.0.attn_q.weight", "blk.1.attn_k.weight", "blk.2.attn_v.weight",
              "blk.3.attn_norm.weight", "blk.4.ffn_down.weight", "output_norm.weight", "output.weight"]:
        p = P[n]
        flat = p.detach().view(-1)
        for j in torch.randint(0, flat.numel(), (3,), generator=g).tolist():
            h = 1e-4
            old = flat[j].item()
            with torch.no_grad():
                flat[j] = old + h
                lp = loss_fn(hp, P, win).item()
                flat[j] = old - h
                lm = loss_fn(hp, P, win).item()
                flat[j] = old
            fd = (lp - lm) / (2 * h)
            ad = G[n].view(-1)[j].item()
            e = abs(fd - ad) / (abs(ad) + 1e-3 * G[n].abs().max().item())
            worst = max(worst, e)
    print(f"float64 autograd vs central differences: worst err {worst:.3g} (|fd - ad| / (|ad| + 1e-3 max|g|)) (loss {loss:.6f})")
    ok &= worst < 1e-5

    # consistency: float32 gradients vs float64
    hp, _, P32 = load_model(model, torch.float32)
    _, G32 = grads(hp, P32, win)
    rel = max((G32[n].double() - G[n]).norm().item() / G[n].norm().item() for n in G)
    print(f"float32 vs float64 gradients: worst tensor rel L2 {rel:.3g}")

    if a.tern:
        path = os.path.join(a.shared, "data/tinystories/tinystories_val.txt")
        data = open(path, "rb").read()[:4000]
        docs = split_documents(data)
        toks = tokenize_documents(a.tern, model, docs)
        print(f"packing: {len(docs)} documents, {sum(map(len, toks))} tokens, "
              f"all start with BOS: {all(x[0] == 1 for x in toks)}")
        ok &= all(x[0] == 1 for x in toks)
    print("selfcheck", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(_selfcheck())
