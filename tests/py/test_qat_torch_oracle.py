"""test_qat_torch_oracle.py: `tern train --qat TYPE` against an independent numpy quantizer and
PyTorch autograd.

For TYPE in q8_0, q4_0 and ternary, on a fresh model whose rows fit every block size (n_embd 256,
1 layer, 4 heads, 2 kv heads, n_ff 512, the 512-token vocabulary of stories260K):

  (a) the forward's weights. `tern train --qat TYPE --dump-grads G` writes each quantized tensor's
      forward weights (NAME.qat_weight). numpy computes them from the latent weights with its own
      implementation of ggml's reference quantizers (q8_0, q4_0: bit for bit) and of BitNet b1.58's
      absmean ternarization per 256 weights (d = f16(mean |w|), q = clamp(round(w / d), -1, 1)):
      equal bit for bit (ternary: at most 1e-4 of the weights may differ, where w / d is within
      rounding of a tie). Tensors numpy does not model (q6_k / q4_k outputs and embeddings that
      llama-quantize's rules give) take tern's values; their codecs are checked byte-exact against
      llama.cpp in test_quant_llamacpp.py.
  (b) the straight-through gradients. torch float64 autograd of the mean cross-entropy at the
      forward weights, times numpy's clip mask (0 where the weight lies more than 5/8 of a step
      beyond its group's extreme quantized values: half a step of rounding and 1/8 for the f16
      scale's own rounding; ternary: |w| > 1.5 d), must give the loss
      within 1e-4 relative and every tensor's gradient within 1e-4 (||g_tern - g_torch|| /
      ||g_torch||).
  (c) the export. Three QAT steps, then the quantized file (--qat-out) must hold exactly numpy's
      quantization of the checkpoint's latent weights (q8_0, q4_0 and tq2_0 tensors decoded by
      numpy, bit for bit).

And with learned scales (--qat-lsq, LSQ), for q4_0 and ternary:

  (d) the dump's block scales s give the forward weights f16(s) * clamp(round(w / f16(s)), qmin,
      qmax) (numpy, bit for bit); torch float64 autograd through LSQ's graph (the STE on round,
      clamp's gradient, LSQ's gradient scale 1 / sqrt(block * qmax)) gives the latent weights' and
      the scales' gradients within 1e-4 (rel L2) of tern's; after 3 steps the exported file's
      blocks are its scales times the latent weights' codes under them.

Run:   TERN_BINARY=build/release/tern /usr/bin/python3 tests/py/test_qat_torch_oracle.py [--keep DIR]
Exit:  0 passed, 1 failed, 77 skipped (no torch, no ../shared model, or no `tern train`).
"""
import argparse
import os
import sys

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"SKIP: {e} (use Debian's /usr/bin/python3 with python3-torch)")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import train_torch_ref as R  # noqa: E402
from train_torch_ref import TERN, run  # noqa: E402
from gguf_np import read_gguf  # noqa: E402

THREADS = "2"
T, B = 32, 3
GRAD_TOL = 1e-4
LOSS_TOL = 1e-4


def f16(x):
    return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


# ---- numpy quantizers (ggml's reference rules, evaluated in float32 as ggml does) -------------

