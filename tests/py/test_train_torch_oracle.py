"""test_train_torch_oracle.py: `tern train` against an independent PyTorch implementation
(tests/py/train_torch_ref.py) of the same model, data packing and AdamW loop.

  (a) gradients. `tern train --dump-grads G.gguf` writes d(loss)/d(tensor) of the first micro-batch
      at the initial weights (tensors named as the model's, F32) and `train.loss`. Torch float64
      autograd on the same windows must give the loss within 1e-4 relative and, for every tensor,
      ||g_tern - g_torch|| / ||g_torch|| <= 1e-4. Two models: stories260K.gguf (ctx 64, batch 4),
      and a fresh GQA/odd-shape model (n_embd 48, 2 layers, 6 heads, 2 kv heads, n_ff 100) written
      by `tern train --vocab-from ... --steps 0 -o INIT.gguf` (ctx 32, batch 4), and a tied-output
      multi-query one (n_embd 40, 1 layer, 5 heads, 1 kv head, n_ff 72, --tied; ctx 24, batch 3).
      And a structured-pruned-like one written here (n_embd 48, head_dim 8 = key_length, layer 0:
      3 heads / 1 kv head / n_ff 40 with attn_output.bias and ffn_down.bias, layer 1: 6 / 2 / 100
      with ffn_down.bias; ctx 24, batch 3): per-layer shapes and the biases' gradients. On that
      model as a frozen base, `tern finetune --lora` (every target, rank 3, alpha 6; 3 steps so
      that B != 0, then --resume --dump-grads) against torch float64 autograd of the adapter's
      A and B on the same micro-batch (train.windows), within the same bounds.
  (b) the loss curve. 50 AdamW steps (batch 4, grad-accum 2, ctx 64, warmup 5 + cosine to min-lr,
      weight decay 0.1 on 2-D tensors, betas 0.9/0.95, clip 1.0, --no-shuffle) from stories260K:
      torch float32 from the same weights and data order must give every step's loss within
      1e-3 * max(1, |loss|) (absolute below loss 1, relative above), the same lr (1e-6 relative),
      and a grad_norm within 1e-2 relative; the written model's tensors must be within 1e-2
      (||w_tern - w_torch|| / ||w_torch||, per tensor) of torch's final parameters. The same, 10
      steps, on the pruned-like model (its biases trained without weight decay); its written
      model must keep the per-layer keys (i32 arrays) and key_length.

Data: the first 120 blank-line-separated documents (about 40 stories) of ../shared/data/tinystories/tinystories_val.txt.
Run:   TERN_BINARY=build/release/tern /usr/bin/python3 tests/py/test_train_torch_oracle.py
       [--only grads|curve] [--keep DIR] [--dtype float64]   (--dtype: the curve's torch precision)
Exit:  0 passed, 1 failed, 77 skipped (no torch, no ../shared model, or no `tern train`).
About 20-40 s on 2 cores.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError as e:
    print(f"SKIP: {e} (use Debian's /usr/bin/python3 with python3-torch)")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import train_torch_ref as R  # noqa: E402
from train_torch_ref import MODEL, TERN, run  # noqa: E402
from gguf_np import read_gguf  # noqa: E402

N_DOCS = 120  # blank-line-separated paragraphs: about 40 stories
THREADS = "2"

GRAD_TOL = 1e-4
LOSS_TOL_A = 1e-4
CURVE_TOL = 1e-3
GNORM_TOL = 1e-2
FINAL_TOL = 1e-2


def write_data(path):
    R.write_docs(path, N_DOCS)


def windows_for(model, data, T):
    S = R.token_stream(TERN, model, open(data, "rb").read())
    return R.make_windows(S, T), len(S)


def check_grads(label, model, data, T, B, d):
    out = os.path.join(d, f"grads_{label}.gguf")
    run([TERN, "train", "-m", model, "--data", data, "--ctx", str(T), "--batch", str(B), "--no-shuffle",
         "-t", THREADS, "--dump-grads", out, "-o", os.path.join(d, f"unused_{label}.gguf")])
    _, tg = read_gguf(out)
    hp, _, P = R.load_model(model, torch.float64)
    windows, n_tok = windows_for(model, data, T)
    mb = R.micro_batch(windows, 0, B)
    loss, G = R.grads(hp, P, mb)
    print(f"[grads {label}] {hp}; {n_tok} tokens, {windows.shape[0]} windows of {T}; batch {B}")
    fails = 0
    if "train.loss" not in tg:
        print(f"FAIL [grads {label}] no train.loss tensor in {out}")
        fails += 1
    else:
        fails += R.check_dump_loss(f"grads {label}", tg, loss, LOSS_TOL_A)
    extra = sorted(set(tg) - set(G) - {"train.loss"})
    missing = sorted(set(G) - set(tg))
    if extra or missing:
        print(f"FAIL [grads {label}] tensor names differ: missing {missing} extra {extra}")
        fails += 1
    print(f"  {'tensor':28s} {'shape':>12s} {'rel L2':>10s} {'max rel':>10s} {'|g| torch':>10s}")
    worst = 0.0
    for n in G:
        if n not in tg:
            continue
        gt = G[n].numpy()
        gg = np.asarray(tg[n], dtype=np.float64)
        if gg.shape != gt.shape:
            print(f"FAIL [grads {label}] {n}: shape {gg.shape}, want {gt.shape}")
            fails += 1
            continue
        nrm = np.linalg.norm(gt)
        rel = np.linalg.norm(gg - gt) / max(nrm, 1e-30)
        mrel = np.abs(gg - gt).max() / max(np.abs(gt).max(), 1e-30)  # max |diff| over max |g|
        worst = max(worst, rel)
        bad = rel > GRAD_TOL
        fails += bad
        print(f"  {n:28s} {str(gt.shape):>12s} {rel:10.3g} {mrel:10.3g} {nrm:10.3g}{'  FAIL' if bad else ''}")
    print(f"{'ok  ' if fails == 0 else 'FAIL'} [grads {label}] worst tensor rel L2 error {worst:.3g} "
          f"(bound {GRAD_TOL:g})")
    return fails


def check_lora_grads(label, model, data, T, B, d):
    """LoRA on a frozen base with per-layer shapes and biases: each adapter's n_in / n_out are its
    layer's, the biases are applied (the loss) and not trained."""
    adapter = os.path.join(d, f"adapter_{label}.gguf")
    rank, alpha = 3, 6.0
    common = [TERN, "finetune", "--lora", "-m", model, "--data", data, "--ctx", str(T), "--batch", str(B),
              "--no-shuffle", "--rank", str(rank), "--alpha", str(alpha), "--targets", "q,k,v,o,gate,up,down,output",
              "-t", THREADS, "-q", "-o", adapter]
    run(common + ["--steps", "3", "--lr", "1e-2", "--warmup", "0"])  # B != 0 (else A's gradient is 0)
    grads = os.path.join(d, f"grads_{label}.gguf")
    run(common + ["--steps", "4", "--resume", "--dump-grads", grads])
    _, tg = read_gguf(grads)
    hp, _, P = R.load_model(model, torch.float64)
    for p in P.values():
        p.requires_grad_(False)
    _, ta = read_gguf(adapter)
    L = {}
    for n in ta:
        if n.endswith(".lora_a"):
            L[n[:-7]] = tuple(torch.tensor(np.ascontiguousarray(ta[n[:-7] + s]), dtype=torch.float64).requires_grad_(True)
                              for s in (".lora_a", ".lora_b"))
    mb = torch.tensor(np.asarray(tg["train.windows"]).reshape(B, T + 1).round().astype(np.int64))
    logits = R.forward_logits(hp, P, mb[:, :-1], lora=L, alpha=alpha)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), mb[:, 1:].reshape(-1))
    loss.backward()
    fails = 0
    tl = float(np.asarray(tg["train.loss"]).reshape(-1)[0])
    rel = abs(tl - loss.item()) / abs(loss.item())
    fails += rel > LOSS_TOL_A
    print(f"{'ok  ' if rel <= LOSS_TOL_A else 'FAIL'} [lora {label}] {len(L)} adapted tensors; loss tern {tl:.8f} "
          f"torch {loss.item():.8f} rel {rel:.3g}")
    worst = 0.0
    for base, (A, Bm) in L.items():
        for n, gt in ((base + ".lora_a", A.grad), (base + ".lora_b", Bm.grad)):
            if n not in tg or np.asarray(tg[n]).shape != tuple(gt.shape):
                print(f"FAIL [lora {label}] {n}: missing or shape {np.asarray(tg.get(n, [])).shape}, want {tuple(gt.shape)}")
                fails += 1
                continue
            g = gt.numpy()
            nrm = np.linalg.norm(g)
            r = np.linalg.norm(np.asarray(tg[n], dtype=np.float64) - g) / max(nrm, 1e-30)
            worst = max(worst, r)
            bad = r > GRAD_TOL or nrm == 0.0
            fails += bad
            if bad:
                print(f"  {n:34s} {str(g.shape):>10s} rel L2 {r:9.3g}  |g| {nrm:9.3g}  FAIL")
    print(f"{'ok  ' if fails == 0 else 'FAIL'} [lora {label}] worst tensor rel L2 error {worst:.3g} (bound {GRAD_TOL:g})")
    return fails


