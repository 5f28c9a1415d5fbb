"""test_qat_lora_torch_oracle.py: `tern finetune --lora --qat TYPE` (QAT of a LoRA fine-tune:
the forward runs W_q = Q(W0 + s B A) for the adapted matrices and Q(W0) for the rest) against an
independent numpy quantizer and PyTorch float64 autograd.

On a fresh model whose rows fit every block size (n_embd 256, 2 layers, 4 heads, 2 kv heads,
n_ff 512, the 512-token vocabulary of stories260K; built with `tern train --steps 0`), three
cases: q4_0 with targets q,k,v,o,gate,up,down; q8_0 with q,v,down,output; q4_0 with learned
scales (--qat-lsq) and targets q,k,v,o,gate,up,down. Each: `tern finetune --qat TYPE --steps 3`
(so that B != 0), then `--resume --dump-grads G` at that adapter:

  (a) the merge: the dump's NAME.qat_merged is W0 + (alpha / rank) B A (float64 from the
      adapter file) within 1e-6 relative (it is f32);
  (b) the forward's weights: numpy's own q4_0 / q8_0 quantizers (ggml's float32 rules, from
      test_qat_torch_oracle.py) of the merged weights, or of W0 for the matrices not adapted,
      equal the dump's NAME.qat_weight bit for bit; with LSQ, f16(s) * clamp(round(w / f16(s)))
      at the dump's scales (at most 1e-4 of the weights may differ: w / s within rounding of a
      tie). Tensors numpy does not model (the q6_k output under q4_0) take tern's values;
  (c) the gradients: torch float64 autograd of the mean cross-entropy with each adapted matrix
      W = M * mask + (W_q - M * mask).detach(), M = W0 + s B A a function of the leaves A and B
      and mask numpy's clip mask (the straight-through estimator, clipped), the others W_q as
      constants (LSQ: LSQ's graph with the scales as leaves) must give the loss within 1e-4
      relative and every dL/dA, dL/dB (and LSQ's dL/ds, times its gradient scale) within 1e-4
      (||g_tern - g_torch|| / ||g_torch||);
  (d) the export: the merged, quantized file the 3-step run wrote decodes to the dump's forward
      weights (taken at the same adapter) bit for bit, for every q4_0 / q8_0 tensor.

Run:   TERN_BINARY=build/release/tern /usr/bin/python3 tests/py/test_qat_lora_torch_oracle.py [--keep DIR]
Exit:  0 passed, 1 failed, 77 skipped (no torch, no ../shared model, or no `tern finetune`).
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
import test_qat_torch_oracle as Q  # noqa: E402  (its numpy quantizers and fresh model)
import train_torch_ref as R  # noqa: E402
from gguf_np import read_gguf, tensor_types  # noqa: E402
from test_qat_torch_oracle import GRAD_TOL, LOSS_TOL, THREADS, B, T  # noqa: E402  (T: Q.make_init's context)
from train_torch_ref import KIND_TENSOR, TERN, run  # noqa: E402

RANK, ALPHA = 4, 8.0
MERGE_TOL = 1e-6


def target_names(targets, n_layer):
    names = []
    for t in targets.split(","):
        if t == "output":
            names.append("output.weight")
        else:
            names += [f"blk.{il}.{KIND_TENSOR[t]}.weight" for il in range(n_layer)]
    return names


def check(label, qat, lsq, targets, init, data, d):
    fails = 0
    adapter = os.path.join(d, f"adapter_{label}.gguf")
    export = os.path.join(d, f"adapter_{label}-merged.gguf")
    common = [TERN, "finetune", "--lora", "-m", init, "--data", data, "--ctx", str(T), "--batch", str(B),
              "--no-shuffle", "--rank", str(RANK), "--alpha", str(ALPHA), "--targets", targets, "-t", THREADS,
              "--qat", qat, "--qat-out", export, "-q", "-o", adapter] + (["--qat-lsq"] if lsq else [])
    run(common + ["--steps", "3", "--lr", "1e-2", "--warmup", "0"])
    grads = os.path.join(d, f"grads_{label}.gguf")
    run(common + ["--steps", "4", "--resume", "--dump-grads", grads])
    _, tg = read_gguf(grads)
    hp, _, P = R.load_model(init, torch.float64)
    meta, ad = read_gguf(adapter)
    alpha = float(meta["adapter.lora.alpha"])
    s = alpha / RANK
    adapted = target_names(targets, hp.n_layer)
    leaves = {}
    for n in adapted:
        A = torch.tensor(np.ascontiguousarray(ad[n + ".lora_a"]), dtype=torch.float64, requires_grad=True)
        Bm = torch.tensor(np.ascontiguousarray(ad[n + ".lora_b"]), dtype=torch.float64, requires_grad=True)
        leaves[n] = (A, Bm)

    # (a) the merge
    worst_merge = 0.0
    for n, (A, Bm) in leaves.items():
        want = (P[n] + s * (Bm @ A)).detach().numpy()
        got = np.asarray(tg[n + ".qat_merged"], dtype=np.float64)
        worst_merge = max(worst_merge, np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
    ok = worst_merge <= MERGE_TOL and float(np.abs(ad[adapted[0] + ".lora_b"]).max()) > 0
    fails += not ok
    print(f"{'ok  ' if ok else 'FAIL'} [{label}] merged weights = W0 + s B A: worst rel {worst_merge:.3g} "
          f"(limit {MERGE_TOL:g}; {len(leaves)} adapted)")

    # (b) forward weights, and the torch graph of (c)
    quant = Q.QUANTIZERS[qat]
    group, qmin, qmax = Q.LSQ.get(qat, (0, 0, 0))
    Pq = {}
    scale_leaves = {}
    differ_total = limit_total = 0
    for n in list(P):
        if P[n].dim() < 2:
            Pq[n] = P[n]
            continue
        wq = np.asarray(tg[n + ".qat_weight"], dtype=np.float32)
        latent = np.asarray(tg[n + ".qat_merged"], dtype=np.float32) if n in leaves else \
            P[n].detach().numpy().astype(np.float32)
        if n in leaves:
            A, Bm = leaves[n]
            M = P[n] + s * (Bm @ A)
        else:
            M = P[n]
        if n + ".qat_scale" in tg:
            vals, q, mask, s16 = Q.lsq_forward(qat, latent, np.asarray(tg[n + ".qat_scale"]))
            differ = int(np.count_nonzero(vals != wq))
            limit = int(1e-4 * vals.size)
            sl = torch.tensor(s16.astype(np.float64), requires_grad=True)
            scale_leaves[n] = sl
            s_b = sl.reshape(-1, 1)
            v = M.reshape(-1, group) / s_b
            vc = torch.clamp(v, qmin, qmax)
            qn = torch.tensor(q.astype(np.float64)).reshape(-1, group)
            Pq[n] = (s_b * (vc + (qn - vc).detach())).reshape(M.shape)
        elif Q.modeled(qat, n):
            vals, mask = quant(latent)
            differ, limit = int(np.count_nonzero(vals != wq)), 0
            mk = torch.tensor(mask.astype(np.float64))
            wq_t = torch.tensor(wq.astype(np.float64))
            Pq[n] = M * mk + (wq_t - M * mk).detach()
        else:
            if n in leaves:
                print(f"FAIL [{label}] {n}: adapted, but numpy does not model its type")
                fails += 1
            Pq[n] = torch.tensor(wq.astype(np.float64))
            continue
        differ_total += differ
        limit_total += limit
        if differ > limit:
            print(f"FAIL [{label}] {n}: {differ} of {vals.size} forward weights differ from numpy (limit {limit})")
            fails += 1
    print(f"{'ok  ' if differ_total <= limit_total else 'FAIL'} [{label}] forward weights: {differ_total} differ from "
          f"numpy's quantization of the merged (adapted) or base weights (limit {limit_total})")

    # (c) the gradients
    S = R.token_stream(TERN, init, open(data, "rb").read())
    mb = R.micro_batch(R.make_windows(S, T), 0, B)
    tw = np.asarray(tg["train.windows"]).reshape(B, T + 1).round().astype(np.int64)
    if not np.array_equal(tw, mb.numpy()):
        print(f"FAIL [{label}] tern's first micro-batch differs from the windows built here")
        return fails + 1
    loss = R.loss_fn(hp, Pq, mb)
    loss.backward()
    fails += R.check_dump_loss(label, tg, loss.item(), LOSS_TOL)
    worst = 0.0
    for n, (A, Bm) in leaves.items():
        for suffix, leaf in ((".lora_a", A), (".lora_b", Bm)):
            gt = leaf.grad.numpy()
            gg = np.asarray(tg[n + suffix], dtype=np.float64)
            nrm = np.linalg.norm(gt)
            r = np.linalg.norm(gg - gt) / max(nrm, 1e-30)
            worst = max(worst, r)
            if r > GRAD_TOL or nrm == 0.0:
                print(f"FAIL [{label}] {n}{suffix}: gradient rel L2 {r:.3g} (|g| {nrm:.3g})")
                fails += 1
    msg = f"dL/dA, dL/dB worst rel L2 {worst:.3g}"
    if scale_leaves:
        g_scale = 1.0 / np.sqrt(group * qmax)
        worst_s = 0.0
        for n, sl in scale_leaves.items():
            gs_t = sl.grad.numpy() * g_scale
            gs = np.asarray(tg[n + ".qat_scale_grad"], dtype=np.float64)
            rs = np.linalg.norm(gs - gs_t) / max(np.linalg.norm(gs_t), 1e-30)
            worst_s = max(worst_s, rs)
            if rs > GRAD_TOL:
                print(f"FAIL [{label}] {n}: scale gradient rel L2 {rs:.3g}")
                fails += 1
        msg += f", scales ({len(scale_leaves)} tensors, adapted or not) {worst_s:.3g}"
    print(f"{'ok  ' if fails == 0 else 'FAIL'} [{label}] {msg} (limit {GRAD_TOL})")

    # (d) the 3-step run's export holds the forward's weights at that adapter (the dump's).
    _, ex = read_gguf(export, skip_unknown=True)
    types = tensor_types(export)  # ggml type ids: q4_0 2, q8_0 8
    bad = n_checked = 0
    for n in P:
        if P[n].dim() < 2 or types.get(n) not in (2, 8):
            continue
        n_checked += 1
        if not np.array_equal(np.asarray(ex[n], dtype=np.float32), np.asarray(tg[n + ".qat_weight"], dtype=np.float32)):
            print(f"FAIL [{label}] export: {n} differs from the forward's weights")
            bad += 1
    ok = bad == 0 and n_checked > 0
    fails += not ok
    print(f"{'ok  ' if ok else 'FAIL'} [{label}] export: {n_checked} q4_0 / q8_0 tensors decode to the forward's "
          f"weights bit for bit ({bad} differ)")
    return fails


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep", help="keep the work files here")
    args = ap.parse_args()
    skip = R.skip_reason("finetune")
    if skip:
        print(f"SKIP: {skip}")
        return 77

    def body(d):
        data, init = Q.make_init(d, 2)
        return sum(check(label, qat, lsq, targets, init, data, d)
                   for label, qat, lsq, targets in (("q4_0", "q4_0", False, "q,k,v,o,gate,up,down"),
                                                    ("q8_0", "q8_0", False, "q,v,down,output"),
                                                    ("lsq-q4_0", "q4_0", True, "q,k,v,o,gate,up,down")))
    return R.run_in_workdir(args.keep, "tern_qat_lora_", body)


if __name__ == "__main__":
    sys.exit(main())