def q8_0(w):
    """rows [n, k] -> (values, mask); ggml: d = amax / 127, q = roundf(x / d) (half away from zero)."""
    x = w.astype(np.float32).reshape(-1, 32)
    amax = np.abs(x).max(axis=1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = (x * idv[:, None]).astype(np.float32)
    q = np.trunc(v + np.copysign(np.float32(0.5), v))  # roundf
    vals = (q.astype(np.float32) * f16(d)[:, None]).astype(np.float32)
    return vals.reshape(w.shape), clip_mask(x, vals, 127).reshape(w.shape)


def q4_0(w):
    """ggml: max = the first value of largest |x|, d = max / -8, q = min(15, (int)(x / d + 8.5))."""
    x = w.astype(np.float32).reshape(-1, 32)
    idx = np.argmax(np.abs(x), axis=1)  # the first of equal maxima, as ggml's strict `<`
    mx = x[np.arange(x.shape[0]), idx]
    d = (mx / np.float32(-8)).astype(np.float32)
    with np.errstate(divide="ignore"):
        idv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = ((x * idv[:, None]).astype(np.float32) + np.float32(8.5)).astype(np.float32)
    q = np.minimum(15, np.trunc(v)).astype(np.int32)
    vals = ((q - 8).astype(np.float32) * f16(d)[:, None]).astype(np.float32)
    return vals.reshape(w.shape), clip_mask(x, vals, 8).reshape(w.shape)


def clip_mask(x, vals, qmax):
    """Symmetric codecs: a step is max |value| / qmax of the block; the gradient passes within 5/8
    of a step of the block's extreme values (half a step of rounding, 1/8 for the f16 scale)."""
    xg, vg = x.reshape(-1, 32), vals.reshape(-1, 32)
    lo, hi = vg.min(axis=1, keepdims=True), vg.max(axis=1, keepdims=True)
    h = np.float32(0.625) * (np.maximum(np.abs(lo), np.abs(hi)) / np.float32(qmax))
    return ((xg >= lo - h) & (xg <= hi + h)).reshape(x.shape)


def ternary(w):
    x = w.astype(np.float32).reshape(-1, 256)
    d = f16(np.abs(x.astype(np.float64)).mean(axis=1))
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(d[:, None] > 0, np.round(x / d[:, None]), 0)  # ties to even, as torch.round
    vals = (np.clip(r, -1, 1).astype(np.float32) * d[:, None]).astype(np.float32)
    mask = (d[:, None] <= 0) | (np.abs(x) <= np.float32(1.5) * d[:, None])
    return vals.reshape(w.shape), mask.reshape(w.shape)


QUANTIZERS = {"q8_0": q8_0, "q4_0": q4_0, "ternary": ternary}


def modeled(qat, name):
    """Whether numpy models `name`'s type under --qat qat (llama-quantize's rules)."""
    if qat == "q8_0":
        return True                       # every matrix q8_0, the output too
    if name == "output.weight":
        return False                      # q6_k
    if qat == "ternary" and name == "token_embd.weight":
        return False                      # q4_k (llama.cpp's rule for TQ1_0 / TQ2_0)
    return True


def check(qat, init, data, d):
    fails = 0
    grads = os.path.join(d, f"grads_{qat}.gguf")
    run([TERN, "train", "-m", init, "--data", data, "--ctx", str(T), "--batch", str(B), "--no-shuffle", "-t", THREADS,
         "--qat", qat, "--dump-grads", grads, "-o", os.path.join(d, f"unused_{qat}.gguf")])
    _, tg = read_gguf(grads)
    _, latent = read_gguf(init)
    hp, _, P = R.load_model(init, torch.float64)
    quant = QUANTIZERS[qat]
    masks = {}
    for n in list(P):
        if P[n].dim() < 2:
            continue
        key = n + ".qat_weight"
        if key not in tg:
            print(f"FAIL [{qat}] {n}: no {key} in the dump")
            fails += 1
            continue
        wt = np.asarray(tg[key], dtype=np.float32)
        if modeled(qat, n):
            vals, mask = quant(np.asarray(latent[n], dtype=np.float32))
            differ = int(np.count_nonzero(vals != wt))
            limit = int(1e-4 * vals.size) if qat == "ternary" else 0
            ok = differ <= limit
            fails += not ok
            print(f"{'ok  ' if ok else 'FAIL'} [{qat}] {n:28s} forward weights: {differ} of {vals.size} differ "
                  f"from numpy (limit {limit}); {int(np.count_nonzero(~mask))} clipped")
            masks[n] = mask
        else:
            print(f"     [{qat}] {n:28s} forward weights: tern's (type not modelled here)")
            masks[n] = None
        with torch.no_grad():
            P[n].copy_(torch.tensor(wt, dtype=torch.float64))
    windows = R.make_windows(R.token_stream(TERN, init, open(data, "rb").read()), T)
    loss, G = R.grads(hp, P, R.micro_batch(windows, 0, B))
    fails += R.check_dump_loss(qat, tg, loss, LOSS_TOL)
    worst = 0.0
    for n, g in G.items():
        gt = g.numpy()
        if masks.get(n) is not None:
            gt = gt * masks[n]
        gg = np.asarray(tg[n], dtype=np.float64)
        if masks.get(n) is None and n in masks:
            # The clip mask of a type numpy does not model: tern's zeros must be where it clipped.
            gt = np.where(gg == 0, 0.0, gt)
        r = np.linalg.norm(gg - gt) / max(np.linalg.norm(gt), 1e-30)
        worst = max(worst, r)
        if r > GRAD_TOL:
            print(f"FAIL [{qat}] {n}: gradient rel L2 {r:.3g}")
            fails += 1
    print(f"{'ok  ' if fails == 0 else 'FAIL'} [{qat}] straight-through gradients: worst rel L2 {worst:.3g} "
          f"(limit {GRAD_TOL})")

    # (c) three steps, then the export against numpy's quantization of the latent checkpoint.
    ck = os.path.join(d, f"ck_{qat}.gguf")
    out = os.path.join(d, f"ck_{qat}-exported.gguf")
    run([TERN, "train", "-m", init, "--data", data, "--ctx", str(T), "--batch", str(B), "--steps", "3", "--lr", "1e-3",
         "-t", THREADS, "--qat", qat, "--qat-out", out, "-o", ck, "-q"])
    _, lat = read_gguf(ck)
    _, ex = read_gguf(out, skip_unknown=True)
    bad = total = 0
    for n in masks:
        if not modeled(qat, n):
            continue
        vals, _ = quant(np.asarray(lat[n], dtype=np.float32))
        bad += int(np.count_nonzero(vals != np.asarray(ex[n], dtype=np.float32)))
        total += vals.size
    limit = int(1e-4 * total) if qat == "ternary" else 0  # ternary: w / d within rounding of a tie
    ok = bad <= limit
    fails += not ok
    print(f"{'ok  ' if ok else 'FAIL'} [{qat}] export after 3 steps: {bad} weights differ from numpy's "
          f"quantization of the latent checkpoint (limit {limit})")
    return fails


LSQ = {"q4_0": (32, -8, 7), "ternary": (256, -1, 1)}


def lsq_forward(qat, w, scales):
    """(values, q, mask) of LSQ's forward at the dumped scales, in float32 as tern computes it."""
    group, qmin, qmax = LSQ[qat]
    x = w.astype(np.float32).reshape(-1, group)
    s16 = f16(scales.astype(np.float32)).reshape(-1, 1)
    s16 = np.where(s16 > 0, s16, np.float32(2.0 ** -24))
    v = (x / s16).astype(np.float32)
    q = np.clip(np.round(v), qmin, qmax).astype(np.float32)
    vals = (s16 * q).astype(np.float32) + np.float32(0)
    mask = (v >= qmin) & (v <= qmax)
    return vals.reshape(w.shape), q.reshape(w.shape), mask.reshape(w.shape), s16.reshape(-1)


def check_lsq(qat, init, data, d):
    fails = 0
    group, qmin, qmax = LSQ[qat]
    grads = os.path.join(d, f"grads_lsq_{qat}.gguf")
    run([TERN, "train", "-m", init, "--data", data, "--ctx", str(T), "--batch", str(B), "--no-shuffle", "-t", THREADS,
         "--qat", qat, "--qat-lsq", "--dump-grads", grads, "-o", os.path.join(d, f"unused_lsq_{qat}.gguf")])
    _, tg = read_gguf(grads)
    _, latent = read_gguf(init)
    hp, _, P = R.load_model(init, torch.float64)
    lsq_leaves = {}
    for n in list(P):
        if P[n].dim() < 2:
            continue
        wt = np.asarray(tg[n + ".qat_weight"], dtype=np.float32)
        if n + ".qat_scale" not in tg:  # a codec tensor of the plan (q6_k output, q4_k embedding)
            with torch.no_grad():
                P[n].copy_(torch.tensor(wt, dtype=torch.float64))
            continue
        w = np.asarray(latent[n], dtype=np.float32)
        vals, q, mask, s16 = lsq_forward(qat, w, np.asarray(tg[n + ".qat_scale"]))
        differ = int(np.count_nonzero(vals != wt))
        limit = int(1e-4 * vals.size)
        ok = differ <= limit
        fails += not ok
        print(f"{'ok  ' if ok else 'FAIL'} [lsq {qat}] {n:28s} forward weights: {differ} of {vals.size} differ "
              f"(limit {limit}); {int(np.count_nonzero(~mask))} clipped")
        wl = torch.tensor(w.astype(np.float64), requires_grad=True)
        sl = torch.tensor(s16.astype(np.float64), requires_grad=True)
        lsq_leaves[n] = (wl, sl, torch.tensor(q.astype(np.float64)))
    # LSQ's graph in float64: W_q = s * (v_c + (q - v_c).detach()), v_c = clamp(w / s, qmin, qmax).
    Pq = dict(P)
    for n, (wl, sl, qn) in lsq_leaves.items():
        s_b = sl.reshape(-1, 1)
        v = wl.reshape(-1, group) / s_b
        vc = torch.clamp(v, qmin, qmax)
        Pq[n] = (s_b * (vc + (qn.reshape(-1, group) - vc).detach())).reshape(wl.shape)
    windows = R.make_windows(R.token_stream(TERN, init, open(data, "rb").read()), T)
    loss = R.loss_fn(hp, Pq, R.micro_batch(windows, 0, B))
    loss.backward()
    fails += R.check_dump_loss(f"lsq {qat}", tg, loss.item(), LOSS_TOL)
    g_scale = 1.0 / np.sqrt(group * qmax)
    worst_w = worst_s = 0.0
    for n, (wl, sl, _) in lsq_leaves.items():
        gw = np.asarray(tg[n], dtype=np.float64)
        rw = np.linalg.norm(gw - wl.grad.numpy()) / max(np.linalg.norm(wl.grad.numpy()), 1e-30)
        gs_t = sl.grad.numpy() * g_scale
        gs = np.asarray(tg[n + ".qat_scale_grad"], dtype=np.float64)
        rs = np.linalg.norm(gs - gs_t) / max(np.linalg.norm(gs_t), 1e-30)
        worst_w, worst_s = max(worst_w, rw), max(worst_s, rs)
        if rw > GRAD_TOL or rs > GRAD_TOL:
            print(f"FAIL [lsq {qat}] {n}: weight gradient rel L2 {rw:.3g}, scale gradient {rs:.3g}")
            fails += 1
    print(f"{'ok  ' if fails == 0 else 'FAIL'} [lsq {qat}] gradients: weights worst rel L2 {worst_w:.3g}, "
          f"scales {worst_s:.3g} (limit {GRAD_TOL})")

    # The export after 3 steps: every q4_0 block is its f16 scale times the latent weights' codes
    # under that scale.
    ck = os.path.join(d, f"ck_lsq_{qat}.gguf")
    out = os.path.join(d, f"ck_lsq_{qat}-exported.gguf")
    run([TERN, "train", "-m", init, "--data", data, "--ctx", str(T), "--batch", str(B), "--steps", "3", "--lr", "1e-3",
         "-t", THREADS, "--qat", qat, "--qat-lsq", "--qat-out", out, "-o", ck, "-q"])
    if qat == "q4_0":
        _, lat = read_gguf(ck)
        _, ex = read_gguf(out, skip_unknown=True)
        bad = 0
        for n in lsq_leaves:
            e = np.asarray(ex[n], dtype=np.float32).reshape(-1, group)
            w = np.asarray(lat[n], dtype=np.float32).reshape(-1, group)
            # Each block's scale, recovered exactly: its largest |value| over its largest |code| (<= 8).
            for b in range(e.shape[0]):
                nz = e[b][e[b] != 0]
                if nz.size == 0:
                    continue
                cand = [np.abs(nz).max() / k for k in range(8, 0, -1)]
                ok_b = False
                for sc in cand:
                    sc = np.float32(sc)
                    if f16(sc) != sc:
                        continue
                    q = np.clip(np.round((w[b] / sc).astype(np.float32)), qmin, qmax)
                    if np.array_equal((sc * q).astype(np.float32), e[b]):
                        ok_b = True
                        break
                bad += not ok_b
        ok = bad == 0
        fails += not ok
        print(f"{'ok  ' if ok else 'FAIL'} [lsq {qat}] export after 3 steps: {bad} blocks are not an f16 scale times "
              f"the latent weights' codes")
    return fails


def make_init(d, n_layer):
    """The oracles' data (60 documents) and fresh model (n_embd 256, N_LAYER layers, 4 heads, 2 kv
    heads, n_ff 512, stories260K's vocabulary: rows that fit every block size) in d -> (data, init)."""
    data = os.path.join(d, "data.txt")
    R.write_docs(data, 60)
    init = os.path.join(d, "init.gguf")
    run([TERN, "train", "--vocab-from", R.MODEL, "--n-embd", "256", "--n-layer", str(n_layer), "--n-head", "4",
         "--n-head-kv", "2", "--n-ff", "512", "--ctx", str(T), "--steps", "0", "--seed", "7", "-t", THREADS,
         "--data", data, "-o", init, "-q"])
    return data, init


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", help="keep the work files here")
    ap.add_argument("--only", help="comma-separated subset of q8_0,q4_0,ternary,lsq-q4_0,lsq-ternary")
    args = ap.parse_args()
    skip = R.skip_reason("train")
    if skip:
        print(f"SKIP: {skip}")
        return 77
    types = args.only.split(",") if args.only else ["q8_0", "q4_0", "ternary", "lsq-q4_0", "lsq-ternary"]

    def body(d):
        data, init = make_init(d, 1)
        return sum(check_lsq(q[4:], init, data, d) if q.startswith("lsq-") else check(q, init, data, d)
                   for q in types)
    return R.run_in_workdir(args.keep, "tern_qat_", body)


if __name__ == "__main__":
    sys.exit(main())