def parse_steps(stdout):
    recs = []
    for line in stdout.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            o = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(o, dict) and "step" in o:
            recs.append(o)
    return recs


def write_pruned_model(path):
    """A llama model whose layers differ as structured pruning leaves them: per-layer head counts
    and FFN widths (i32 arrays), head_dim 8 given as key_length (n_embd / head_count(0) is 16),
    FLaP's output-projection biases on some layers; stories260K's tokenizer, random weights."""
    meta_v, tv = read_gguf(MODEL)
    V, E, hd = int(tv["token_embd.weight"].shape[0]), 48, 8
    nh, nkv, nff = [3, 6], [1, 2], [40, 100]
    rng = np.random.default_rng(11)
    P = {"token_embd.weight": rng.normal(0, 0.5, (V, E))}
    for il in range(2):
        p = f"blk.{il}."
        P[p + "attn_norm.weight"] = 1 + rng.normal(0, 0.1, E)
        P[p + "attn_q.weight"] = rng.normal(0, 0.15, (nh[il] * hd, E))
        P[p + "attn_k.weight"] = rng.normal(0, 0.15, (nkv[il] * hd, E))
        P[p + "attn_v.weight"] = rng.normal(0, 0.15, (nkv[il] * hd, E))
        P[p + "attn_output.weight"] = rng.normal(0, 0.15, (E, nh[il] * hd))
        if il == 0:
            P[p + "attn_output.bias"] = rng.normal(0, 0.2, E)
        P[p + "ffn_norm.weight"] = 1 + rng.normal(0, 0.1, E)
        P[p + "ffn_gate.weight"] = rng.normal(0, 0.15, (nff[il], E))
        P[p + "ffn_up.weight"] = rng.normal(0, 0.15, (nff[il], E))
        P[p + "ffn_down.weight"] = rng.normal(0, 0.15, (E, nff[il]))
        P[p + "ffn_down.bias"] = rng.normal(0, 0.2, E)
    P["output_norm.weight"] = 1 + rng.normal(0, 0.1, E)
    P["output.weight"] = rng.normal(0, 0.1, (V, E))
    a = "llama."
    meta = {a + "context_length": 64, a + "embedding_length": E, a + "block_count": 2,
            a + "feed_forward_length": nff, a + "attention.head_count": nh, a + "attention.head_count_kv": nkv,
            a + "attention.key_length": hd, a + "attention.value_length": hd, a + "rope.dimension_count": hd,
            a + "rope.freq_base": 10000.0, a + "attention.layer_norm_rms_epsilon": 1e-5}
    R.write_llama_gguf(path, MODEL, meta, P)


