"""Tiny random GGUF models for every architecture tern supports, written the way llama.cpp's
convert_hf_to_gguf.py writes real ones (key names, tensor names, ggml dimension order, tied or
untied output, F32 tensors).  An independent writer: shares no code with tern's `tern synth`.

What it checks: nothing by itself; it feeds the numpy oracle (arch_np.py), the llama.cpp peer
(tests/models/peer/peer_logits.mjs) and the tern harnesses (test_arch_*.py).

Run:
    python3 tests/py/arch_tiny_models.py --list
    python3 tests/py/arch_tiny_models.py --shape gemma3-tiny -o /tmp/g3.gguf
    python3 tests/py/arch_tiny_models.py --all -o /tmp/tiny      # one NAME.gguf per shape

Shapes (all f32, vocab 320 SPM-style with byte tokens, 2-6 layers, GQA unless said):
    qwen2-tiny     q/k/v biases, tied output
    qwen2moe-tiny  4 experts top-2 (no renorm) + shared expert with sigmoid gate, q/k/v biases
    qwen3-tiny     key_length 32 != n_embd/n_head, per-head q_norm/k_norm, tied output
    qwen3moe-tiny  4 experts top-2 (renormalised), expert_feed_forward_length, q/k norm
    llama3-tiny    rope_freqs.weight (Llama-3 frequency factors), rope NORM, untied
    mixtral-tiny   arch llama, 4 experts top-2 (renormalised)
    phi3-tiny      fused attn_qkv, fused ffn_up (gate half first), untied, sliding_window 16
                   (which llama.cpp ignores: phi3 SWA is disabled there)
    gemma2-tiny    3 layers: sliding (even) / global (odd), window 8, attn + final softcaps,
                   post-attention / post-ffw norms, key_length 32, GeGLU, tied
    gemma3-tiny    6 layers: 0-4 local (window 8, rope base 10000, no scaling), 5 global
                   (freq_base 1e6, linear rope scaling x8), q/k norms, no softcaps, tied,
                   key_length 16 != n_embd/n_head 32, MQA (1 kv head)
    gpt-oss-tiny   3 layers: sliding (even, window 16) / global (odd), attention sinks, q/k/v/o
                   biases, YaRN rope (x4 over an original context of 64, base 150000), key_length
                   32 (n_head*hd 128 != n_embd 64), 4 experts top-2 with biases (router bias,
                   softmax over the chosen 2, clamped SwiGLU), post_attention_norm as the ffn
                   norm, untied; experts as F32 3-D tensors (the released model's are MXFP4)
    mamba-tiny     Mamba-1, 3 layers, no attention: d_inner 128, d_state 16, d_conv 4, dt_rank 8,
                   ssm_a / ssm_d without ".weight", dt_b_c_rms false, tied, context 1048576
    mamba2-tiny    Mamba-2, 3 layers: d_inner 128 in 8 heads of 16, 2 B/C groups (4 heads each),
                   d_state 16, d_conv 4; ssm_a / ssm_d [1, n_head], ssm_norm [d_inner/2, 2]; tied
    deepseek2-tiny DeepSeek-V2 latent attention, 3 layers: 4 heads, q_lora 32, kv_lora 32, nope 16 +
                   rope 16, v 24 (attn_k_b / attn_v_b split from kv_b as the converter does), YaRN x4
                   over 64 with mscale_all_dim 0.707; layer 0 dense, then 4 experts top-2 (softmax,
                   scale 1) + 1 shared; untied
    deepseek2-lite-tiny  V2-Lite's attention: no query compression (attn_q), 2 layers, 2 shared
                   experts (numpy oracle only: see ORACLE_ONLY_SHAPES)
    deepseek3-tiny the same attention (v 16, no YaRN) with V3's routing: 8 sigmoid experts with
                   exp_probs_b, 4 groups (2 kept), top-2 renormalised, scale 2.5
    granitehybrid-tiny  Granite 4.0-H, 4 layers: Mamba-2 (0, 2: d_inner 128 in 8 heads of 16, one
                   group, d_state 16, d_conv 4) and attention (1, 3: 4 heads of 16 over 2 KV heads,
                   head_count_kv [0, 2, 0, 2], no RoPE: rope.scaling.finetuned false); 4 experts top-2
                   of 32 + an ungated shared expert of 48; embedding x12, residual x0.22, attention
                   scale 0.125, logits / 6; tied, context 1048576
    granitehybrid-dense-tiny  the same with a dense SwiGLU FFN of 96 (granite-4.0-h-micro's kind),
                   layers attention, Mamba-2, Mamba-2, attention
    qwen3next-tiny Qwen3-Next, 4 layers: gated delta-net (0, 2: 2 key heads and 4 value heads of 32,
                   d_conv 4; attn_qkv + attn_gate, ssm_ba, ssm_a = -exp(A_log) [4], ssm_norm [32]) and gated
                   attention (1, 3: full_attention_interval 2; attn_q [2 x 4 heads of 32] query + gate,
                   2 KV heads, q/k norms, NeoX RoPE on 8 of 32 channels, base 1e7); 4 experts top-2 of 32
                   + a shared expert of 48 with its sigmoid gate [64, 1]; post_attention_norm; untied
    rwkv7-tiny     RWKV-7, 3 layers: n_embd 128 in 2 WKV heads of 64, LoRA ranks 32 / 24 / 16 / 40
                   (decay, iclr, value residual, gate), FFN 224, LayerNorms with biases, untied
    rwkv6-tiny     RWKV-6, 3 layers: n_embd 128 in 2 WKV heads of 64, time_mix_extra_dim 16,
                   time_decay_extra_dim 24, FFN 448, rescale_every_n_layers 2, LayerNorms with
                   biases, untied
Weights are scaled so that logits are decisive (top-1 minus top-2 > 0.01 at ~97-100% of
positions) and greedy continuations do not just repeat one token.  The phi3 vocabulary holds
<|endoftext|>: llama.cpp looks it up whenever general.name contains "phi3".
"""
import argparse
import math
import os
import struct
import sys

import numpy as np

GGUF_ALIGN = 32

# GGUF value types
T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR = 4, 5, 6, 7, 8, 9


# ----------------------------------------------------------------------------- GGUF writing
def _gguf_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _gguf_value(t, v):
    if t == T_U32:
        return struct.pack("<I", v)
    if t == T_I32:
        return struct.pack("<i", v)
    if t == T_F32:
        return struct.pack("<f", v)
    if t == T_BOOL:
        return struct.pack("<?", v)
    if t == T_STR:
        return _gguf_str(v)
    raise ValueError(t)


