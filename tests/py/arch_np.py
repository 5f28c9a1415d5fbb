"""arch_np.py — float64 numpy oracle: the logits of a GGUF model for a token sequence, computed
the way llama.cpp computes them, for the architectures llama (Llama-2/3 incl. rope_freqs, and
Mixtral MoE), qwen2, qwen2moe, qwen3, qwen3moe, phi3, gemma2 and gemma3.

Written from llama.cpp's graph builders and hparams loading (src/models/*.cpp, llama-model.cpp,
llama-hparams.cpp) and convert_hf_to_gguf.py, read not copied; it shares no code with tern.
It reads F32 / F16 tensors (gguf_np.read_gguf).  Validated against llama.cpp itself with
tests/models/peer/peer_logits.mjs on the tiny models of arch_tiny_models.py.

Use:
    from arch_np import arch_logits, read_gguf
    meta, t = read_gguf("m.gguf"); logits = arch_logits(meta, t, [1, 2, 3])   # [T, n_vocab]
    hidden = arch_hidden(meta, t, [1, 2, 3])    # [T, n_embd], after the output norm
    python3 tests/py/arch_np.py M.gguf 1 2 3        # prints argmax per position and logit scale

The llama.cpp conventions it follows (the easy-to-get-wrong ones) are listed in CONVENTIONS.
"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_np import read_gguf  # noqa: E402,F401

CONVENTIONS = """
rope type     llama: NORM (rotate pairs 2i,2i+1).  qwen2, qwen2moe, qwen3, qwen3moe, phi3, gemma2,
              gemma3: NEOX (rotate pairs i, i+n_rot/2).  theta_i = pos * freq_scale * base^(-2i/n_rot)
              / freq_factor[i];  n_rot = rope.dimension_count, else head_dim (key_length).
rope_freqs    llama only: tensor rope_freqs.weight [n_rot/2] (Llama-3.1 converter) divides theta.
head_dim      attention.key_length (value_length for V) when present, else n_embd/n_head; q has
              n_head*head_dim rows which need not equal n_embd (qwen3, gemma).
qwen2         q/k/v biases (attn_q.bias ...), added before rope.
qwen3/3moe    attn_q_norm/attn_k_norm: RMSNorm over head_dim per head (eps = rms eps), before rope.
phi3          attn_qkv rows = [q (n_head*hd) | k (n_kv*hd) | v (n_kv*hd)]; ffn_up has 2*n_ff rows:
              first n_ff = gate (silu), last n_ff = up; Q scaled by 1/sqrt(hd) before the kq matmul;
              phi3.attention.sliding_window is read but llama.cpp DISABLES phi3 SWA (full attention).
gemma2/3      GGUF norm weights already hold 1+w: plain RMSNorm; embeddings * sqrt(n_embd);
              GeGLU: gelu_tanh(gate) * up;  post_attention_norm on the attention output before the
              residual add, post_ffw_norm on the ffn output before its add;  Q scale
              f_attention_scale = 1/sqrt(head_dim) (1/sqrt(n_embd/n_head) only for the 27B sizes:
              gemma2 46 layers, gemma3 62 layers); query_pre_attn_scalar is NOT read.
gemma2        sliding layers: il % 2 == 0 (even); window attention.sliding_window (default 4096):
              key j visible from query i iff 0 <= i-j < n_swa;  attention softcap (default 50,
              key attn_logit_softcapping) on scaled scores: c*tanh(s/c);  final softcap
              (default 30, key final_logit_softcapping) on the logits; rope base default 10000.
gemma3        with attention.sliding_window > 0: layer il is local iff il % P < P-1, P =
              attention.sliding_window_pattern (default 6: layers 5, 11, ... global);  local rope
              base rope.freq_base_swa (default 10000) and freq_scale 1; global rope.freq_base and
              rope scaling (linear: freq_scale = 1/rope.scaling.factor);  q_norm/k_norm before rope;
              no attention softcap, no final softcap.  Without attention.sliding_window (or 0) all
              layers are global with rope.freq_base, still no final softcap (checked on the peer).
