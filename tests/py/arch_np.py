"""arch_np.py — float64 numpy oracle: the logits of a GGUF model for a token sequence, computed
the way llama.cpp computes them, for the architectures llama (Llama-2/3 incl. rope_freqs, and
Mixtral MoE), qwen2, qwen2moe, qwen3, qwen3moe, phi3, gemma2, gemma3, gpt-oss (attention
sinks, YaRN rope, clamped SwiGLU experts with biases), mamba (Mamba-1 selective state space),
mamba2 (Mamba-2: a scalar decay per head, grouped B/C, a gated grouped RMSNorm), deepseek2
(DeepSeek-V2/V3 multi-head latent attention), rwkv7 (RWKV-7: token shift, WKV-7 per head) and
rwkv6 (RWKV-6: data-dependent token shift and decay, WKV-6 per head).

Written from llama.cpp's graph builders and hparams loading (src/models/*.cpp, llama-model.cpp,
llama-hparams.cpp), ggml's ssm_conv / ssm_scan ops and convert_hf_to_gguf.py, read not copied; it shares no code with tern.
It reads F32 / F16 / MXFP4 tensors (gguf_np.read_gguf decodes MXFP4 exactly).  Validated against
llama.cpp itself with tests/models/peer/peer_logits.mjs on the tiny models of arch_tiny_models.py
(test_arch_llamacpp_peer.py --oracle).

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
              gemma3, gpt-oss: NEOX (rotate pairs i, i+n_rot/2).
              theta_i = pos * freq_scale * base^(-2i/n_rot) / freq_factor[i];
              n_rot = rope.dimension_count, else head_dim (key_length).
yarn          rope.scaling.type "yarn" (any arch; gpt-oss always): freq_scale s = 1/rope.scaling.factor,
              ggml's defaults ext_factor 1, attn_factor 1, beta_fast 32, beta_slow 1, original context
              n_orig = rope.scaling.original_context_length (else context_length).  Per pair i the
              unscaled angle a = pos*base^(-2i/n_rot) is blended with the interpolated s*a:
              angle = s*a*(1-r_i) + a*r_i, r_i = 1 - clip((i - lo)/max(0.001, hi - lo), 0, 1), where
              dim(beta) = n_rot*ln(n_orig/(2*pi*beta))/(2*ln base), lo = max(0, floor(dim(32))),
              hi = min(n_rot-1, ceil(dim(1))): pairs below lo keep the raw angle, pairs past hi are
              fully interpolated.  cos and sin are both scaled by 1 + 0.1*ln(1/s) (so q.k grows by
              its square).
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
gpt-oss       q/k/v biases and attn_output.bias; NEOX rope with yarn; Q scale 1/sqrt(head_dim)
              (head_dim = key_length, n_head*head_dim need not be n_embd);  even layers slide (window
              attention.sliding_window, key j visible from query i iff 0 <= i-j < n_swa), odd layers
              are global;  attention sinks: attn_sinks.weight holds one logit per head that enters
              the softmax normaliser but carries no value: p_j = e^(s_j) / (sum_k e^(s_k) + e^(sink_h)),
              so a head's weights sum to less than 1.  The FFN input norm is post_attention_norm
              (no ffn_norm; nothing normalises the attention output).  Router: ffn_gate_inp x +
              ffn_gate_inp.bias, top-k on those raw logits, weights = softmax over the k chosen logits.
              Expert e: g = gate_e x + b_gate[e], u = up_e x + b_up[e], both clamped: g' = min(g, 7),
              u' = clip(u, -7, 7); act = g' * sigmoid(1.702 g') * (u' + 1); y = down_e act + b_down[e].
              Expert biases ffn_{gate,up}_exps.bias ggml ne [n_ff_exp, n_expert], ffn_down_exps.bias
              [n_embd, n_expert].  Untied output.weight.
mamba         Mamba-1: no attention, no rope, no FFN (head_count and feed_forward_length are 0).
              Layer: x += ssm_out(mixer(rms(x, attn_norm))).  Mixer on h [T, n_embd]:
              ssm_in (ggml ne [n_embd, 2*d_inner]) gives [u | z], u the first d_inner rows;
              u goes through a causal depthwise conv, per channel c over the last d_conv steps,
              the oldest first: conv[t,c] = sum_k w[c,k] u[t-(d_conv-1)+k, c] (zero before the
              first token; ssm_conv1d.weight ne [d_conv, d_inner]), plus ssm_conv1d.bias, then silu.
              ssm_x (ne [d_inner, dt_rank + 2*d_state]) gives [dt | B | C] in that row order;
              with ssm.dt_b_c_rms each of the three is RMS-normalised (no weight, eps = rms eps).
              dt = softplus(ssm_dt dt + ssm_dt.bias) [d_inner] (ggml: log1p(e^x), x itself past 20).
              Scan from a zero state S [d_inner, d_state]: S = S * exp(dt[c] A[c,s]) + dt[c] u[c] B[s];
              y[c] = S[c,:] . C + D[c] u[c].  Then y * silu(z) through ssm_out.  The GGUF tensors
              blk.N.ssm_a (ne [d_state, d_inner], already A = -exp(A_log)) and blk.N.ssm_d carry
              no ".weight" suffix.  Output tied unless output.weight is present.
mamba2        Mamba-2 (llama.cpp's build_mamba2_layer): H = ssm.time_step_rank heads of
              P = d_inner / H channels, G = ssm.group_count groups of H / G heads.  Mixer on h:
              ssm_in (ne [n_embd, 2*d_inner + 2*G*d_state + H]) gives [z | xBC | dt]; xBC
              [d_inner + 2*G*d_state] goes through the causal conv as Mamba-1's u does (ssm_conv1d
              ne [d_conv, d_inner + 2*G*d_state], its bias, silu) and splits into x [d_inner], B and
              C [G, d_state].  dt = softplus(dt + ssm_dt.bias) [H].  Scan from a zero state
              S [d_inner, d_state]: for channel c of head h = c // P in group g = h // (H / G),
              S[c] = S[c] * exp(dt[h] A[h]) + dt[h] x[c] B[g]; y[c] = S[c] . C[g] + D[h] x[c]
              (ssm_a, ssm_d ne [1, H]).  y = y * silu(z), then RMS-normalised per group of
              d_inner / G channels times ssm_norm.weight (ne [d_inner / G, G]), then ssm_out.
deepseek2     DeepSeek-V2/V3 multi-head latent attention (llama.cpp's deepseek2 with attn_k_b /
              attn_v_b), in the plain non-absorbed form: q = attn_q h, or attn_q_b RMSNorm(attn_q_a h)
              [H, nope | rope]; [c | k_pe] = attn_kv_a_mqa h; c = RMSNorm(c) (attn_kv_a_norm);
              k_nope_h = k_b_h^T c (attn_k_b ne [nope, C, H]), v_h = v_b_h c (attn_v_b ne [C, dv, H]);
              rope (NORM, YaRN at unit magnitude) on q_pe and the shared k_pe; scores scaled by
              mscale^2 / sqrt(nope + rope).  FFN: leading_dense_block_count dense SwiGLU layers,
              then softmax / sigmoid experts (+ exp_probs_b selection bias, expert groups, norm,
              scale) and the shared experts.
granitehybrid IBM Granite 4.0-H (llama.cpp's granite-hybrid graph): x = token_embd[ids] *
              embedding_scale; per layer h = RMSNorm(x); layers whose attention.head_count_kv[il]
              is 0 run the Mamba-2 mixer above on h, the others causal GQA attention with no
              positional encoding (rope.scaling.finetuned false) and scores times attention.scale;
              x += residual_scale * that; then x += residual_scale * FFN(RMSNorm(x) with
              ffn_norm): dense SwiGLU, or softmax top-k experts renormalised plus the shared
              expert (ffn_*_shexp, no gate).  Logits divided by logit_scale.
qwen3next     Qwen3-Next (llama.cpp's qwen3next graph): per layer h = RMSNorm(x) (attn_norm); the
              layers attention.recurrent_layers marks (else all but every full_attention_interval-th)
              run the gated delta-net on h: with Hk = ssm.group_count key heads, Hv =
              ssm.time_step_rank value heads (r = Hv / Hk each), all of S = ssm.state_size,
              [q | k | v] = attn_qkv h (q, k [Hk, S], v [Hv, S]), z = attn_gate h (older files: ssm_in,
              per key head q, k, v, z); per key head g, ssm_ba h gives b then a of value heads g r ..;
              [q | k | v] = silu(causal conv, ssm_conv1d ne [d_conv, C], no bias); q, k L2-normalised
              per head (eps the RMS one) and repeated so that value head h reads key head h // r;
              beta = sigmoid(b), g = softplus(a + ssm_dt.bias) * ssm_a; from a zero state M [Hv, S, S]
              (value x key): M = M exp(g); d = (v - M k) beta; M += d k^T; o = M q / sqrt(S); then
              RMSNorm per value head (ssm_norm) * silu(z), then ssm_out.  The others attend: attn_q
              gives per head S_h query then S_h gate channels; q/k RMS-normalised per head (attn_q_norm,
              attn_k_norm), NeoX RoPE on the first rope.dimension_count channels of each head, causal
              GQA, output * sigmoid(gate), attn_output.  x += that; x += MoE(RMSNorm(x) with
              post_attention_norm): softmax top-k renormalised experts + the shared expert times
              sigmoid(h . ffn_gate_inp_shexp).
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


def _yarn_corr_dims(n_rot, n_orig, base, beta_fast=32.0, beta_slow=1.0):
    """The pair-index range [lo, hi] over which yarn ramps from the raw angle to the interpolated
    one (ggml's floor/ceil of the dimension where a wavelength fits n_orig/beta times)."""
    def dim(beta):
        return n_rot * math.log(n_orig / (beta * 2.0 * math.pi)) / (2.0 * math.log(base))
    return max(0.0, math.floor(dim(beta_fast))), min(n_rot - 1.0, math.ceil(dim(beta_slow)))


def _rope(x, pos, n_rot, base, freq_scale, neox, freq_factors=None, yarn=None):
    """x: [T, nh, hd].  yarn: None, or dict(n_orig=..., ext_factor=..., attn_factor=...)."""
    half = n_rot // 2
    inv = base ** (-np.arange(half) * 2.0 / n_rot)
    if freq_factors is not None:
        inv = inv / freq_factors[:half]
    raw = pos[:, None] * inv[None, :]                         # [T, half]
    ang = freq_scale * raw
    mscale = 1.0
    if yarn is not None:
        mscale = yarn.get("attn_factor", 1.0)
        ext = yarn.get("ext_factor", 1.0)
        if ext != 0.0:
            lo, hi = _yarn_corr_dims(n_rot, yarn["n_orig"], base)
            r = (1.0 - np.clip((np.arange(half) - lo) / max(0.001, hi - lo), 0.0, 1.0)) * ext
            ang = ang * (1.0 - r) + raw * r
            mscale *= 1.0 + 0.1 * math.log(1.0 / freq_scale)
    c, s = (np.cos(ang) * mscale)[:, None, :], (np.sin(ang) * mscale)[:, None, :]
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
        self.eps = g("attention.layer_norm_rms_epsilon", 1e-5)
        self.final_softcap = 0.0
        self.gpt_oss = False
        self.mamba = a in ("mamba", "mamba2")
        self.mamba2 = a == "mamba2"
        if self.mamba:  # no attention: the state-space sizes are all it needs
            self.d_conv = g("ssm.conv_kernel")
            self.d_inner = g("ssm.inner_size")
            self.d_state = g("ssm.state_size")
            self.dt_rank = g("ssm.time_step_rank")         # mamba2: the number of heads
            self.dt_b_c_rms = bool(g("ssm.dt_b_c_rms", False))
            self.n_group = g("ssm.group_count", 0)
            return
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
        self.freq_scale = 1.0 / factor if (sc_type in ("linear", "yarn") and factor) else 1.0
        if sc_type not in ("none", "linear", "yarn"):
            raise ValueError(f"rope scaling {sc_type} not supported by this oracle")
        self.yarn = None
        if sc_type == "yarn":  # llama.cpp's defaults: ext_factor 1, attn_factor 1, beta 32 / 1
            n_orig = g("rope.scaling.original_context_length", 0) or g("context_length")
            self.yarn = dict(n_orig=n_orig, ext_factor=1.0, attn_factor=1.0)
        self.n_ff = g("feed_forward_length")
        self.n_expert = g("expert_count", 0)
        self.n_expert_used = g("expert_used_count", 0)
        self.n_ff_exp = g("expert_feed_forward_length", 0)
        self.n_ff_shexp = g("expert_shared_feed_forward_length", 0)
        self.neox = a in ("qwen2", "qwen2moe", "qwen3", "qwen3moe", "phi3", "gemma2", "gemma3", "gpt-oss")
        self.gemma = a in ("gemma2", "gemma3")
        # sliding window
        self.n_swa = 0
        self.swa_layers = [False] * self.L
        self.base_swa, self.scale_swa = g("rope.freq_base_swa", 10000.0), 1.0
        if a == "gemma2":
            self.n_swa = g("attention.sliding_window", 4096)
            self.swa_layers = [il % 2 < 1 for il in range(self.L)]
        elif a == "gpt-oss":  # even layers slide, odd layers are global
            self.n_swa = g("attention.sliding_window", 0)
            self.swa_layers = [il % 2 == 0 for il in range(self.L)]
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
        self.gpt_oss = a == "gpt-oss"


def _swiglu_oai(g, u, alpha=1.702, limit=7.0):
    """gpt-oss's expert activation: the gate clamped from above, the up from both sides."""
    g = np.minimum(g, limit)
    u = np.clip(u, -limit, limit)
    return g / (1.0 + np.exp(-alpha * g)) * (u + 1.0)


def q8_0_round(x):
    """x rounded as an int8 activation row in 32-blocks with an f32 scale, the way a Q8_0 dot
    product sees it (ggml's quantize_row_q8_0 rule in f32: d = amax/127, q = round-half-even(x/d);
    tern keeps d in f32, ggml in f16).  For checking an engine that pairs MXFP4 weights with 8-bit
    activations: the quantized-activation rounding is then the only thing left to emulate."""
    x32 = np.asarray(x, dtype=np.float32)
    b = x32.reshape(-1, 32)
    d = (np.abs(b).max(-1, keepdims=True) / np.float32(127.0)).astype(np.float32)
    inv = np.where(d != 0, np.float32(1.0) / np.where(d != 0, d, np.float32(1.0)), np.float32(0.0))
    q = np.rint((b * inv.astype(np.float32)).astype(np.float32))   # half to even, as the 1.5*2^23 trick
    return (q.astype(np.float64) * d.astype(np.float64)).reshape(np.shape(x))


def _moe_gpt_oss(hp, t, p, h, act_q8=()):
    """Router with bias, top-k on raw logits, softmax over the chosen k; experts with biases.
    act_q8: expert weight names whose matmul input is rounded by q8_0_round first."""
    qg, qu, qd = (q8_0_round if p + f"ffn_{n}_exps.weight" in act_q8 else (lambda v: v)
                  for n in ("gate", "up", "down"))
    T = h.shape[0]
    logits = h @ t[p + "ffn_gate_inp.weight"].T + t[p + "ffn_gate_inp.bias"]    # [T, n_expert]
    k = hp.n_expert_used
    sel = np.argsort(-logits, axis=-1, kind="stable")[:, :k]                   # ties: lower index
    chosen = np.take_along_axis(logits, sel, -1)
    wts = np.exp(chosen - chosen.max(-1, keepdims=True))
    wts /= wts.sum(-1, keepdims=True)
    gw, uw, dw = (t[p + f"ffn_{n}_exps.weight"] for n in ("gate", "up", "down"))  # [n_expert, out, in]
    gb, ub, db = (t[p + f"ffn_{n}_exps.bias"] for n in ("gate", "up", "down"))    # [n_expert, out]
    out = np.zeros_like(h)
    for ti in range(T):
        for j in range(k):
            e = sel[ti, j]
            act = _swiglu_oai(gw[e] @ qg(h[ti]) + gb[e], uw[e] @ qu(h[ti]) + ub[e])
            out[ti] += wts[ti, j] * (dw[e] @ qd(act) + db[e])
    return out


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


def _softplus(x):
    """ggml's softplus in the ssm scan: log(1 + e^x), x itself for x > 20."""
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def _mamba_mixer(hp, t, p, h):
    """One Mamba-1 mixer on the normalised input h [T, n_embd] -> [T, n_embd] (before the residual
    add), as llama.cpp's build_mamba_layer with ggml_ssm_conv and ggml_ssm_scan from a zero state."""
    T = h.shape[0]
    di, ds, dc, dr = hp.d_inner, hp.d_state, hp.d_conv, hp.dt_rank
    xz = h @ t[p + "ssm_in.weight"].T                             # [T, 2*d_inner]
    u, z = xz[:, :di], xz[:, di:2 * di]
    w = t[p + "ssm_conv1d.weight"].reshape(di, dc)               # tap 0 = the oldest step
    padded = np.concatenate([np.zeros((dc - 1, di)), u], 0)      # [T + dc - 1, d_inner]
    conv = np.zeros((T, di))
    for k in range(dc):
        conv += padded[k:k + T] * w[:, k]
    u = _silu(conv + t[p + "ssm_conv1d.bias"])
    dbc = u @ t[p + "ssm_x.weight"].T                             # [T, dt_rank + 2*d_state]
    dt, B, C = dbc[:, :dr], dbc[:, dr:dr + ds], dbc[:, dr + ds:dr + 2 * ds]
    if hp.dt_b_c_rms:
        dt, B, C = _rms(dt, None, hp.eps), _rms(B, None, hp.eps), _rms(C, None, hp.eps)
    dt = _softplus(dt @ t[p + "ssm_dt.weight"].T + t[p + "ssm_dt.bias"])   # [T, d_inner]
    A = t[p + "ssm_a"].reshape(di, ds)
    D = t[p + "ssm_d"].reshape(di)
    S = np.zeros((di, ds))
    y = np.zeros((T, di))
    for ti in range(T):
        S = S * np.exp(dt[ti][:, None] * A) + (dt[ti] * u[ti])[:, None] * B[ti][None, :]
        y[ti] = S @ C[ti] + D * u[ti]
    return (y * _silu(z)) @ t[p + "ssm_out.weight"].T


def _mamba2_mixer(hp, t, p, h):
    """One Mamba-2 mixer on the normalised input h [T, n_embd] -> [T, n_embd] (before the residual
    add), as llama.cpp's build_mamba2_layer with ggml_ssm_conv and ggml_ssm_scan from a zero state."""
    T = h.shape[0]
    di, ds, dc, H, G = hp.d_inner, hp.d_state, hp.d_conv, hp.dt_rank, hp.n_group
    P, cd = di // H, di + 2 * G * ds
    zxbcdt = h @ t[p + "ssm_in.weight"].T                         # [T, 2*d_inner + 2*G*d_state + H]
    z, xbc, dt = zxbcdt[:, :di], zxbcdt[:, di:di + cd], zxbcdt[:, di + cd:]
    w = t[p + "ssm_conv1d.weight"].reshape(cd, dc)               # tap 0 = the oldest step
    padded = np.concatenate([np.zeros((dc - 1, cd)), xbc], 0)
    conv = np.zeros((T, cd))
    for k in range(dc):
        conv += padded[k:k + T] * w[:, k]
    xbc = _silu(conv + t[p + "ssm_conv1d.bias"])
    x = xbc[:, :di].reshape(T, H, P)
    B = xbc[:, di:di + G * ds].reshape(T, G, ds)
    C = xbc[:, di + G * ds:].reshape(T, G, ds)
    dt = _softplus(dt + t[p + "ssm_dt.bias"])                     # [T, H]
    A = t[p + "ssm_a"].reshape(H)
    D = t[p + "ssm_d"].reshape(H)
    grp = np.arange(H) // (H // G)                                # each head's group
    S = np.zeros((H, P, ds))
    y = np.zeros((T, H, P))
    for ti in range(T):
        Bh, Ch = B[ti][grp], C[ti][grp]                           # [H, d_state]
        S = S * np.exp(dt[ti] * A)[:, None, None] + (dt[ti][:, None] * x[ti])[:, :, None] * Bh[:, None, :]
        y[ti] = np.einsum("hps,hs->hp", S, Ch) + D[:, None] * x[ti]
    y = y.reshape(T, di) * _silu(z)
    y = _rms(y.reshape(T, G, di // G), t[p + "ssm_norm.weight"].reshape(G, di // G), hp.eps).reshape(T, di)
    return y @ t[p + "ssm_out.weight"].T


def arch_logits(meta, t, ids, return_hparams=False, ggml_gelu=False, act_q8=()):
    """Logits [len(ids), n_vocab] in float64.  ggml_gelu=True imitates ggml's fp16-table GELU.
    act_q8: names of gpt-oss expert weights (blk.N.ffn_*_exps.weight) whose inputs are rounded to
    Q8_0 activations (q8_0_round) first, as an engine multiplying MXFP4 experts does."""
    x, hp = arch_hidden(meta, t, ids, return_hparams=True, ggml_gelu=ggml_gelu, act_q8=act_q8)
    out = t.get("output.weight", t["token_embd.weight"])
    logits = x @ out.T
    if hp.final_softcap:
        logits = hp.final_softcap * np.tanh(logits / hp.final_softcap)
    if getattr(hp, "logit_scale", 0.0):
        logits = logits / hp.logit_scale
    return (logits, hp) if return_hparams else logits


def _deepseek2_moe(meta, t, p, h):
    """DeepSeek-V2/V3 routed + shared experts, as llama.cpp's build_moe_ffn for deepseek2:
    softmax (V2) or sigmoid (V3) probabilities; the selection adds exp_probs_b and, with expert
    groups, keeps the expert_group_used_count groups whose two best experts score highest; the
    top k by selection, weighted by their probabilities (renormalised when expert_weights_norm,
    times expert_weights_scale); plus the shared experts (one SwiGLU, unscaled)."""
    g = lambda k, d=None: meta.get(f"deepseek2.{k}", d)  # noqa: E731
    k, gating = g("expert_used_count"), g("expert_gating_func", 1)
    n_groups, g_used = g("expert_group_count", 0), g("expert_group_used_count", 0)
    logits = h @ t[p + "ffn_gate_inp.weight"].T                  # [T, n_expert]
    if gating == 2:
        probs = 1.0 / (1.0 + np.exp(-logits))
    else:
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
    sel_score = probs + t[p + "exp_probs_b.bias"] if p + "exp_probs_b.bias" in t else probs.copy()
    T, NE = probs.shape
    if n_groups > 1:
        per = NE // n_groups
        grp = np.sort(sel_score.reshape(T, n_groups, per), axis=-1)[..., -2:].sum(-1)   # [T, G]
        keep = np.argsort(-grp, axis=-1, kind="stable")[:, :g_used]
        mask = np.full((T, n_groups), -np.inf)
        np.put_along_axis(mask, keep, 0.0, -1)
        sel_score = sel_score + np.repeat(mask, per, axis=-1)
    sel = np.argsort(-sel_score, axis=-1, kind="stable")[:, :k]
    wts = np.take_along_axis(probs, sel, -1)
    if g("expert_weights_norm", False):
        wts = wts / np.maximum(wts.sum(-1, keepdims=True), 6.103515625e-5)
    if g("expert_weights_scale", 0.0):
        wts = wts * g("expert_weights_scale")
    gw, uw, dw = (t[p + f"ffn_{n}_exps.weight"] for n in ("gate", "up", "down"))
    out = np.zeros_like(h)
    for ti in range(T):
        for j in range(k):
            e = sel[ti, j]
            out[ti] += wts[ti, j] * (dw[e] @ (_silu(gw[e] @ h[ti]) * (uw[e] @ h[ti])))
    if p + "ffn_gate_shexp.weight" in t:
        out = out + (_silu(h @ t[p + "ffn_gate_shexp.weight"].T) * (h @ t[p + "ffn_up_shexp.weight"].T)) \
            @ t[p + "ffn_down_shexp.weight"].T
    return out


def _deepseek2_hidden(meta, t, ids):
    """DeepSeek-V2/V3 multi-head latent attention in the plain, non-absorbed form: K and V of every
    head decompressed from the normalised latent (k_nope_h = k_b_h^T c, v_h = v_b_h c), the roped
    shared key appended to every head's key, ordinary causal softmax attention.  YaRN as llama.cpp
    runs deepseek2: the rotation at unit magnitude and the scores scaled by mscale^2 / sqrt(dk),
    mscale = 1 + 0.1 * mscale_all_dim * ln(factor) (mscale_all_dim = yarn_log_multiplier / 0.1)."""
    g = lambda k, d=None: meta.get(f"deepseek2.{k}", d)  # noqa: E731
    E, L, H = g("embedding_length"), g("block_count"), g("attention.head_count")
    eps = g("attention.layer_norm_rms_epsilon", 1e-6)
    C, R = g("attention.kv_lora_rank"), g("rope.dimension_count")
    dk, dv = g("attention.key_length_mla"), g("attention.value_length_mla")
    nope = dk - R
    base = g("rope.freq_base", 10000.0)
    yarn, fs, mscale = None, 1.0, 1.0
    if g("rope.scaling.type", "none") == "yarn":
        f = g("rope.scaling.factor")
        fs = 1.0 / f
        log_mul = g("rope.scaling.yarn_log_multiplier", 0.0) / 0.1
        lnf = math.log(f)
        attn_factor = (1.0 if log_mul else 1.0 + 0.1 * lnf) / (1.0 + 0.1 * lnf)
        n_orig = g("rope.scaling.original_context_length", 0) or g("context_length")
        yarn = dict(n_orig=n_orig, ext_factor=1.0, attn_factor=attn_factor)
        mscale = attn_factor * (1.0 + 0.1 * lnf) * (1.0 + 0.1 * log_mul * lnf)
    q_scale = mscale * mscale / math.sqrt(dk)
    ids = list(ids)
    T = len(ids)
    pos = np.arange(T, dtype=np.float64)
    causal = np.arange(T)[None, :] <= np.arange(T)[:, None]
    x = t["token_embd.weight"][ids].copy()
    for il in range(L):
        p = f"blk.{il}."
        h = _rms(x, t[p + "attn_norm.weight"], eps)
        if p + "attn_q_a.weight" in t:
            q = _rms(h @ t[p + "attn_q_a.weight"].T, t[p + "attn_q_a_norm.weight"], eps) @ t[p + "attn_q_b.weight"].T
        else:
            q = h @ t[p + "attn_q.weight"].T
        q = q.reshape(T, H, dk)
        kva = h @ t[p + "attn_kv_a_mqa.weight"].T                                  # [T, C + R]
        c = _rms(kva[:, :C], t[p + "attn_kv_a_norm.weight"], eps)                   # [T, C]
        k_pe = _rope(kva[:, None, C:], pos, R, base, fs, False, None, yarn)         # [T, 1, R]
        q_pe = _rope(q[..., nope:], pos, R, base, fs, False, None, yarn)            # [T, H, R]
        kb, vb = t[p + "attn_k_b.weight"], t[p + "attn_v_b.weight"]               # [H, C, nope], [H, dv, C]
        k_nope = np.einsum("hcd,tc->thd", kb, c)
        v = np.einsum("hjc,tc->thj", vb, c)
        k = np.concatenate([k_nope, np.repeat(k_pe, H, axis=1)], -1)                # [T, H, dk]
        qf = np.concatenate([q[..., :nope], q_pe], -1)
        s = np.einsum("thd,shd->hts", qf, k) * q_scale
        s = np.where(causal[None], s, -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", s, v).reshape(T, H * dv)
        x = x + o @ t[p + "attn_output.weight"].T
        h = _rms(x, t[p + "ffn_norm.weight"], eps)
        if il < g("leading_dense_block_count", 0):
            f = (_silu(h @ t[p + "ffn_gate.weight"].T) * (h @ t[p + "ffn_up.weight"].T)) @ t[p + "ffn_down.weight"].T
        else:
            f = _deepseek2_moe(meta, t, p, h)
        x = x + f
    return _rms(x, t["output_norm.weight"], eps)


def _ln(x, w, b, eps):
    """LayerNorm over the last axis (ggml_norm, then weight and bias; w None: the norm alone)."""
    m = x.mean(axis=-1, keepdims=True)
    y = (x - m) / np.sqrt(((x - m) ** 2).mean(axis=-1, keepdims=True) + eps)
    return y if w is None else y * w + b


def _rwkv7_hidden(meta, t, ids):
    """RWKV-7 as llama.cpp's llm_build_rwkv7 (float64, from a zero state): LayerNorm'd
    embeddings; per layer a time mix (token shift with the six lerp_fused mixes r w k v a g, the
    LoRAs, the WKV-7 recurrence per head S = S diag(w) + v k^T + (S a) b^T with a = -kk,
    b = kk * iclr, y = S r, the group norm, the bonus v (r . k r_k) per head, the gate) and a
    channel mix (token shift, squared ReLU), each added to the residual stream; layer 0's v is
    mixed into the later layers' v (value residual)."""
    g = lambda k, d=None: meta.get(f"rwkv7.{k}", d)  # noqa: E731
    E, L, N, eps = g("embedding_length"), g("block_count"), g("wkv.head_size"), g("attention.layer_norm_epsilon", 1e-5)
    H = E // N
    sig = lambda v: 1.0 / (1.0 + np.exp(-v))  # noqa: E731
    T = len(ids)
    x = t["token_embd.weight"][list(ids)].copy()
    x = _ln(x, t["token_embd_norm.weight"], t["token_embd_norm.bias"], eps)

    def shift(h):
        return np.vstack([np.zeros((1, E)), h[:-1]])

    v_first = None
    for il in range(L):
        p = f"blk.{il}."
        W = lambda n: t[p + n + ".weight"]  # noqa: E731
        xn = _ln(x, W("attn_norm"), t[p + "attn_norm.bias"], eps)
        sx = shift(xn) - xn
        lerp = W("time_mix_lerp_fused").reshape(6, E)
        xr, xw, xk, xv, xa, xg = (xn + sx * lerp[i] for i in range(6))
        r = xr @ W("time_mix_receptance").T
        w = np.tanh(xw @ W("time_mix_w1").T) @ W("time_mix_w2").T + W("time_mix_w0").reshape(-1)
        w = np.exp(-0.606531 * sig(w))
        k = xk @ W("time_mix_key").T
        v = xv @ W("time_mix_value").T
        if v_first is None:
            v_first = v
        else:
            mix = sig((xv @ W("time_mix_v1").T) @ W("time_mix_v2").T + W("time_mix_v0").reshape(-1))
            v = v + (v_first - v) * mix
        gate = sig(xg @ W("time_mix_g1").T) @ W("time_mix_g2").T
        a = sig((xa @ W("time_mix_a1").T) @ W("time_mix_a2").T + W("time_mix_a0").reshape(-1))
        kk = (k * W("time_mix_k_k").reshape(-1)).reshape(T, H, N)
        kk = kk / np.maximum(np.linalg.norm(kk, axis=-1, keepdims=True), 1e-12)
        kk = kk.reshape(T, E)
        ka = k * W("time_mix_k_a").reshape(-1)
        k = k + a * ka - ka
        S = np.zeros((H, N, N))
        y = np.zeros((T, E))
        for tt in range(T):
            rh, wh, kh, vh = (z[tt].reshape(H, N) for z in (r, w, k, v))
            ah, bh = (-kk[tt]).reshape(H, N), (kk[tt] * a[tt]).reshape(H, N)
            sa = np.einsum("hij,hj->hi", S, ah)
            S = S * wh[:, None, :] + vh[:, :, None] * kh[:, None, :] + sa[:, :, None] * bh[:, None, :]
            y[tt] = np.einsum("hij,hj->hi", S, rh).reshape(E)
        y = _ln(y.reshape(T, H, N), None, None, 64e-5).reshape(T, E)
        y = y * W("time_mix_ln").reshape(-1) + t[p + "time_mix_ln.bias"]
        rk = (k * r * W("time_mix_r_k").reshape(-1)).reshape(T, H, N).sum(-1, keepdims=True)
        y = y + (v.reshape(T, H, N) * rk).reshape(T, E)
        y = y * gate
        x = x + y @ W("time_mix_output").T
        fn = _ln(x, W("attn_norm_2"), t[p + "attn_norm_2.bias"], eps)
        xk = fn + (shift(fn) - fn) * W("channel_mix_lerp_k").reshape(-1)
        hdn = np.maximum(xk @ W("channel_mix_key").T, 0.0) ** 2
        x = x + hdn @ W("channel_mix_value").T
    return _ln(x, t["output_norm.weight"], t["output_norm.bias"], eps)


def _rwkv6_hidden(meta, t, ids):
    """RWKV-6 as llama.cpp's llm_build_rwkv6 (float64, from a zero state): LayerNorm'd embeddings;
    per layer a time mix (token shift: xx = xn + sx lerp_x, then the five data-dependent mixes
    x? = xn + sx (lerp_fused[?] + time_mix_w2[?] tanh(time_mix_w1 xx)) in the order w k v r g;
    r, k, v, silu(gate); the decay w = exp(-exp(time_mix_decay + decay_w2 tanh(decay_w1 x_w)));
    the WKV-6 recurrence per head y = r (S + u k v^T), S = diag(w) S + k v^T with u time_mix_first;
    the group norm, ln_x, times the gate) and a channel mix (token shift with lerp_k / lerp_r,
    sigmoid(receptance) times value of the squared ReLU of key), each added to the residual
    stream; the stream halved after every rescale_every_n_layers-th layer."""
    g = lambda k, d=None: meta.get(f"rwkv6.{k}", d)  # noqa: E731
    E, L, N, eps = g("embedding_length"), g("block_count"), g("wkv.head_size"), g("attention.layer_norm_epsilon", 1e-5)
    D, every = g("time_mix_extra_dim"), g("rescale_every_n_layers", 0)
    H = E // N
    sig = lambda v: 1.0 / (1.0 + np.exp(-v))  # noqa: E731
    T = len(ids)
    x = t["token_embd.weight"][list(ids)].copy()
    x = _ln(x, t["token_embd_norm.weight"], t["token_embd_norm.bias"], eps)

    def shift(h):
        return np.vstack([np.zeros((1, E)), h[:-1]])

    for il in range(L):
        p = f"blk.{il}."
        W = lambda n: t[p + n + ".weight"]  # noqa: E731
        V = lambda n: t[p + n + ".weight"].reshape(-1)  # noqa: E731
        xn = _ln(x, V("attn_norm"), t[p + "attn_norm.bias"], eps)
        sx = shift(xn) - xn
        xx = xn + sx * V("time_mix_lerp_x")
        lo = np.tanh(xx @ W("time_mix_w1").T)                   # [T, 5 D]
        w2 = W("time_mix_w2")                                    # numpy [5, E, D]
        lerp = W("time_mix_lerp_fused").reshape(5, E)
        xw, xk, xv, xr, xg = (xn + sx * (lo[:, m * D:(m + 1) * D] @ w2[m].T + lerp[m]) for m in range(5))
        r = xr @ W("time_mix_receptance").T
        k = xk @ W("time_mix_key").T
        v = xv @ W("time_mix_value").T
        gz = xg @ W("time_mix_gate").T
        gate = gz * sig(gz)
        w = np.exp(-np.exp(np.tanh(xw @ W("time_mix_decay_w1").T) @ W("time_mix_decay_w2").T + V("time_mix_decay")))
        u = W("time_mix_first").reshape(H, N)
        S = np.zeros((H, N, N))                                  # [head][key channel i][value channel j]
        y = np.zeros((T, E))
        for tt in range(T):
            rh, kh, vh, wh = (z[tt].reshape(H, N) for z in (r, k, v, w))
            kv = kh[:, :, None] * vh[:, None, :]
            y[tt] = np.einsum("hi,hij->hj", rh, S + u[:, :, None] * kv).reshape(E)
            S = S * wh[:, :, None] + kv
        y = _ln(y.reshape(T, H, N), None, None, 64e-5).reshape(T, E)
        y = (y * V("time_mix_ln") + t[p + "time_mix_ln.bias"]) * gate
        x = x + y @ W("time_mix_output").T
        fn = _ln(x, V("attn_norm_2"), t[p + "attn_norm_2.bias"], eps)
        sf = shift(fn) - fn
        xk = fn + sf * V("channel_mix_lerp_k")
        xr = fn + sf * V("channel_mix_lerp_r")
        hdn = np.maximum(xk @ W("channel_mix_key").T, 0.0) ** 2
        x = x + sig(xr @ W("channel_mix_receptance").T) * (hdn @ W("channel_mix_value").T)
        if every and (il + 1) % every == 0:
            x = x * 0.5
    return _ln(x, t["output_norm.weight"], t["output_norm.bias"], eps)


class _Rwkv6Hp:
    def __init__(self):
        self.final_softcap = 0.0
        self.arch = "rwkv6"


class _Rwkv7Hp:
    def __init__(self):
        self.final_softcap = 0.0
        self.arch = "rwkv7"


class _Deepseek2Hp:
    def __init__(self):
        self.final_softcap = 0.0
        self.arch = "deepseek2"


class _GraniteHybridHp:
    """Granite 4.0-H's sizes: the Mamba-2 ones (for _mamba2_mixer), the attention ones, the scales."""
    def __init__(self, meta):
        a = self.arch = "granitehybrid"
        g = lambda k, d=None: meta.get(f"{a}.{k}", d)  # noqa: E731
        self.E, self.L = g("embedding_length"), g("block_count")
        self.eps = g("attention.layer_norm_rms_epsilon", 1e-5)
        self.d_conv, self.d_inner, self.d_state = g("ssm.conv_kernel"), g("ssm.inner_size"), g("ssm.state_size")
        self.dt_rank, self.n_group = g("ssm.time_step_rank"), g("ssm.group_count")
        self.H = g("attention.head_count")
        hkv = g("attention.head_count_kv")
        self.Hkv = hkv if isinstance(hkv, list) else [hkv] * self.L
        self.hd = g("attention.key_length", self.E // self.H)
        if g("rope.scaling.finetuned", True):
            raise ValueError("granitehybrid with RoPE (rope.scaling.finetuned true) is not supported by this oracle")
        self.q_scale = g("attention.scale", 0.0) or 1.0 / math.sqrt(self.hd)
        self.embd_scale = g("embedding_scale", 0.0)
        self.residual_scale = g("residual_scale", 0.0)
        self.logit_scale = g("logit_scale", 0.0)
        self.n_expert_used = g("expert_used_count", 0)
        self.moe_norm_w = True
        self.final_softcap = 0.0


def _granitehybrid_hidden(meta, t, ids):
    hp = _GraniteHybridHp(meta)
    ids = list(ids)
    T = len(ids)
    causal = np.arange(T)[None, :] <= np.arange(T)[:, None]
    rs = hp.residual_scale or 1.0
    x = t["token_embd.weight"][ids].copy()
    if hp.embd_scale:
        x = x * hp.embd_scale
    for il in range(hp.L):
        p = f"blk.{il}."
        h = _rms(x, t[p + "attn_norm.weight"], hp.eps)
        if hp.Hkv[il] == 0:
            o = _mamba2_mixer(hp, t, p, h)
        else:
            H, Hkv, hd = hp.H, hp.Hkv[il], hp.hd
            q = (h @ t[p + "attn_q.weight"].T).reshape(T, H, hd)
            k = np.repeat((h @ t[p + "attn_k.weight"].T).reshape(T, Hkv, hd), H // Hkv, axis=1)
            v = np.repeat((h @ t[p + "attn_v.weight"].T).reshape(T, Hkv, hd), H // Hkv, axis=1)
            s = np.einsum("thd,shd->hts", q, k) * hp.q_scale
            s = np.where(causal[None], s, -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = np.einsum("hts,shd->thd", s, v).reshape(T, H * hd) @ t[p + "attn_output.weight"].T
        x = x + rs * o
        h = _rms(x, t[p + "ffn_norm.weight"], hp.eps)
        if p + "ffn_gate_inp.weight" in t:
            f = _moe(hp, t, p, h)
            if p + "ffn_gate_shexp.weight" in t and p + "ffn_gate_inp_shexp.weight" not in t:  # ungated
                f = f + (_silu(h @ t[p + "ffn_gate_shexp.weight"].T) * (h @ t[p + "ffn_up_shexp.weight"].T)) \
                    @ t[p + "ffn_down_shexp.weight"].T
        else:
            f = (_silu(h @ t[p + "ffn_gate.weight"].T) * (h @ t[p + "ffn_up.weight"].T)) @ t[p + "ffn_down.weight"].T
        x = x + rs * f
    return _rms(x, t["output_norm.weight"], hp.eps), hp


class _Qwen3NextHp:
    """Qwen3-Next's sizes: the attention ones, the gated delta-net ones, the layer kinds."""
    def __init__(self, meta):
        a = self.arch = "qwen3next"
        g = lambda k, d=None: meta.get(f"{a}.{k}", d)  # noqa: E731
        self.E, self.L = g("embedding_length"), g("block_count") - g("nextn_predict_layers", 0)
        self.eps = g("attention.layer_norm_rms_epsilon", 1e-6)
        self.H, self.Hkv = g("attention.head_count"), g("attention.head_count_kv")
        self.hd = g("attention.key_length", self.E // self.H)
        self.n_rot = g("rope.dimension_count", self.hd)
        self.base = g("rope.freq_base", 10000.0)
        self.S, self.Hk, self.Hv = g("ssm.state_size"), g("ssm.group_count"), g("ssm.time_step_rank")
        self.d_conv = g("ssm.conv_kernel")
        rec = g("attention.recurrent_layers")
        if rec is not None:
            self.recurrent = [bool(v) for v in rec[:self.L]]
        else:
            n = g("full_attention_interval", 4)
            self.recurrent = [(il + 1) % n != 0 for il in range(self.L)]
        self.n_expert_used = g("expert_used_count", 0)
        self.moe_norm_w = True
        self.final_softcap = 0.0


def _l2norm(x, eps):
    return x / np.maximum(np.sqrt((x * x).sum(-1, keepdims=True)), eps)


def _delta_net_mixer(hp, t, p, h):
    """One gated delta-net mixer on the normalised input h [T, n_embd] -> [T, n_embd] (before the
    residual add), as llama.cpp's build_layer_attn_linear from a zero state."""
    T = h.shape[0]
    S, Hk, Hv, dc = hp.S, hp.Hk, hp.Hv, hp.d_conv
    r, kd = Hv // Hk, Hk * S
    C = 2 * kd + Hv * S
    if p + "attn_qkv.weight" in t:
        qkv = h @ t[p + "attn_qkv.weight"].T
        z = h @ t[p + "attn_gate.weight"].T
    else:  # older converters: ssm_in, per key head q, k, v (r heads), z (r heads)
        m = (h @ t[p + "ssm_in.weight"].T).reshape(T, Hk, 2 * S + 2 * r * S)
        qkv = np.concatenate([m[..., :S].reshape(T, -1), m[..., S:2 * S].reshape(T, -1),
                              m[..., 2 * S:2 * S + r * S].reshape(T, -1)], -1)
        z = m[..., 2 * S + r * S:].reshape(T, -1)
    ba = (h @ t[p + "ssm_ba.weight"].T).reshape(T, Hk, 2 * r)
    b, a = ba[..., :r].reshape(T, Hv), ba[..., r:].reshape(T, Hv)
    w = t[p + "ssm_conv1d.weight"].reshape(C, dc)                 # tap 0 = the oldest step
    padded = np.concatenate([np.zeros((dc - 1, C)), qkv], 0)
    conv = np.zeros((T, C))
    for k in range(dc):
        conv += padded[k:k + T] * w[:, k]
    x = _silu(conv)
    q = np.repeat(_l2norm(x[:, :kd].reshape(T, Hk, S), hp.eps), r, axis=1)        # [T, Hv, S]
    k = np.repeat(_l2norm(x[:, kd:2 * kd].reshape(T, Hk, S), hp.eps), r, axis=1)
    v = x[:, 2 * kd:].reshape(T, Hv, S)
    beta = 1.0 / (1.0 + np.exp(-b))
    gl = _softplus(a + t[p + "ssm_dt.bias"]) * t[p + "ssm_a"].reshape(Hv)           # [T, Hv] log decay
    M = np.zeros((Hv, S, S))                                       # [head, value j, key i]
    y = np.zeros((T, Hv, S))
    for ti in range(T):
        M = M * np.exp(gl[ti])[:, None, None]
        d = (v[ti] - np.einsum("hji,hi->hj", M, k[ti])) * beta[ti][:, None]
        M = M + d[:, :, None] * k[ti][:, None, :]
        y[ti] = np.einsum("hji,hi->hj", M, q[ti]) / math.sqrt(S)
    y = _rms(y, t[p + "ssm_norm.weight"], hp.eps) * _silu(z.reshape(T, Hv, S))
    return y.reshape(T, Hv * S) @ t[p + "ssm_out.weight"].T


def _qwen3next_hidden(meta, t, ids):
    hp = _Qwen3NextHp(meta)
    ids = list(ids)
    T = len(ids)
    pos = np.arange(T, dtype=np.float64)
    causal = np.arange(T)[None, :] <= np.arange(T)[:, None]
    x = t["token_embd.weight"][ids].copy()
    for il in range(hp.L):
        p = f"blk.{il}."
        h = _rms(x, t[p + "attn_norm.weight"], hp.eps)
        if hp.recurrent[il]:
            o = _delta_net_mixer(hp, t, p, h)
        else:
            H, Hkv, hd = hp.H, hp.Hkv, hp.hd
            qg = (h @ t[p + "attn_q.weight"].T).reshape(T, H, 2 * hd)
            q, gate = qg[..., :hd], qg[..., hd:]
            q = _rms(q, t[p + "attn_q_norm.weight"], hp.eps)
            k = _rms((h @ t[p + "attn_k.weight"].T).reshape(T, Hkv, hd), t[p + "attn_k_norm.weight"], hp.eps)
            v = (h @ t[p + "attn_v.weight"].T).reshape(T, Hkv, hd)
            q = _rope(q, pos, hp.n_rot, hp.base, 1.0, True)
            k = _rope(k, pos, hp.n_rot, hp.base, 1.0, True)
            k, v = np.repeat(k, H // Hkv, axis=1), np.repeat(v, H // Hkv, axis=1)
            s = np.einsum("thd,shd->hts", q, k) / math.sqrt(hd)
            s = np.where(causal[None], s, -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = np.einsum("hts,shd->thd", s, v) / (1.0 + np.exp(-gate))
            o = o.reshape(T, H * hd) @ t[p + "attn_output.weight"].T
        x = x + o
        x = x + _moe(hp, t, p, _rms(x, t[p + "post_attention_norm.weight"], hp.eps))
    return _rms(x, t["output_norm.weight"], hp.eps), hp


def arch_hidden(meta, t, ids, return_hparams=False, ggml_gelu=False, act_q8=()):
    """Final hidden states [len(ids), n_embd] in float64: the last layer's residual stream after
    the output norm, before the output projection (what llama.cpp's embeddings are for a
    decoder model)."""
    if meta["general.architecture"] == "deepseek2":
        x = _deepseek2_hidden(meta, t, ids)
        return (x, _Deepseek2Hp()) if return_hparams else x
    if meta["general.architecture"] == "granitehybrid":
        x, hp = _granitehybrid_hidden(meta, t, ids)
        return (x, hp) if return_hparams else x
    if meta["general.architecture"] == "qwen3next":
        x, hp = _qwen3next_hidden(meta, t, ids)
        return (x, hp) if return_hparams else x
    if meta["general.architecture"] == "rwkv7":
        x = _rwkv7_hidden(meta, t, ids)
        return (x, _Rwkv7Hp()) if return_hparams else x
    if meta["general.architecture"] == "rwkv6":
        x = _rwkv6_hidden(meta, t, ids)
        return (x, _Rwkv6Hp()) if return_hparams else x
    hp = Hparams(meta)
    if hp.mamba:
        if act_q8:
            raise ValueError("act_q8: this oracle rounds activations only for gpt-oss experts")
        x = t["token_embd.weight"][list(ids)].copy()
        for il in range(hp.L):
            p = f"blk.{il}."
            mixer = _mamba2_mixer if hp.mamba2 else _mamba_mixer
            x = x + mixer(hp, t, p, _rms(x, t[p + "attn_norm.weight"], hp.eps))
        x = _rms(x, t["output_norm.weight"], hp.eps)
        return (x, hp) if return_hparams else x
    emulated = {f"blk.{il}.ffn_{n}_exps.weight" for il in range(hp.L) for n in ("gate", "up", "down")} \
        if hp.gpt_oss else set()
    if set(act_q8) - emulated:
        raise ValueError(f"act_q8: this oracle rounds activations only for gpt-oss experts, not "
                         f"{sorted(set(act_q8) - emulated)[:3]}")
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
        q = _rope(q, pos, hp.n_rot, base, fscale, hp.neox, freq_factors, hp.yarn)
        k = _rope(k, pos, hp.n_rot, base, fscale, hp.neox, freq_factors, hp.yarn)
        rep = H // Hkv
        k = np.repeat(k, rep, axis=1)
        v = np.repeat(v, rep, axis=1)
        s = np.einsum("thd,shd->hts", q, k) * hp.q_scale
        if hp.attn_softcap:
            s = hp.attn_softcap * np.tanh(s / hp.attn_softcap)
        allowed = causal & ((qi - kj) < hp.n_swa) if swa else causal
        s = np.where(allowed[None], s, -np.inf)
        if p + "attn_sinks.weight" in t:  # gpt-oss: one value-less logit per head in the normaliser
            sink = t[p + "attn_sinks.weight"].reshape(H)[:, None, None]            # [H, 1, 1]
            m = np.maximum(s.max(-1, keepdims=True), sink)
            s = np.exp(s - m)
            s /= s.sum(-1, keepdims=True) + np.exp(sink - m)
        else:
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", s, v).reshape(T, H * hdv)
        o = o @ t[p + "attn_output.weight"].T
        if p + "attn_output.bias" in t:
            o = o + t[p + "attn_output.bias"]
        if p + "post_attention_norm.weight" in t and not hp.gpt_oss:
            o = _rms(o, t[p + "post_attention_norm.weight"], eps)
        x = x + o
        # gpt-oss names its FFN input norm post_attention_norm (and has no ffn_norm)
        h = _rms(x, t[p + ("post_attention_norm.weight" if hp.gpt_oss else "ffn_norm.weight")], eps)
        if hp.gpt_oss:
            f = _moe_gpt_oss(hp, t, p, h, act_q8)
        elif p + "ffn_gate_inp.weight" in t:
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