def write_gguf(path, kvs, tensors):
    """kvs: list of (key, type, value) where value of an array is (elem_type, list).
    tensors: list of (name, numpy array). The numpy shape is the reverse of ggml's ne."""
    out = bytearray(b"GGUF")
    out += struct.pack("<IQQ", 3, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += _gguf_str(k) + struct.pack("<I", t)
        if t == T_ARR:
            et, items = v
            out += struct.pack("<IQ", et, len(items))
            for it in items:
                out += _gguf_value(et, it)
        else:
            out += _gguf_value(t, v)
    blobs, off = [], 0
    for name, arr in tensors:
        a = np.ascontiguousarray(arr, dtype="<f4")
        ne = list(reversed(a.shape))
        out += _gguf_str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        out += struct.pack("<IQ", 0, off)  # type 0 = F32
        b = a.tobytes()
        pad = (-len(b)) % GGUF_ALIGN
        blobs.append(b + b"\0" * pad)
        off += len(b) + pad
    out += b"\0" * ((-len(out)) % GGUF_ALIGN)
    for b in blobs:
        out += b
    with open(path, "wb") as f:
        f.write(out)


# ----------------------------------------------------------------------------- vocabulary
def spm_vocab(n_vocab, gemma=False, extra_control=()):
    """A SentencePiece-style ('llama' tokenizer model) vocabulary: specials, the 256 byte
    tokens <0x00>..<0xFF> (llama.cpp needs <0x0A> for the newline token), then whole pieces."""
    if gemma:  # gemma's order: pad, eos, bos, unk
        specials = [("<pad>", 3), ("<eos>", 3), ("<bos>", 3), ("<unk>", 2)]
        ids = dict(pad=0, eos=1, bos=2, unk=3)
    else:
        specials = [("<unk>", 2), ("<s>", 3), ("</s>", 3)]
        ids = dict(unk=0, bos=1, eos=2)
    specials += [(s, 3) for s in extra_control]
    toks = [s for s, _ in specials]
    types = [ty for _, ty in specials]
    for b in range(256):
        toks.append(f"<0x{b:02X}>")
        types.append(6)  # BYTE
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    pieces = ["\u2581"] + ["\u2581" + c for c in letters] + list(letters)
    pieces += ["th", "he", "in", "er", "an", "re", "on", "at", "en", "nd", "ti", "es", "or", "te"]
    for p in pieces:
        if len(toks) >= n_vocab:
            break
        toks.append(p)
        types.append(1)
    k = 0
    while len(toks) < n_vocab:  # filler pieces
        toks.append(f"\u2581w{k}")
        types.append(1)
        k += 1
    scores = [0.0] * len(specials) + [-1000.0] * 256 + [-float(i) for i in range(len(toks) - len(specials) - 256)]
    return toks, scores, types, ids


# ----------------------------------------------------------------------------- shapes
SHAPES = {
    "qwen2-tiny": dict(arch="qwen2", n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=128,
                       rope_base=1e6, eps=1e-6, qkv_bias=True, tied=True, ctx=512),
    "qwen2moe-tiny": dict(arch="qwen2moe", n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=128,
                          n_expert=4, n_expert_used=2, n_ff_exp=32, n_ff_shexp=64,
                          rope_base=1e6, eps=1e-6, qkv_bias=True, tied=False, ctx=512),
    "qwen3-tiny": dict(arch="qwen3", n_embd=64, n_layer=2, n_head=4, n_head_kv=2, head_dim=32, n_ff=128,
                       rope_base=1e6, eps=1e-6, qk_norm=True, tied=True, ctx=512),
    "qwen3moe-tiny": dict(arch="qwen3moe", n_embd=64, n_layer=2, n_head=4, n_head_kv=2, head_dim=32, n_ff=128,
                          n_expert=4, n_expert_used=2, n_ff_exp=32,
                          rope_base=1e6, eps=1e-6, qk_norm=True, tied=False, ctx=512),
    "llama3-tiny": dict(arch="llama", n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=128,
                        rope_base=500000.0, eps=1e-5, tied=False, ctx=512,
                        llama3_rope=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, orig_ctx=64)),
    "mixtral-tiny": dict(arch="llama", n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=64,
                         n_expert=4, n_expert_used=2, rope_base=1e6, eps=1e-5, tied=False, ctx=512),
    "phi3-tiny": dict(arch="phi3", n_embd=64, n_layer=2, n_head=4, n_head_kv=2, n_ff=128,
                      rope_base=10000.0, eps=1e-5, tied=False, ctx=4096, sliding_window=16),
    "gemma2-tiny": dict(arch="gemma2", n_embd=64, n_layer=3, n_head=4, n_head_kv=2, head_dim=32, n_ff=128,
                        rope_base=10000.0, eps=1e-6, tied=True, ctx=512, sliding_window=8,
                        attn_softcap=8.0, final_softcap=15.0),
    "gemma3-tiny": dict(arch="gemma3", n_embd=64, n_layer=6, n_head=2, n_head_kv=1, head_dim=16, n_ff=96,
                        rope_base=1e6, eps=1e-6, qk_norm=True, tied=True, ctx=512, sliding_window=8,
                        rope_linear=8.0),
    # context_length = factor x original, as in the released config (131072 = 32 x 4096)
    "gpt-oss-tiny": dict(arch="gpt-oss", n_embd=64, n_layer=3, n_head=4, n_head_kv=2, head_dim=32, n_ff=64,
                         n_expert=4, n_expert_used=2, n_ff_exp=64, rope_base=150000.0, eps=1e-5,
                         qkv_bias=True, tied=False, ctx=256, sliding_window=16,
                         rope_yarn=dict(factor=4.0, orig_ctx=64)),
    # context_length: the Mamba converter writes 2^20 (no positional limit)
    "mamba-tiny": dict(arch="mamba", n_embd=64, n_layer=3, d_inner=128, d_state=16, d_conv=4, dt_rank=8,
                       eps=1e-5, tied=True, ctx=1048576),
    "mamba2-tiny": dict(arch="mamba2", n_embd=64, n_layer=3, d_inner=128, d_state=16, d_conv=4, n_head=8,
                        n_group=2, eps=1e-5, tied=True, ctx=1048576),
    # DeepSeek-V2 (softmax experts, not renormalised) and V3's routing (sigmoid + exp_probs_b,
    # expert groups, renormalised and scaled); YaRN x4 over 64 positions with mscale_all_dim 0.707
    "deepseek2-tiny": dict(arch="deepseek2", n_embd=64, n_layer=3, n_head=4, n_ff=96, q_lora=32, kv_lora=32,
                           nope=16, rope=16, v=24, n_dense=1, n_expert=4, n_expert_used=2, n_ff_exp=32,
                           n_shared=1, w_scale=1.0, eps=1e-6, tied=False, ctx=512, rope_base=10000.0,
                           rope_yarn=dict(factor=4.0, orig_ctx=64, mscale_all_dim=0.707)),
    "granitehybrid-tiny": dict(arch="granitehybrid", n_embd=64, n_layer=4, kinds="MAMA", n_head=4, n_head_kv=2,
                               d_inner=128, d_state=16, d_conv=4, ssm_heads=8, n_group=1, n_ff=32, n_expert=4,
                               n_expert_used=2, n_ff_shexp=48, embd_scale=12.0, residual_scale=0.22,
                               attn_scale=0.125, logit_scale=6.0, eps=1e-5, ctx=1048576),
    "granitehybrid-dense-tiny": dict(arch="granitehybrid", n_embd=64, n_layer=4, kinds="AMMA", n_head=4, n_head_kv=2,
                                     d_inner=128, d_state=16, d_conv=4, ssm_heads=8, n_group=1, n_ff=96, n_expert=0,
                                     n_expert_used=0, n_ff_shexp=0, embd_scale=12.0, residual_scale=0.22,
                                     attn_scale=0.125, logit_scale=6.0, eps=1e-5, ctx=1048576),
    "deepseek2-lite-tiny": dict(arch="deepseek2", n_embd=64, n_layer=2, n_head=4, n_ff=96, q_lora=0, kv_lora=32,
                                nope=16, rope=16, v=16, n_dense=1, n_expert=4, n_expert_used=2, n_ff_exp=32,
                                n_shared=2, w_scale=1.0, eps=1e-6, tied=False, ctx=512, rope_base=10000.0,
                                rope_yarn=dict(factor=4.0, orig_ctx=64, mscale_all_dim=0.707)),
    "deepseek3-tiny": dict(arch="deepseek2", n_embd=64, n_layer=3, n_head=4, n_ff=96, q_lora=32, kv_lora=32,
                           nope=16, rope=16, v=16, n_dense=1, n_expert=8, n_expert_used=2, n_ff_exp=32,
                           n_shared=1, w_scale=2.5, w_norm=True, gating=2, groups=(4, 2), eps=1e-6, tied=False,
                           ctx=512, rope_base=10000.0),
    "qwen3next-tiny": dict(arch="qwen3next", n_embd=64, n_layer=4, interval=2, n_head=4, n_head_kv=2, head_dim=32,
                           n_rot=8, S=32, Hk=2, Hv=4, d_conv=4, n_ff=96, n_expert=4, n_expert_used=2, n_ff_exp=32,
                           n_ff_shexp=48, rope_base=1e7, eps=1e-6, ctx=4096),
    # RWKV-7: heads of 64 (ggml's CPU WKV-7 needs head_size >= GGML_F32_STEP), all LoRA ranks different
    "rwkv7-tiny": dict(arch="rwkv7", n_embd=128, n_layer=3, head_size=64, n_ff=224, r_decay=32, r_iclr=24,
                       r_value=16, r_gate=40, eps=1e-5, tied=False, ctx=1048576),
    # RWKV-6: heads of 64 (as RWKV-7's), the two LoRA ranks different, the stream halved after layer 1
    "rwkv6-tiny": dict(arch="rwkv6", n_embd=128, n_layer=3, head_size=64, n_ff=448, mix_dim=16, decay_dim=24,
                       rescale=2, eps=1e-5, tied=False, ctx=1048576),
}
N_VOCAB = 320