MoE gating    logits = ffn_gate_inp @ x; softmax over all experts; top-k (expert_used_count) by
              probability; weights = the chosen probabilities, renormalised to sum 1 for llama
              (Mixtral), qwen3moe, phi3 MoE; NOT renormalised for qwen2moe.  Experts: down(silu(gate x)
              * up x), tensors ggml ne [n_embd, n_ff_exp, n_expert] (down: [n_ff_exp, n_embd, n_expert]).
qwen2moe      shared expert ffn_{gate,up,down}_shexp (n_ff = expert_shared_feed_forward_length, else
              feed_forward_length) times sigmoid(ffn_gate_inp_shexp . x) (a [n_embd] vector), added.
n_ff_exp      expert_feed_forward_length, else feed_forward_length / expert_used_count (qwen*moe);
              llama/Mixtral experts use feed_forward_length.
output        output.weight if present, else token_embd.weight (tied).
"""


def _rms(x, w, eps):
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return y * w if w is not None else y


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def _gelu_ggml_fp16(x):
    """ggml's CPU GELU (GGML_GELU_FP16): input rounded to fp16, a table of fp16(gelu_tanh(x)) in
    float32 arithmetic, x <= -10 -> 0, x >= 10 -> x.  Only to show that the remaining difference
    from llama.cpp on gemma is this rounding; tern is held to the exact _gelu_tanh."""
    h = x.astype(np.float16).astype(np.float32)
    g = (0.5 * h * (1.0 + np.tanh(np.float32(math.sqrt(2.0 / math.pi)) * h * (1.0 + np.float32(0.044715) * h * h))))
    y = g.astype(np.float32).astype(np.float16).astype(np.float64)
    return np.where(x <= -10.0, 0.0, np.where(x >= 10.0, x, y))


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _rope(x, pos, n_rot, base, freq_scale, neox, freq_factors=None):
    """x: [T, nh, hd]."""
    half = n_rot // 2
    inv = base ** (-np.arange(half) * 2.0 / n_rot)
    if freq_factors is not None:
        inv = inv / freq_factors[:half]
    ang = (pos[:, None] * freq_scale) * inv[None, :]          # [T, half]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    y = x.copy()
    if neox:
        x0, x1 = x[..., :half], x[..., half:n_rot]
        y[..., :half] = x0 * c - x1 * s
        y[..., half:n_rot] = x0 * s + x1 * c
    else:
        x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        y[..., 0:n_rot:2] = x0 * c - x1 * s
        y[..., 1:n_rot:2] = x0 * s + x1 * c
    return y


class Hparams:
    def __init__(self, meta):
        a = self.arch = meta["general.architecture"]
        g = lambda k, d=None: meta.get(f"{a}.{k}", d)  # noqa: E731
        self.E = g("embedding_length")
        self.L = g("block_count")
        self.H = g("attention.head_count")
        self.Hkv = g("attention.head_count_kv", self.H)
        if isinstance(self.H, list) or isinstance(self.Hkv, list):
            raise ValueError("per-layer head counts are not supported by this oracle")
        self.hd_k = g("attention.key_length", self.E // self.H)
        self.hd_v = g("attention.value_length", self.hd_k)
        self.n_rot = g("rope.dimension_count", self.hd_k)
        self.base = g("rope.freq_base", 10000.0)
        sc_type = g("rope.scaling.type", "none")
        factor = g("rope.scaling.factor", 0.0)
        self.freq_scale = 1.0 / factor if (sc_type == "linear" and factor) else 1.0
        if sc_type not in ("none", "linear"):
            raise ValueError(f"rope scaling {sc_type} not supported by this oracle")
        self.eps = g("attention.layer_norm_rms_epsilon", 1e-5)
        self.n_ff = g("feed_forward_length")
        self.n_expert = g("expert_count", 0)
        self.n_expert_used = g("expert_used_count", 0)
        self.n_ff_exp = g("expert_feed_forward_length", 0)
        self.n_ff_shexp = g("expert_shared_feed_forward_length", 0)
        self.neox = a in ("qwen2", "qwen2moe", "qwen3", "qwen3moe", "phi3", "gemma2", "gemma3")
        self.gemma = a in ("gemma2", "gemma3")
        # sliding window
        self.n_swa = 0
        self.swa_layers = [False] * self.L
        self.base_swa, self.scale_swa = g("rope.freq_base_swa", 10000.0), 1.0
        if a == "gemma2":
            self.n_swa = g("attention.sliding_window", 4096)
            self.swa_layers = [il % 2 < 1 for il in range(self.L)]
        elif a == "gemma3":
            self.n_swa = g("attention.sliding_window", 0)
            if self.n_swa > 0:
                pat = g("attention.sliding_window_pattern", 6)
                if isinstance(pat, list):  # per-layer array form: true = sliding
                    self.swa_layers = [bool(v) for v in pat]
                else:
                    self.swa_layers = [il % pat < pat - 1 for il in range(self.L)]
        # (phi3: the sliding_window key is ignored, llama.cpp disables phi3 SWA)
        # attention scale
        self.q_scale = 1.0 / math.sqrt(self.hd_k)
        if (a == "gemma2" and self.L == 46) or (a == "gemma3" and self.L == 62):
            self.q_scale = 1.0 / math.sqrt(self.E / self.H)
        self.attn_softcap = g("attn_logit_softcapping", 50.0) if a == "gemma2" else 0.0
        if a == "gemma2":
            self.final_softcap = g("final_logit_softcapping", 30.0)
        elif a == "gemma3":  # the converter never writes it; llama.cpp applies none by default
            self.final_softcap = g("final_logit_softcapping", 0.0)
        else:
            self.final_softcap = 0.0
        self.moe_norm_w = a in ("llama", "qwen3moe", "phi3")


def _moe(hp, t, p, h):
    T = h.shape[0]
    logits = h @ t[p + "ffn_gate_inp.weight"].T                  # [T, n_expert]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    k = hp.n_expert_used
    sel = np.argsort(-probs, axis=-1, kind="stable")[:, :k]      # [T, k]
    wts = np.take_along_axis(probs, sel, -1)
    if hp.moe_norm_w:
        wts = wts / wts.sum(-1, keepdims=True)
    gate_e, up_e, down_e = t.get(p + "ffn_gate_exps.weight"), t[p + "ffn_up_exps.weight"], t[p + "ffn_down_exps.weight"]
    out = np.zeros_like(h)
    for ti in range(T):
        for j in range(k):
            e = sel[ti, j]
            u = up_e[e] @ h[ti]
            gg = gate_e[e] @ h[ti]
            out[ti] += wts[ti, j] * (down_e[e] @ (_silu(gg) * u))
    if p + "ffn_gate_inp_shexp.weight" in t:                      # qwen2moe shared expert
        gs = t[p + "ffn_gate_inp_shexp.weight"].reshape(-1)
        sig = 1.0 / (1.0 + np.exp(-(h @ gs)))                     # [T]
        sh = (_silu(h @ t[p + "ffn_gate_shexp.weight"].T) * (h @ t[p + "ffn_up_shexp.weight"].T)) \
            @ t[p + "ffn_down_shexp.weight"].T
        out = out + sh * sig[:, None]
    return out


def arch_logits(meta, t, ids, return_hparams=False, ggml_gelu=False):
    """Logits [len(ids), n_vocab] in float64.  ggml_gelu=True imitates ggml's fp16-table GELU."""
    x, hp = arch_hidden(meta, t, ids, return_hparams=True, ggml_gelu=ggml_gelu)
    out = t.get("output.weight", t["token_embd.weight"])
    logits = x @ out.T
    if hp.final_softcap:
        logits = hp.final_softcap * np.tanh(logits / hp.final_softcap)
    return (logits, hp) if return_hparams else logits