def check_pruned_keys(path):
    """The per-layer keys and the biases survive `tern train`'s save."""
    meta, t = read_gguf(path)
    want = {"llama.attention.head_count": [3, 6], "llama.attention.head_count_kv": [1, 2],
            "llama.feed_forward_length": [40, 100], "llama.attention.key_length": 8}
    bad = {k: meta.get(k) for k, v in want.items() if meta.get(k) != v}
    biases = sorted(n for n in t if n.endswith(".bias"))
    ok = not bad and biases == ["blk.0.attn_output.bias", "blk.0.ffn_down.bias", "blk.1.ffn_down.bias"]
    print(f"{'ok  ' if ok else 'FAIL'} [curve pruned] written keys {'as given' if not bad else bad}; biases {biases}")
    return 0 if ok else 1


def check_curve(data, d, dtype, model=MODEL, steps=50, label="curve"):
    T, B, A = 64, 4, 2
    opt = dict(lr=1e-3, min_lr=1e-4, warmup=5, weight_decay=0.1, beta1=0.9, beta2=0.95, eps=1e-8, clip=1.0)
    out = os.path.join(d, f"out_{label.replace(' ', '_')}.gguf")
    cmd = [TERN, "train", "-m", model, "--data", data, "--ctx", str(T), "--batch", str(B), "--grad-accum", str(A),
           "--steps", str(steps), "--lr", "1e-3", "--min-lr", "1e-4", "--warmup", "5", "--weight-decay", "0.1",
           "--beta1", "0.9", "--beta2", "0.95", "--eps", "1e-8", "--clip", "1.0", "--no-shuffle", "--json",
           "-t", THREADS, "-o", out]
    r = run(cmd)
    got = parse_steps(r.stdout)
    hp, _, P = R.load_model(model, dtype)
    windows, n_tok = windows_for(model, data, T)
    want = R.train(hp, P, windows, steps, B, A, **opt)
    print(f"[{label}] {n_tok} tokens, {windows.shape[0]} windows of {T}; {steps} steps x {A} x {B}; torch {dtype}")
    fails = 0
    if [g["step"] for g in got] != list(range(1, steps + 1)):
        print(f"FAIL [{label}] tern printed steps {[g['step'] for g in got]}, want 1..{steps}")
        fails += 1
    by_step = {g["step"]: g for g in got}
    worst_loss = worst_lr = worst_gn = 0.0
    print(f"  {'step':>4s} {'loss tern':>10s} {'loss torch':>10s} {'diff':>9s} {'lr tern':>10s} {'gnorm tern':>10s} "
          f"{'gnorm torch':>11s}")
    for w in want:
        g = by_step.get(w["step"])
        if g is None:
            continue
        dl = abs(g["loss"] - w["loss"]) / max(1.0, abs(w["loss"]))
        dlr = abs(g["lr"] - w["lr"]) / w["lr"]
        dgn = abs(g["grad_norm"] - w["grad_norm"]) / max(w["grad_norm"], 1e-12)
        worst_loss, worst_lr, worst_gn = max(worst_loss, dl), max(worst_lr, dlr), max(worst_gn, dgn)
        bad = dl > CURVE_TOL or dlr > 1e-6 or dgn > GNORM_TOL
        fails += bad
        if bad or w["step"] <= 3 or w["step"] % 10 == 0:
            print(f"  {w['step']:4d} {g['loss']:10.6f} {w['loss']:10.6f} {dl:9.2e} {g['lr']:10.3e} "
                  f"{g['grad_norm']:10.5f} {w['grad_norm']:11.5f}{'  FAIL' if bad else ''}")
    print(f"{'ok  ' if worst_loss <= CURVE_TOL else 'FAIL'} [{label}] max loss diff {worst_loss:.3g} "
          f"(|d| / max(1, |loss|), bound {CURVE_TOL:g}); max lr rel diff {worst_lr:.3g}; "
          f"max grad_norm rel diff {worst_gn:.3g} (bound {GNORM_TOL:g})")
    if got:
        tok_s = [g.get("tok_s") for g in got if g.get("tok_s") is not None]
        if tok_s:
            print(f"  tern tok_s median {np.median(tok_s):.0f}")
    _, tw = read_gguf(out)
    worst_w = 0.0
    worst_name = ""
    for n, p in P.items():
        if n not in tw:
            print(f"FAIL [{label}] {n} missing from {out}")
            fails += 1
            continue
        a = p.detach().double().numpy()
        b = np.asarray(tw[n], dtype=np.float64)
        if a.shape != b.shape:
            print(f"FAIL [{label}] {n}: shape {b.shape}, want {a.shape}")
            fails += 1
            continue
        rel = np.linalg.norm(b - a) / np.linalg.norm(a)
        if rel > worst_w:
            worst_w, worst_name = rel, n
    ok = worst_w <= FINAL_TOL
    fails += not ok
    print(f"{'ok  ' if ok else 'FAIL'} [{label}] final weights: max per-tensor rel L2 diff {worst_w:.3g} ({worst_name}; "
          f"bound {FINAL_TOL:g})")
    if label != "curve":
        fails += check_pruned_keys(out)
    return fails


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["grads", "curve"])
    ap.add_argument("--keep", help="work in this directory and keep its files")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    a = ap.parse_args()
    skip = R.skip_reason("train")
    if skip:
        print(f"SKIP: {skip}")
        return 77
    torch.set_num_threads(1)  # robust on a loaded 2-core machine (OpenMP spinning); tern gets -t 2
    d = a.keep or tempfile.mkdtemp(prefix="tern_train_oracle_")
    os.makedirs(d, exist_ok=True)
    fails = 0
    try:
        data = os.path.join(d, "data.txt")
        write_data(data)
        if a.only in (None, "grads"):
            fails += check_grads("stories260K", MODEL, data, 64, 4, d)
            init = os.path.join(d, "init_gqa.gguf")
            run([TERN, "train", "--vocab-from", MODEL, "--n-embd", "48", "--n-layer", "2", "--n-head", "6",
                 "--n-head-kv", "2", "--n-ff", "100", "--ctx", "32", "--steps", "0", "--seed", "3", "-t", THREADS,
                 "--data", data, "-o", init])
            fails += check_grads("gqa-48x2", init, data, 32, 4, d)
            # tied output (token_embd's gradient sums both uses) and multi-query attention
            init = os.path.join(d, "init_mqa_tied.gguf")
            run([TERN, "train", "--vocab-from", MODEL, "--n-embd", "40", "--n-layer", "1", "--n-head", "5",
                 "--n-head-kv", "1", "--n-ff", "72", "--tied", "--ctx", "24", "--steps", "0", "--seed", "5",
                 "-t", THREADS, "--data", data, "-o", init])
            fails += check_grads("mqa-tied-40x1", init, data, 24, 3, d)
            # per-layer head counts / FFN widths, explicit head_dim, output-projection biases
            pruned = os.path.join(d, "pruned.gguf")
            write_pruned_model(pruned)
            fails += check_grads("pruned-48x2", pruned, data, 24, 3, d)
            fails += check_lora_grads("pruned-48x2", pruned, data, 24, 3, d)
        if a.only in (None, "curve"):
            fails += check_curve(data, d, torch.float64 if a.dtype == "float64" else torch.float32)
            pruned = os.path.join(d, "pruned.gguf")
            if not os.path.exists(pruned):
                write_pruned_model(pruned)
            fails += check_curve(data, d, torch.float64 if a.dtype == "float64" else torch.float32, pruned, 10,
                                 "curve pruned")
    except RuntimeError as e:
        print(f"FAIL: {e}")
        fails += 1
    finally:
        if not a.keep:
            shutil.rmtree(d, ignore_errors=True)
    print("passed" if fails == 0 else f"FAILED ({fails} checks)")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