def llama3_rope_factors(base, dim, factor, low_freq_factor, high_freq_factor, orig_ctx):
    """As LlamaModel.generate_extra_tensors in convert_hf_to_gguf.py computes rope_freqs."""
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    low_wl, high_wl = orig_ctx / low_freq_factor, orig_ctx / high_freq_factor
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(factor)
        else:
            s = (orig_ctx / wl - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append(1 / ((1 - s) / factor + s))
    return np.array(out, dtype=np.float32)


def _tokenizer_kvs(toks, scores, types, sid):
    kvs = [("tokenizer.ggml.model", T_STR, "llama"),
           ("tokenizer.ggml.tokens", T_ARR, (T_STR, toks)),
           ("tokenizer.ggml.scores", T_ARR, (T_F32, scores)),
           ("tokenizer.ggml.token_type", T_ARR, (T_I32, types)),
           ("tokenizer.ggml.bos_token_id", T_U32, sid["bos"]),
           ("tokenizer.ggml.eos_token_id", T_U32, sid["eos"]),
           ("tokenizer.ggml.unknown_token_id", T_U32, sid["unk"]),
           ("tokenizer.ggml.add_bos_token", T_BOOL, True),
           ("tokenizer.ggml.add_eos_token", T_BOOL, False)]
    if "pad" in sid:
        kvs.append(("tokenizer.ggml.padding_token_id", T_U32, sid["pad"]))
    return kvs


def _build_mamba(c, shape, rng, toks, scores, types, sid):
    """Mamba-1 keys and tensors, as MambaModel in convert_hf_to_gguf.py writes them: A is stored
    as -exp(A_log) under blk.N.ssm_a, D under blk.N.ssm_d (neither with a ".weight" suffix), the
    conv1d weight squeezed to ggml ne [d_conv, d_inner]."""
    a = "mamba"
    E, L, V = c["n_embd"], c["n_layer"], N_VOCAB
    di, ds, dc, dr = c["d_inner"], c["d_state"], c["d_conv"], c["dt_rank"]

    def w(n_out, n_in, g=1.0):
        return (rng.standard_normal((n_out, n_in)) * g / math.sqrt(n_in)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    kvs = [("general.architecture", T_STR, a),
           ("general.name", T_STR, shape),
           ("general.file_type", T_U32, 0),
           (f"{a}.context_length", T_U32, c["ctx"]),
           (f"{a}.embedding_length", T_U32, E),
           (f"{a}.feed_forward_length", T_U32, 0),
           (f"{a}.block_count", T_U32, L),
           (f"{a}.attention.head_count", T_U32, 0),
           (f"{a}.ssm.conv_kernel", T_U32, dc),
           (f"{a}.ssm.inner_size", T_U32, di),
           (f"{a}.ssm.state_size", T_U32, ds),
           (f"{a}.ssm.time_step_rank", T_U32, dr),
           (f"{a}.ssm.dt_b_c_rms", T_BOOL, False),
           (f"{a}.attention.layer_norm_rms_epsilon", T_F32, c["eps"])]
    kvs += _tokenizer_kvs(toks, scores, types, sid)

    g_res = c.get("g_res", 2.0)
    T = [("token_embd.weight", (rng.standard_normal((V, E)) * c.get("emb_std", 0.1)).astype(np.float32))]
    for il in range(L):
        p = f"blk.{il}."
        T.append((p + "attn_norm.weight", norm(E)))
        T.append((p + "ssm_in.weight", w(2 * di, E)))                         # rows: x (d_inner), then z
        # numpy [d_inner, d_conv] == ggml ne [d_conv, d_inner]; tap 0 meets the oldest step
        T.append((p + "ssm_conv1d.weight", (rng.standard_normal((di, dc)) / math.sqrt(dc)).astype(np.float32)))
        T.append((p + "ssm_conv1d.bias", (0.1 * rng.standard_normal(di)).astype(np.float32)))
        T.append((p + "ssm_x.weight", w(dr + 2 * ds, di)))                   # rows: dt, B, C
        T.append((p + "ssm_dt.weight", w(di, dr)))
        T.append((p + "ssm_dt.bias", (-2.0 + 0.5 * rng.standard_normal(di)).astype(np.float32)))
        # A = -exp(A_log) with A_log = log(s + 1) (the reference init), jittered by 10%
        A = -np.arange(1, ds + 1, dtype=np.float64)[None, :] * (1.0 + 0.1 * rng.standard_normal((di, ds)))
        T.append((p + "ssm_a", A.astype(np.float32)))                          # ggml ne [d_state, d_inner]
        T.append((p + "ssm_d", (1.0 + 0.1 * rng.standard_normal(di)).astype(np.float32)))
        T.append((p + "ssm_out.weight", w(E, di, g_res)))
    T.append(("output_norm.weight", norm(E) * 5.0))                            # tied: as the other tied shapes
    return kvs, T


def _build_mamba2(c, shape, rng, toks, scores, types, sid):
    """Mamba-2 keys and tensors, as Mamba2Model in llama.cpp's converter writes them: time_step_rank
    is the number of heads, group_count the B/C groups; in_proj rows z, x, B, C, dt; the conv1d
    weight squeezed to ggml ne [d_conv, d_inner + 2 G d_state]; A = -exp(A_log) and D reshaped to
    (n_head, 1), i.e. ggml ne [1, n_head], under blk.N.ssm_a / blk.N.ssm_d; dt_bias as
    ssm_dt.bias; the gated norm's weight reshaped to (G, d_inner / G), ggml ne [d_inner / G, G]."""
    a = "mamba2"
    E, L, V = c["n_embd"], c["n_layer"], N_VOCAB
    di, ds, dc, nh, ng = c["d_inner"], c["d_state"], c["d_conv"], c["n_head"], c["n_group"]
    conv_dim = di + 2 * ng * ds

    def w(n_out, n_in, g=1.0):
        return (rng.standard_normal((n_out, n_in)) * g / math.sqrt(n_in)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    kvs = [("general.architecture", T_STR, a),
           ("general.name", T_STR, shape),
           ("general.file_type", T_U32, 0),
           (f"{a}.context_length", T_U32, c["ctx"]),
           (f"{a}.embedding_length", T_U32, E),
           (f"{a}.feed_forward_length", T_U32, 0),
           (f"{a}.attention.head_count", T_U32, 0),
           (f"{a}.block_count", T_U32, L),
           (f"{a}.ssm.conv_kernel", T_U32, dc),
           (f"{a}.ssm.inner_size", T_U32, di),
           (f"{a}.ssm.state_size", T_U32, ds),
           (f"{a}.ssm.time_step_rank", T_U32, nh),
           (f"{a}.ssm.group_count", T_U32, ng),
           (f"{a}.attention.layer_norm_rms_epsilon", T_F32, c["eps"])]
    kvs += _tokenizer_kvs(toks, scores, types, sid)

    g_res = c.get("g_res", 2.0)
    T = [("token_embd.weight", (rng.standard_normal((V, E)) * c.get("emb_std", 0.1)).astype(np.float32))]
    for il in range(L):
        p = f"blk.{il}."
        T.append((p + "attn_norm.weight", norm(E)))
        T.append((p + "ssm_in.weight", w(2 * di + 2 * ng * ds + nh, E)))      # rows: z, x, B, C, dt
        T.append((p + "ssm_conv1d.weight", (rng.standard_normal((conv_dim, dc)) / math.sqrt(dc)).astype(np.float32)))
        T.append((p + "ssm_conv1d.bias", (0.1 * rng.standard_normal(conv_dim)).astype(np.float32)))
        T.append((p + "ssm_dt.bias", (-2.0 + 0.5 * rng.standard_normal(nh)).astype(np.float32)))
        # A = -exp(A_log), A_log = log(uniform(1, 16)) per head (the reference init)
        A = -rng.uniform(1.0, 16.0, nh)
        T.append((p + "ssm_a", A.reshape(nh, 1).astype(np.float32)))           # ggml ne [1, n_head]
        T.append((p + "ssm_d", (1.0 + 0.1 * rng.standard_normal(nh)).reshape(nh, 1).astype(np.float32)))
        T.append((p + "ssm_norm.weight", norm(di).reshape(ng, di // ng)))       # ggml ne [d_inner/G, G]
        T.append((p + "ssm_out.weight", w(E, di, g_res)))
    T.append(("output_norm.weight", norm(E) * 5.0))
    return kvs, T


def _build_rwkv7(c, shape, rng, toks, scores, types, sid):
    """RWKV-7 keys and tensors as Rwkv7Model in llama.cpp's converter writes them: wkv.head_size,
    the four LoRA ranks, attention.layer_norm_epsilon, head_count 0; the six token-shift mixes
    stacked as time_mix_lerp_fused (ggml ne [E, 1, 1, 6], order r w k v a g); LoRAs as
    time_mix_{w,a,v,g}{1,2} with ggml ne [E, rank] and [rank, E], their biases w0 / a0 / v0;
    layer 0's v0 / v1 / v2 copies of a0 / a1 / a2 (unused); every norm a LayerNorm with a bias."""
    a = "rwkv7"
    E, L, V, N, F = c["n_embd"], c["n_layer"], N_VOCAB, c["head_size"], c["n_ff"]
    RD, RA, RV, RG = c["r_decay"], c["r_iclr"], c["r_value"], c["r_gate"]

    def w(n_out, n_in, g=1.0):
        return (rng.standard_normal((n_out, n_in)) * g / math.sqrt(n_in)).astype(np.float32)

    def vec(n, center, std):
        return (center + std * rng.standard_normal(n)).astype(np.float32)

    kvs = [("general.architecture", T_STR, a),
           ("general.name", T_STR, shape),
           ("general.file_type", T_U32, 0),
           (f"{a}.context_length", T_U32, c["ctx"]),
           (f"{a}.embedding_length", T_U32, E),
           (f"{a}.block_count", T_U32, L),
           (f"{a}.attention.layer_norm_epsilon", T_F32, c["eps"]),
           (f"{a}.wkv.head_size", T_U32, N),
           (f"{a}.attention.decay_lora_rank", T_U32, RD),
           (f"{a}.attention.iclr_lora_rank", T_U32, RA),
           (f"{a}.attention.value_residual_mix_lora_rank", T_U32, RV),
           (f"{a}.attention.gate_lora_rank", T_U32, RG),
           (f"{a}.feed_forward_length", T_U32, F),
           (f"{a}.attention.head_count", T_U32, 0)]
    kvs += _tokenizer_kvs(toks, scores, types, sid)
    T = [("token_embd.weight", (rng.standard_normal((V, E)) * 0.5).astype(np.float32)),
         ("token_embd_norm.weight", vec(E, 1.0, 0.1)), ("token_embd_norm.bias", vec(E, 0.0, 0.1))]
    for il in range(L):
        p = f"blk.{il}."
        for n in ("attn_norm", "attn_norm_2"):
            T += [(p + n + ".weight", vec(E, 1.0, 0.1)), (p + n + ".bias", vec(E, 0.0, 0.1))]
        T.append((p + "time_mix_lerp_fused.weight", vec(6 * E, 0.5, 0.2).reshape(6, 1, 1, E)))
        T += [(p + "time_mix_w0.weight", vec(E, 0.0, 1.0)), (p + "time_mix_w1.weight", w(RD, E)),
              (p + "time_mix_w2.weight", w(E, RD))]
        a0, a1, a2 = vec(E, 0.0, 0.5), w(RA, E), w(E, RA)
        T += [(p + "time_mix_a0.weight", a0), (p + "time_mix_a1.weight", a1), (p + "time_mix_a2.weight", a2)]
        if il == 0:
            T += [(p + "time_mix_v0.weight", a0), (p + "time_mix_v1.weight", a1), (p + "time_mix_v2.weight", a2)]
        else:
            T += [(p + "time_mix_v0.weight", vec(E, 0.0, 0.5)), (p + "time_mix_v1.weight", w(RV, E)),
                  (p + "time_mix_v2.weight", w(E, RV))]
        T += [(p + "time_mix_g1.weight", w(RG, E)), (p + "time_mix_g2.weight", w(E, RG)),
              (p + "time_mix_k_k.weight", vec(E, 1.0, 0.1)), (p + "time_mix_k_a.weight", vec(E, 1.0, 0.1)),
              (p + "time_mix_r_k.weight", vec(E, 0.0, 0.3)),
              (p + "time_mix_key.weight", w(E, E)), (p + "time_mix_value.weight", w(E, E)),
              (p + "time_mix_receptance.weight", w(E, E)),
              (p + "time_mix_ln.weight", vec(E, 1.0, 0.1)), (p + "time_mix_ln.bias", vec(E, 0.0, 0.1)),
              (p + "time_mix_output.weight", w(E, E)),
              (p + "channel_mix_lerp_k.weight", vec(E, 0.5, 0.2)),
              (p + "channel_mix_key.weight", w(F, E)), (p + "channel_mix_value.weight", w(E, F))]
    T += [("output_norm.weight", vec(E, 1.0, 0.1)), ("output_norm.bias", vec(E, 0.0, 0.1)),
          ("output.weight", w(V, E, 4.0))]
    return kvs, T


def _build_rwkv6(c, shape, rng, toks, scores, types, sid):
    """RWKV-6 keys and tensors as Rwkv6Model in llama.cpp's converter writes them: wkv.head_size,
    time_mix_extra_dim, time_decay_extra_dim, rescale_every_n_layers, attention.layer_norm_epsilon,
    head_count 0; the five token-shift mixes stacked as time_mix_lerp_fused (ggml ne [E, 1, 1, 5],
    order w k v r g), time_mix_lerp_x / channel_mix_lerp_k / _r / time_mix_decay squeezed to 1-D,
    time_mix_w1 ggml ne [E, 5 D] and time_mix_w2 [D, E, 5] (the converter's transpose and
    permute), time_mix_decay_w1 [E, Dd], _w2 [Dd, E], time_mix_first [N, H]; every norm a
    LayerNorm with a bias; time_mix_output and channel_mix_value divided by 2^(il // rescale)."""
    a = "rwkv6"
    E, L, V, N, F = c["n_embd"], c["n_layer"], N_VOCAB, c["head_size"], c["n_ff"]
    D, DD, R, H = c["mix_dim"], c["decay_dim"], c["rescale"], c["n_embd"] // c["head_size"]

    def w(n_out, n_in, g=1.0):
        return (rng.standard_normal((n_out, n_in)) * g / math.sqrt(n_in)).astype(np.float32)

    def vec(n, center, std):
        return (center + std * rng.standard_normal(n)).astype(np.float32)

    kvs = [("general.architecture", T_STR, a),
           ("general.name", T_STR, shape),
           ("general.file_type", T_U32, 0),
           (f"{a}.context_length", T_U32, c["ctx"]),
           (f"{a}.embedding_length", T_U32, E),
           (f"{a}.block_count", T_U32, L),
           (f"{a}.attention.layer_norm_epsilon", T_F32, c["eps"]),
           (f"{a}.rescale_every_n_layers", T_U32, R),
           (f"{a}.wkv.head_size", T_U32, N),
           (f"{a}.time_mix_extra_dim", T_U32, D),
           (f"{a}.time_decay_extra_dim", T_U32, DD),
           (f"{a}.feed_forward_length", T_U32, F),
           (f"{a}.attention.head_count", T_U32, 0)]
    kvs += _tokenizer_kvs(toks, scores, types, sid)
    T = [("token_embd.weight", (rng.standard_normal((V, E)) * 0.5).astype(np.float32)),
         ("token_embd_norm.weight", vec(E, 1.0, 0.1)), ("token_embd_norm.bias", vec(E, 0.0, 0.1))]
    for il in range(L):
        p = f"blk.{il}."
        rescale = 2.0 ** -(il // R) if R else 1.0
        for n in ("attn_norm", "attn_norm_2"):
            T += [(p + n + ".weight", vec(E, 1.0, 0.1)), (p + n + ".bias", vec(E, 0.0, 0.1))]
        T += [(p + "time_mix_w1.weight", w(5 * D, E)),
              (p + "time_mix_w2.weight", np.stack([w(E, D, 0.5) for _ in range(5)])),
              (p + "time_mix_lerp_x.weight", vec(E, 0.5, 0.2)),
              (p + "time_mix_lerp_fused.weight", vec(5 * E, 0.5, 0.2).reshape(5, 1, 1, E)),
              (p + "time_mix_first.weight", vec(E, 0.5, 0.3).reshape(H, N)),
              (p + "time_mix_decay.weight", vec(E, -2.0, 1.0)),
              (p + "time_mix_decay_w1.weight", w(DD, E)),
              (p + "time_mix_decay_w2.weight", w(E, DD, 0.5)),
              (p + "time_mix_key.weight", w(E, E)), (p + "time_mix_value.weight", w(E, E)),
              (p + "time_mix_receptance.weight", w(E, E)), (p + "time_mix_gate.weight", w(E, E)),
              (p + "time_mix_ln.weight", vec(E, 1.0, 0.1)), (p + "time_mix_ln.bias", vec(E, 0.0, 0.1)),
              (p + "time_mix_output.weight", w(E, E, rescale)),
              (p + "channel_mix_lerp_k.weight", vec(E, 0.5, 0.2)),
              (p + "channel_mix_lerp_r.weight", vec(E, 0.5, 0.2)),
              (p + "channel_mix_key.weight", w(F, E)), (p + "channel_mix_value.weight", w(E, F, rescale)),
              (p + "channel_mix_receptance.weight", w(E, E))]
    T += [("output_norm.weight", vec(E, 1.0, 0.1)), ("output_norm.bias", vec(E, 0.0, 0.1)),
          ("output.weight", w(V, E, 4.0))]
    return kvs, T


def _build_deepseek2(c, shape, rng, toks, scores, types, sid):
    """DeepSeek-V2/V3 keys and tensors as DeepseekV2Model in llama.cpp's converter writes them: the
    cache as MQA (head_count_kv 1, key_length kv_lora + rope, value_length kv_lora), the per-head
    sizes as key_length_mla / value_length_mla, kv_b_proj split per head into attn_k_b (transposed:
    numpy [H, kv_lora, nope] == ggml ne [nope, kv_lora, H]) and attn_v_b (numpy [H, v, kv_lora]),
    yarn_log_multiplier = 0.1 * mscale_all_dim."""
    a = "deepseek2"
    E, L, V, H = c["n_embd"], c["n_layer"], N_VOCAB, c["n_head"]
    C, R, nope, dv, QR = c["kv_lora"], c["rope"], c["nope"], c["v"], c["q_lora"]
    NE, Fe, F = c["n_expert"], c["n_ff_exp"], c["n_ff"]

    def w(n_out, n_in, g=1.0):
        return (rng.standard_normal((n_out, n_in)) * g / math.sqrt(n_in)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    kvs = [("general.architecture", T_STR, a),
           ("general.name", T_STR, shape),
           ("general.file_type", T_U32, 0),
           (f"{a}.context_length", T_U32, c["ctx"]),
           (f"{a}.embedding_length", T_U32, E),
           (f"{a}.feed_forward_length", T_U32, F),
           (f"{a}.block_count", T_U32, L),
           (f"{a}.attention.head_count", T_U32, H),
           (f"{a}.attention.head_count_kv", T_U32, 1),
           (f"{a}.rope.freq_base", T_F32, c["rope_base"]),
           (f"{a}.attention.layer_norm_rms_epsilon", T_F32, c["eps"]),
           (f"{a}.expert_used_count", T_U32, c["n_expert_used"]),
           (f"{a}.leading_dense_block_count", T_U32, c["n_dense"]),
           (f"{a}.vocab_size", T_U32, V),
           (f"{a}.attention.kv_lora_rank", T_U32, C),
           (f"{a}.attention.key_length", T_U32, C + R),
           (f"{a}.attention.value_length", T_U32, C),
           (f"{a}.attention.key_length_mla", T_U32, nope + R),
           (f"{a}.attention.value_length_mla", T_U32, dv),
           (f"{a}.expert_feed_forward_length", T_U32, Fe),
           (f"{a}.expert_count", T_U32, NE),
           (f"{a}.expert_shared_count", T_U32, c["n_shared"]),
           (f"{a}.expert_weights_scale", T_F32, c["w_scale"]),
           (f"{a}.rope.dimension_count", T_U32, R)]
    if QR > 0:  # (V2-Lite: no key, queries straight from attn_q)
        kvs.append((f"{a}.attention.q_lora_rank", T_U32, QR))
    if c.get("w_norm"):
        kvs.append((f"{a}.expert_weights_norm", T_BOOL, True))
    if "gating" in c:
        kvs.append((f"{a}.expert_gating_func", T_U32, c["gating"]))
    if "groups" in c:
        kvs += [(f"{a}.expert_group_count", T_U32, c["groups"][0]), (f"{a}.expert_group_used_count", T_U32, c["groups"][1])]
    if "rope_yarn" in c:
        y = c["rope_yarn"]
        kvs += [(f"{a}.rope.scaling.type", T_STR, "yarn"),
                (f"{a}.rope.scaling.factor", T_F32, y["factor"]),
                (f"{a}.rope.scaling.original_context_length", T_U32, y["orig_ctx"]),
                (f"{a}.rope.scaling.yarn_log_multiplier", T_F32, 0.1 * y["mscale_all_dim"])]
    kvs += _tokenizer_kvs(toks, scores, types, sid)

    g_res = c.get("g_res", 2.0)
    T = [("token_embd.weight", rng.standard_normal((V, E)).astype(np.float32))]
    for il in range(L):
        p = f"blk.{il}."
        T.append((p + "attn_norm.weight", norm(E)))
        if QR > 0:
            T.append((p + "attn_q_a.weight", w(QR, E)))
            T.append((p + "attn_q_a_norm.weight", norm(QR)))
            T.append((p + "attn_q_b.weight", w(H * (nope + R), QR, 1.6)))
        else:
            T.append((p + "attn_q.weight", w(H * (nope + R), E, 1.6)))
        T.append((p + "attn_kv_a_mqa.weight", w(C + R, E, 1.6)))
        T.append((p + "attn_kv_a_norm.weight", norm(C)))
        # kv_b_proj [H * (nope + v), C] split per head, k part transposed (the converter's order)
        kv_b = w(H * (nope + dv), C).reshape(H, nope + dv, C)
        T.append((p + "attn_k_b.weight", np.ascontiguousarray(kv_b[:, :nope, :].transpose(0, 2, 1))))
        T.append((p + "attn_v_b.weight", np.ascontiguousarray(kv_b[:, nope:, :])))
        T.append((p + "attn_output.weight", w(E, H * dv, g_res)))
        T.append((p + "ffn_norm.weight", norm(E)))
        if il < c["n_dense"]:
            T.append((p + "ffn_gate.weight", w(F, E)))
            T.append((p + "ffn_down.weight", w(E, F, g_res)))
            T.append((p + "ffn_up.weight", w(F, E)))
            continue
        T.append((p + "ffn_gate_inp.weight", w(NE, E, 2.0)))
        if c.get("gating") == 2:
            T.append((p + "exp_probs_b.bias", (0.1 * rng.standard_normal(NE)).astype(np.float32)))
        # numpy [n_expert, n_ff_exp, n_embd] == ggml ne [n_embd, n_ff_exp, n_expert]
        T.append((p + "ffn_gate_exps.weight", np.stack([w(Fe, E) for _ in range(NE)])))
        T.append((p + "ffn_down_exps.weight", np.stack([w(E, Fe, g_res) for _ in range(NE)])))
        T.append((p + "ffn_up_exps.weight", np.stack([w(Fe, E) for _ in range(NE)])))
        Fs = Fe * c["n_shared"]
        T.append((p + "ffn_gate_shexp.weight", w(Fs, E)))
        T.append((p + "ffn_down_shexp.weight", w(E, Fs, g_res)))
        T.append((p + "ffn_up_shexp.weight", w(Fs, E)))
    T.append(("output_norm.weight", norm(E)))
    T.append(("output.weight", w(V, E, 3.0)))
    return kvs, T


def _build_granitehybrid(c, shape, rng, toks, scores, types, sid):
    """Granite 4.0-H keys and tensors, as GraniteHybridModel in llama.cpp's converter writes them:
    Granite's scales, the Mamba-2 keys, head_count_kv one value per layer (0 on the Mamba-2
    layers), rope.scaling.finetuned false; Mamba-2 tensors (as _build_mamba2) on the Mamba-2
    layers, attn_q/k/v/output on the others; every layer an ffn_norm and routed experts with
    ffn_*_shexp (no shared-expert gate)."""
    a = "granitehybrid"
    E, L, V, H, Hkv = c["n_embd"], c["n_layer"], N_VOCAB, c["n_head"], c["n_head_kv"]
    hd = E // H
    di, ds, dc, nh, ng = c["d_inner"], c["d_state"], c["d_conv"], c["ssm_heads"], c["n_group"]
    conv_dim = di + 2 * ng * ds
    NE, F, S = c["n_expert"], c["n_ff"], c["n_ff_shexp"]
    ssm = [k == "M" for k in c["kinds"]]

    def w(n_out, n_in, g=1.0):
        return (rng.standard_normal((n_out, n_in)) * g / math.sqrt(n_in)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    kvs = [("general.architecture", T_STR, a),
           ("general.name", T_STR, shape),
           ("general.file_type", T_U32, 0),
           (f"{a}.context_length", T_U32, c["ctx"]),
           (f"{a}.embedding_length", T_U32, E),
           (f"{a}.feed_forward_length", T_U32, F),
           (f"{a}.block_count", T_U32, L),
           (f"{a}.attention.head_count", T_U32, H),
           (f"{a}.attention.head_count_kv", T_ARR, (T_U32, [0 if m else Hkv for m in ssm])),
           (f"{a}.rope.freq_base", T_F32, 10000.0),
           (f"{a}.rope.dimension_count", T_U32, hd),
           (f"{a}.rope.scaling.finetuned", T_BOOL, False),
           (f"{a}.attention.layer_norm_rms_epsilon", T_F32, c["eps"]),
           (f"{a}.attention.scale", T_F32, c["attn_scale"]),
           (f"{a}.embedding_scale", T_F32, c["embd_scale"]),
           (f"{a}.residual_scale", T_F32, c["residual_scale"]),
           (f"{a}.logit_scale", T_F32, c["logit_scale"]),
           (f"{a}.ssm.conv_kernel", T_U32, dc),
           (f"{a}.ssm.state_size", T_U32, ds),
           (f"{a}.ssm.group_count", T_U32, ng),
           (f"{a}.ssm.inner_size", T_U32, di),
           (f"{a}.ssm.time_step_rank", T_U32, nh)]
    if NE:  # (dense: the converter writes no expert keys)
        kvs += [(f"{a}.expert_count", T_U32, NE),
                (f"{a}.expert_used_count", T_U32, c["n_expert_used"]),
                (f"{a}.expert_shared_feed_forward_length", T_U32, S)]
    kvs += _tokenizer_kvs(toks, scores, types, sid)

    T = [("token_embd.weight", (rng.standard_normal((V, E)) * 0.1).astype(np.float32))]
    for il in range(L):
        p = f"blk.{il}."
        T.append((p + "attn_norm.weight", norm(E)))
        if ssm[il]:
            T.append((p + "ssm_in.weight", w(2 * di + 2 * ng * ds + nh, E)))
            T.append((p + "ssm_conv1d.weight", (rng.standard_normal((conv_dim, dc)) / math.sqrt(dc)).astype(np.float32)))
            T.append((p + "ssm_conv1d.bias", (0.1 * rng.standard_normal(conv_dim)).astype(np.float32)))
            T.append((p + "ssm_dt.bias", (-2.0 + 0.5 * rng.standard_normal(nh)).astype(np.float32)))
            T.append((p + "ssm_a", (-rng.uniform(1.0, 16.0, nh)).reshape(nh, 1).astype(np.float32)))
            T.append((p + "ssm_d", (1.0 + 0.1 * rng.standard_normal(nh)).reshape(nh, 1).astype(np.float32)))
            T.append((p + "ssm_norm.weight", norm(di).reshape(ng, di // ng)))
            T.append((p + "ssm_out.weight", w(E, di, 2.0)))
        else:
            T.append((p + "attn_q.weight", w(H * hd, E, 1.6)))
            T.append((p + "attn_k.weight", w(Hkv * hd, E, 1.6)))
            T.append((p + "attn_v.weight", w(Hkv * hd, E)))
            T.append((p + "attn_output.weight", w(E, H * hd, 2.0)))
        T.append((p + "ffn_norm.weight", norm(E)))
        if not NE:
            T.append((p + "ffn_gate.weight", w(F, E)))
            T.append((p + "ffn_down.weight", w(E, F, 2.0)))
            T.append((p + "ffn_up.weight", w(F, E)))
            continue
        T.append((p + "ffn_gate_inp.weight", w(NE, E, 2.0)))
        T.append((p + "ffn_gate_exps.weight", np.stack([w(F, E) for _ in range(NE)])))
        T.append((p + "ffn_up_exps.weight", np.stack([w(F, E) for _ in range(NE)])))
        T.append((p + "ffn_down_exps.weight", np.stack([w(E, F, 2.0) for _ in range(NE)])))
        T.append((p + "ffn_gate_shexp.weight", w(S, E)))
        T.append((p + "ffn_up_shexp.weight", w(S, E)))
        T.append((p + "ffn_down_shexp.weight", w(E, S, 2.0)))
    T.append(("output_norm.weight", norm(E) * 5.0))
    return kvs, T


def _build_qwen3next(c, shape, rng, toks, scores, types, sid):
    """Qwen3-Next keys and tensors, as Qwen3NextModel in llama.cpp's converter writes them (in_proj_qkvz
    split into attn_qkv and attn_gate, A_log as -exp(A_log), dt_bias as ssm_dt.bias, the conv squeezed
    to [C, d_conv], the shared expert's gate [1, n_embd]); no MTP block."""
    a = "qwen3next"
    E, L, V, H, Hkv, hd = c["n_embd"], c["n_layer"], N_VOCAB, c["n_head"], c["n_head_kv"], c["head_dim"]
    S, Hk, Hv, dc = c["S"], c["Hk"], c["Hv"], c["d_conv"]
    C = 2 * Hk * S + Hv * S
    NE, Fe, Fs = c["n_expert"], c["n_ff_exp"], c["n_ff_shexp"]

    def w(n_out, n_in, g=1.0):
        return (rng.standard_normal((n_out, n_in)) * g / math.sqrt(n_in)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    kvs = [("general.architecture", T_STR, a),
           ("general.name", T_STR, shape),
           ("general.file_type", T_U32, 0),
           (f"{a}.block_count", T_U32, L),
           (f"{a}.context_length", T_U32, c["ctx"]),
           (f"{a}.embedding_length", T_U32, E),
           (f"{a}.feed_forward_length", T_U32, c["n_ff"]),
           (f"{a}.attention.head_count", T_U32, H),
           (f"{a}.attention.head_count_kv", T_U32, Hkv),
           (f"{a}.rope.freq_base", T_F32, c["rope_base"]),
           (f"{a}.attention.layer_norm_rms_epsilon", T_F32, c["eps"]),
           (f"{a}.expert_count", T_U32, NE),
           (f"{a}.expert_used_count", T_U32, c["n_expert_used"]),
           (f"{a}.attention.key_length", T_U32, hd),
           (f"{a}.attention.value_length", T_U32, hd),
           (f"{a}.expert_feed_forward_length", T_U32, Fe),
           (f"{a}.expert_shared_feed_forward_length", T_U32, Fs),
           (f"{a}.ssm.conv_kernel", T_U32, dc),
           (f"{a}.ssm.state_size", T_U32, S),
           (f"{a}.ssm.group_count", T_U32, Hk),
           (f"{a}.ssm.time_step_rank", T_U32, Hv),
           (f"{a}.ssm.inner_size", T_U32, Hv * S),
           (f"{a}.full_attention_interval", T_U32, c["interval"]),
           (f"{a}.rope.dimension_count", T_U32, c["n_rot"])]
    kvs += _tokenizer_kvs(toks, scores, types, sid)

    T = [("token_embd.weight", (rng.standard_normal((V, E)) * 0.5).astype(np.float32))]
    for il in range(L):
        p = f"blk.{il}."
        T.append((p + "attn_norm.weight", norm(E)))
        if (il + 1) % c["interval"] != 0:
            T.append((p + "attn_qkv.weight", w(C, E)))
            T.append((p + "attn_gate.weight", w(Hv * S, E)))
            T.append((p + "ssm_conv1d.weight", (rng.standard_normal((C, dc)) / math.sqrt(dc)).astype(np.float32)))
            T.append((p + "ssm_dt.bias", (-2.0 + 0.5 * rng.standard_normal(Hv)).astype(np.float32)))
            T.append((p + "ssm_a", (-np.exp(rng.uniform(-0.5, 2.0, Hv))).astype(np.float32)))
            T.append((p + "ssm_ba.weight", w(2 * Hv, E)))
            T.append((p + "ssm_norm.weight", norm(S)))
            T.append((p + "ssm_out.weight", w(E, Hv * S)))
        else:
            T.append((p + "attn_q.weight", w(2 * H * hd, E)))
            T.append((p + "attn_k.weight", w(Hkv * hd, E)))
            T.append((p + "attn_v.weight", w(Hkv * hd, E)))
            T.append((p + "attn_output.weight", w(E, H * hd)))
            T.append((p + "attn_q_norm.weight", norm(hd)))
            T.append((p + "attn_k_norm.weight", norm(hd)))
        T.append((p + "post_attention_norm.weight", norm(E)))
        T.append((p + "ffn_gate_inp.weight", w(NE, E, 2.0)))
        T.append((p + "ffn_gate_exps.weight", np.stack([w(Fe, E) for _ in range(NE)])))
        T.append((p + "ffn_up_exps.weight", np.stack([w(Fe, E) for _ in range(NE)])))
        T.append((p + "ffn_down_exps.weight", np.stack([w(E, Fe) for _ in range(NE)])))
        T.append((p + "ffn_gate_inp_shexp.weight", w(1, E)))
        T.append((p + "ffn_gate_shexp.weight", w(Fs, E)))
        T.append((p + "ffn_up_shexp.weight", w(Fs, E)))
        T.append((p + "ffn_down_shexp.weight", w(E, Fs)))
    T.append(("output_norm.weight", norm(E)))
    T.append(("output.weight", w(V, E, 3.0)))
    return kvs, T


def build(shape, seed=None):
    """Return (kvs, tensors) for one shape."""
    c = SHAPES[shape]
    arch = c["arch"]
    rng = np.random.default_rng(seed if seed is not None else sum(map(ord, shape)))
    if arch == "mamba":  # no attention, no FFN: its own table
        return _build_mamba(c, shape, rng, *spm_vocab(N_VOCAB))
    if arch == "mamba2":
        return _build_mamba2(c, shape, rng, *spm_vocab(N_VOCAB))
    if arch == "deepseek2":  # latent attention: its own table
        return _build_deepseek2(c, shape, rng, *spm_vocab(N_VOCAB))
    if arch == "granitehybrid":  # Mamba-2 and attention layers: its own table
        return _build_granitehybrid(c, shape, rng, *spm_vocab(N_VOCAB))
    if arch == "rwkv7":
        return _build_rwkv7(c, shape, rng, *spm_vocab(N_VOCAB))
    if arch == "qwen3next":  # gated delta-net and gated attention layers: its own table
        return _build_qwen3next(c, shape, rng, *spm_vocab(N_VOCAB))
    if arch == "rwkv6":
        return _build_rwkv6(c, shape, rng, *spm_vocab(N_VOCAB))
    E, L, H, Hkv, F = c["n_embd"], c["n_layer"], c["n_head"], c["n_head_kv"], c["n_ff"]
    hd = c.get("head_dim", E // H)
    V = N_VOCAB
    gemma = arch.startswith("gemma")
    oss = arch == "gpt-oss"
    # weights: inputs are RMS-normalised, so std g/sqrt(n_in) gives outputs of std ~g
    def w(n_out, n_in, g=1.0):
        return (rng.standard_normal((n_out, n_in)) * g / math.sqrt(n_in)).astype(np.float32)

    def bias(*shape, sd=0.1):
        return (sd * rng.standard_normal(shape)).astype(np.float32)

    def norm(n):  # GGUF norm weights (for gemma these hold 1 + w, as the converter writes them)
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    # llama.cpp looks up "<|endoftext|>" when general.name contains "phi3" (as a real Phi-3 vocab has)
    toks, scores, types, sid = spm_vocab(V, gemma=gemma,
                                         extra_control=("<|endoftext|>", "<|end|>") if arch == "phi3" else ())
    a = arch
    kvs = [("general.architecture", T_STR, arch),
           ("general.name", T_STR, shape),
           ("general.file_type", T_U32, 0),
           (f"{a}.context_length", T_U32, c["ctx"]),
           (f"{a}.embedding_length", T_U32, E),
           (f"{a}.block_count", T_U32, L),
           (f"{a}.feed_forward_length", T_U32, F),
           (f"{a}.attention.head_count", T_U32, H),
           (f"{a}.attention.head_count_kv", T_U32, Hkv),
           (f"{a}.attention.layer_norm_rms_epsilon", T_F32, c["eps"])]
    if arch != "gemma2":  # the Gemma2 converter writes no rope.freq_base (llama.cpp default 10000)
        kvs.append((f"{a}.rope.freq_base", T_F32, c["rope_base"]))
    if "head_dim" in c:
        kvs += [(f"{a}.attention.key_length", T_U32, hd), (f"{a}.attention.value_length", T_U32, hd)]
    if arch in ("llama", "phi3"):
        kvs.append((f"{a}.rope.dimension_count", T_U32, hd))
    if arch == "llama":
        kvs.append((f"{a}.vocab_size", T_U32, V))
    if "n_expert" in c:
        kvs += [(f"{a}.expert_count", T_U32, c["n_expert"]), (f"{a}.expert_used_count", T_U32, c["n_expert_used"])]
    if "n_ff_exp" in c:
        kvs.append((f"{a}.expert_feed_forward_length", T_U32, c["n_ff_exp"]))
    if "n_ff_shexp" in c:
        kvs.append((f"{a}.expert_shared_feed_forward_length", T_U32, c["n_ff_shexp"]))
    if "sliding_window" in c:
        kvs.append((f"{a}.attention.sliding_window", T_U32, c["sliding_window"]))
    if "attn_softcap" in c:
        kvs += [(f"{a}.attn_logit_softcapping", T_F32, c["attn_softcap"]),
                (f"{a}.final_logit_softcapping", T_F32, c["final_softcap"])]
    if "rope_linear" in c:
        kvs += [(f"{a}.rope.scaling.type", T_STR, "linear"), (f"{a}.rope.scaling.factor", T_F32, c["rope_linear"])]
    if "rope_yarn" in c:  # as GptOssModel.set_gguf_parameters writes them
        kvs += [(f"{a}.rope.scaling.type", T_STR, "yarn"),
                (f"{a}.rope.scaling.factor", T_F32, c["rope_yarn"]["factor"]),
                (f"{a}.rope.scaling.original_context_length", T_U32, c["rope_yarn"]["orig_ctx"])]
    kvs += _tokenizer_kvs(toks, scores, types, sid)

    T = []
    g_res = c.get("g_res", 2.0)  # residual-branch gain: layers, not the input embedding, decide the next token
    emb_std = c.get("emb_std", 0.1 if c["tied"] else 1.0)
    T.append(("token_embd.weight", (rng.standard_normal((V, E)) * emb_std).astype(np.float32)))
    if "llama3_rope" in c:
        r = c["llama3_rope"]
        T.append(("rope_freqs.weight", llama3_rope_factors(c["rope_base"], hd, r["factor"], r["low_freq_factor"],
                                                            r["high_freq_factor"], r["orig_ctx"])))
    for il in range(L):
        p = f"blk.{il}."
        T.append((p + "attn_norm.weight", norm(E)))
        gq = 1.6
        if arch == "phi3":  # fused q|k|v rows
            T.append((p + "attn_qkv.weight", np.concatenate([w(H * hd, E, gq), w(Hkv * hd, E, gq), w(Hkv * hd, E)], 0)))
        else:
            T.append((p + "attn_q.weight", w(H * hd, E, gq)))
            T.append((p + "attn_k.weight", w(Hkv * hd, E, gq)))
            T.append((p + "attn_v.weight", w(Hkv * hd, E)))
        if c.get("qkv_bias"):
            sd = 0.1 if oss else 0.3
            T.append((p + "attn_q.bias", bias(H * hd, sd=sd)))
            T.append((p + "attn_k.bias", bias(Hkv * hd, sd=sd)))
            T.append((p + "attn_v.bias", bias(Hkv * hd, sd=sd)))
        if c.get("qk_norm"):
            T.append((p + "attn_q_norm.weight", norm(hd)))
            T.append((p + "attn_k_norm.weight", norm(hd)))
        T.append((p + "attn_output.weight", w(E, H * hd, g_res)))
        if oss:
            T.append((p + "attn_output.bias", bias(E)))
            # one logit per head (the converter appends ".weight" to self_attn.sinks)
            T.append((p + "attn_sinks.weight", rng.standard_normal(H).astype(np.float32)))
        if gemma or oss:  # gpt-oss: this is the ffn input norm (post_attention_layernorm)
            T.append((p + "post_attention_norm.weight", norm(E)))
        if not oss:
            T.append((p + "ffn_norm.weight", norm(E)))
        if oss:
            NE, Fe = c["n_expert"], c["n_ff_exp"]
            # numpy [n_expert, n_ff_exp, n_embd] == ggml ne [n_embd, n_ff_exp, n_expert]; expert
            # biases ggml ne [n_ff_exp, n_expert] ([n_embd, n_expert] for down).  The gate / up
            # gain of 3 puts a few percent of pre-activations past the +-7 clamps.
            T.append((p + "ffn_gate_inp.weight", w(NE, E, 2.0)))
            T.append((p + "ffn_gate_inp.bias", bias(NE)))
            T.append((p + "ffn_gate_exps.weight", np.stack([w(Fe, E, 3.0) for _ in range(NE)])))
            T.append((p + "ffn_gate_exps.bias", bias(NE, Fe)))
            T.append((p + "ffn_up_exps.weight", np.stack([w(Fe, E, 3.0) for _ in range(NE)])))
            T.append((p + "ffn_up_exps.bias", bias(NE, Fe)))
            T.append((p + "ffn_down_exps.weight", np.stack([w(E, Fe, g_res / 4) for _ in range(NE)])))
            T.append((p + "ffn_down_exps.bias", bias(NE, E)))
        elif "n_expert" in c:
            NE = c["n_expert"]
            Fe = c.get("n_ff_exp", F)
            T.append((p + "ffn_gate_inp.weight", w(NE, E, 2.0)))
            # numpy [n_expert, n_ff, n_embd] == ggml ne [n_embd, n_ff, n_expert]
            T.append((p + "ffn_gate_exps.weight", np.stack([w(Fe, E) for _ in range(NE)])))
            T.append((p + "ffn_down_exps.weight", np.stack([w(E, Fe, g_res) for _ in range(NE)])))
            T.append((p + "ffn_up_exps.weight", np.stack([w(Fe, E) for _ in range(NE)])))
            if "n_ff_shexp" in c:
                Fs = c["n_ff_shexp"]
                T.append((p + "ffn_gate_inp_shexp.weight", (rng.standard_normal(E) / math.sqrt(E)).astype(np.float32)))
                T.append((p + "ffn_gate_shexp.weight", w(Fs, E)))
                T.append((p + "ffn_down_shexp.weight", w(E, Fs, g_res)))
                T.append((p + "ffn_up_shexp.weight", w(Fs, E)))
        elif arch == "phi3":  # fused gate|up rows: the first n_ff rows are the gate
            T.append((p + "ffn_up.weight", np.concatenate([w(F, E), w(F, E)], 0)))
            T.append((p + "ffn_down.weight", w(E, F, g_res)))
        else:
            T.append((p + "ffn_gate.weight", w(F, E)))
            T.append((p + "ffn_up.weight", w(F, E)))
            T.append((p + "ffn_down.weight", w(E, F, g_res)))
        if gemma:  # a smaller ffn branch: ggml's fp16 GELU table then moves llama.cpp's logits less
            T.append((p + "post_ffw_norm.weight", 0.5 * norm(E)))
    # tied output: small embeddings (so a token does not just predict itself) and a large output norm
    T.append(("output_norm.weight", norm(E) * (5.0 if c["tied"] else 1.0)))
    if not c["tied"]:
        T.append(("output.weight", w(V, E, 3.0)))
    return kvs, T


def write_shape(shape, path, seed=None):
    kvs, tensors = build(shape, seed)
    write_gguf(path, kvs, tensors)
    return path



# ---- shared by the harnesses (test_arch_numpy_oracle.py, test_arch_llamacpp_peer.py) -------------

# tern's tiny synth shapes, one per architecture (the same names as SHAPES above).
TEST_SHAPES = ["qwen2-tiny", "qwen2moe-tiny", "qwen3-tiny", "qwen3moe-tiny", "llama3-tiny", "mixtral-tiny",
               "phi3-tiny", "gemma2-tiny", "gemma3-tiny", "gpt-oss-tiny", "mamba-tiny",
               "mamba2-tiny", "deepseek2-tiny", "deepseek3-tiny", "rwkv7-tiny", "rwkv6-tiny", "granitehybrid-tiny",
               "granitehybrid-dense-tiny", "qwen3next-tiny"]
# Shapes the numpy oracle checks but the npm llama.cpp peer cannot load: its llama.cpp reads a
# deepseek2 file without q_lora_rank (queries straight from attn_q) only when it has V2-Lite's 27
# layers.
ORACLE_ONLY_SHAPES = ["deepseek2-lite-tiny"]


def find_tern():
    """$TERN_BINARY, else tern on PATH, else the release build beside the tests; None if absent."""
    import shutil
    here = os.path.dirname(os.path.abspath(__file__))
    t = os.environ.get("TERN_BINARY")
    if t:
        return t if (os.path.exists(t) or shutil.which(t)) else None
    for c in (shutil.which("tern"), os.path.join(here, "../../build/release/tern")):
        if c and os.path.exists(c):
            return os.path.abspath(c)
    return None


def make_model(tern, shape, path):
    """`tern synth --shape SHAPE` (tern None: skipped), else this writer. Returns "tern synth" or
    "python writer (why)"."""
    import subprocess
    why = "not asked"
    if tern:
        try:
            r = subprocess.run([tern, "synth", "--shape", shape, "-o", path, "-t", "2"], capture_output=True, text=True)
            if r.returncode == 0 and os.path.exists(path):
                return "tern synth"
            why = "tern synth failed: " + ((r.stderr or r.stdout).strip().splitlines() or ["?"])[-1][:80]
        except OSError as e:
            why = str(e)
    write_shape(shape, path)
    return "python writer (%s)" % why

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape")
    ap.add_argument("--all", action="store_true")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("-o", "--out")
    args = ap.parse_args()
    if args.list:
        print("\n".join(SHAPES))
        return 0
    if args.all:
        os.makedirs(args.out, exist_ok=True)
        for s in SHAPES:
            p = write_shape(s, os.path.join(args.out, s + ".gguf"))
            print(p, os.path.getsize(p))
        return 0
    if not args.shape or not args.out:
        ap.error("--shape NAME -o FILE (or --all -o DIR, or --list)")
    write_shape(args.shape, args.out)
    print(args.out, os.path.getsize(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