def arch_hidden(meta, t, ids, return_hparams=False, ggml_gelu=False):
    """Final hidden states [len(ids), n_embd] in float64: the last layer's residual stream after
    the output norm, before the output projection (what llama.cpp's embeddings are for a
    decoder model)."""
    hp = Hparams(meta)
    ids = list(ids)
    T = len(ids)
    pos = np.arange(T, dtype=np.float64)
    H, Hkv, hdk, hdv, eps = hp.H, hp.Hkv, hp.hd_k, hp.hd_v, hp.eps
    freq_factors = t.get("rope_freqs.weight") if hp.arch == "llama" else None
    if freq_factors is not None:
        freq_factors = freq_factors.reshape(-1)
    x = t["token_embd.weight"][ids].copy()
    if hp.gemma:
        x = x * math.sqrt(hp.E)
    qi = np.arange(T)[:, None]
    kj = np.arange(T)[None, :]
    causal = kj <= qi
    for il in range(hp.L):
        p = f"blk.{il}."
        h = _rms(x, t[p + "attn_norm.weight"], eps)
        if p + "attn_qkv.weight" in t:
            qkv = h @ t[p + "attn_qkv.weight"].T
            nq, nk = H * hdk, Hkv * hdk
            q, k, v = qkv[:, :nq], qkv[:, nq:nq + nk], qkv[:, nq + nk:nq + nk + Hkv * hdv]
        else:
            q = h @ t[p + "attn_q.weight"].T
            k = h @ t[p + "attn_k.weight"].T
            v = h @ t[p + "attn_v.weight"].T
        for name, arr in (("attn_q.bias", "q"), ("attn_k.bias", "k"), ("attn_v.bias", "v")):
            if p + name in t:
                b = t[p + name]
                if arr == "q":
                    q = q + b
                elif arr == "k":
                    k = k + b
                else:
                    v = v + b
        q = q.reshape(T, H, hdk)
        k = k.reshape(T, Hkv, hdk)
        v = v.reshape(T, Hkv, hdv)
        if p + "attn_q_norm.weight" in t:
            q = _rms(q, t[p + "attn_q_norm.weight"], eps)
        if p + "attn_k_norm.weight" in t:
            k = _rms(k, t[p + "attn_k_norm.weight"], eps)
        swa = hp.swa_layers[il] and hp.n_swa > 0
        if hp.arch == "gemma3" and swa:
            base, fscale = hp.base_swa, hp.scale_swa
        else:
            base, fscale = hp.base, hp.freq_scale
        q = _rope(q, pos, hp.n_rot, base, fscale, hp.neox, freq_factors)
        k = _rope(k, pos, hp.n_rot, base, fscale, hp.neox, freq_factors)
        rep = H // Hkv
        k = np.repeat(k, rep, axis=1)
        v = np.repeat(v, rep, axis=1)
        s = np.einsum("thd,shd->hts", q, k) * hp.q_scale
        if hp.attn_softcap:
            s = hp.attn_softcap * np.tanh(s / hp.attn_softcap)
        allowed = causal & ((qi - kj) < hp.n_swa) if swa else causal
        s = np.where(allowed[None], s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", s, v).reshape(T, H * hdv)
        o = o @ t[p + "attn_output.weight"].T
        if p + "attn_output.bias" in t:
            o = o + t[p + "attn_output.bias"]
        if p + "post_attention_norm.weight" in t:
            o = _rms(o, t[p + "post_attention_norm.weight"], eps)
        x = x + o
        h = _rms(x, t[p + "ffn_norm.weight"], eps)
        if p + "ffn_gate_inp.weight" in t:
            f = _moe(hp, t, p, h)
        else:
            up = h @ t[p + "ffn_up.weight"].T
            if p + "ffn_gate.weight" in t:
                gate = h @ t[p + "ffn_gate.weight"].T
            else:  # phi3 fused: first half gate, second half up
                nf = up.shape[1] // 2
                gate, up = up[:, :nf], up[:, nf:]
            act = (_gelu_ggml_fp16(gate) if ggml_gelu else _gelu_tanh(gate)) if hp.gemma else _silu(gate)
            f = (act * up) @ t[p + "ffn_down.weight"].T
        if p + "post_ffw_norm.weight" in t:
            f = _rms(f, t[p + "post_ffw_norm.weight"], eps)
        x = x + f
    x = _rms(x, t["output_norm.weight"], eps)
    return (x, hp) if return_hparams else x


def log_softmax(z):
    z = np.asarray(z, dtype=np.float64)
    m = z.max(-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))


if __name__ == "__main__":
    if len(sys.argv) < 3:
        print(__doc__)
        sys.exit(2)
    meta, tens = read_gguf(sys.argv[1])
    lg = arch_logits(meta, tens, [int(a) for a in sys.argv[2:]])
    srt = np.sort(lg, -1)
    print("argmax", lg.argmax(-1).tolist())
    print("margin top1-top2", np.round(srt[:, -1] - srt[:, -2], 4).tolist(), "scale", float(np.abs(lg).max()))
