"""test_lora_torch_oracle.py: `tern finetune --lora` against an independent PyTorch LoRA: the
frozen base of tests/py/train_torch_ref.py's model, each adapted linear computing
y = x W^T + (alpha / rank) (x A^T) B^T with A [rank][n_in], B [n_out][rank] as torch leaves
(PEFT's layout and llama.cpp's rule), and torch.optim.AdamW over A and B alone.

  (a) gradients. A short run (`tern finetune --steps 3 --lr 1e-2`) gives an adapter with B != 0;
      `tern finetune --resume --dump-grads G.gguf` then writes d(loss)/d(A, B) of the first
      micro-batch at that adapter, `train.loss` and the micro-batch (`train.windows`). Torch float64
      autograd on the same adapter must give the loss within 1e-4 relative and, per adapter tensor,
      ||g_tern - g_torch|| / ||g_torch|| <= 1e-4. Three cases: stories260K.gguf with every target
      (q,k,v,o,gate,up,down,output; rank 4, alpha 8; ctx 64, batch 4; windows built here from the
      text, independently of tern); a fresh GQA model (n_embd 48, 2 layers, 6 heads, 2 kv heads,
      n_ff 100; q,v,down,output; rank 3, alpha 5; ctx 32, batch 4); and stories260K on JSONL
      prompt/completion examples (q,k,v,o; rank 4, alpha 4; ctx 64, batch 4) where the loss is
      on the completion tokens only: tern's windows are replayed, entries below -1 being
      unscored inputs (id = -2 - entry), the mean taken over the scored targets.
  (b) AdamW steps. From the adapter `tern finetune --steps 0` writes (A from the seed, B = 0),
      20 steps (batch 4, grad-accum 2, ctx 64, warmup 3 + cosine to min-lr, weight decay 0.01,
      betas 0.9/0.999, clip 1.0, --no-shuffle; q,k,v,o,down; rank 8, alpha 16) on stories260K:
      torch float32 from the same adapter and data order must give every step's loss within
      1e-3 * max(1, |loss|), the same lr (1e-6 relative), a grad_norm within 1e-2 relative, and
      a final adapter within 1e-2 (per tensor, relative L2). The base must be untouched.

Data: the first 120 blank-line-separated documents of ../shared/data/tinystories/tinystories_val.txt
(and JSONL examples made from their sentences: prompt = a sentence, completion = the next one).
Run:   TERN_BINARY=build/release/tern /usr/bin/python3 tests/py/test_lora_torch_oracle.py
       [--only grads|curve] [--keep DIR]
Exit:  0 passed, 1 failed, 77 skipped (no torch, no ../shared model, or no `tern finetune`).
About 20-30 s on 2 cores.
"""
import argparse
import json
import math
import os
import re
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
from train_torch_ref import KIND_TENSOR, MODEL, TERN, VAL, run  # noqa: E402
from gguf_np import read_gguf  # noqa: E402

N_DOCS = 120
THREADS = "2"

GRAD_TOL = 1e-4
LOSS_TOL = 1e-4
CURVE_TOL = 1e-3
GNORM_TOL = 1e-2
FINAL_TOL = 1e-2


# ----------------------------------------------------------------------------------------------
# the torch LoRA model (written from the brief: frozen base, y = x W^T + s (x A^T) B^T)

def load_adapter(path, dtype):
    """-> (alpha, {base tensor: (A [r, n_in], B [n_out, r])}) as torch leaves requiring grad."""
    meta, t = read_gguf(path)
    assert meta["general.type"] == "adapter" and meta["adapter.type"] == "lora", meta
    L = {}
    for n in t:
        if n.endswith(".lora_a"):
            base = n[:-7]
            A = torch.tensor(np.ascontiguousarray(t[n]), dtype=dtype).requires_grad_(True)
            B = torch.tensor(np.ascontiguousarray(t[base + ".lora_b"]), dtype=dtype).requires_grad_(True)
            L[base] = (A, B)
    return float(meta["adapter.lora.alpha"]), L


def lora_logits(hp, P, L, alpha, ids, rope=None):
    """ids [B, T] -> logits [B, T, V]; P frozen, L {tensor: (A, B)}."""
    Bsz, T = ids.shape
    dtype = P["token_embd.weight"].dtype
    H, Hkv, hd = hp.n_head, hp.n_head_kv, hp.head_dim
    cos, sin = rope if rope is not None else R.rope_tables(hp, T, dtype)
    mask = torch.full((T, T), float("-inf"), dtype=dtype).triu(1)
    rep = H // Hkv

    def lin(x, name):
        y = x @ P[name].t()
        if name in L:
            A, Bm = L[name]
            y = y + (alpha / A.shape[0]) * ((x @ A.t()) @ Bm.t())
        return y

    x = P["token_embd.weight"][ids]
    for il in range(hp.n_layer):
        p = f"blk.{il}."
        h = R.rmsnorm(x, P[p + "attn_norm.weight"], hp.eps)
        q = lin(h, p + "attn_q.weight").view(Bsz, T, H, hd)
        k = lin(h, p + "attn_k.weight").view(Bsz, T, Hkv, hd)
        v = lin(h, p + "attn_v.weight").view(Bsz, T, Hkv, hd)
        q = R.apply_rope(q, cos, sin, hp.n_rot).transpose(1, 2)
        k = R.apply_rope(k, cos, sin, hp.n_rot).transpose(1, 2)
        v = v.transpose(1, 2)
        if rep > 1:
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        att = torch.softmax((q @ k.transpose(-1, -2)) / math.sqrt(hd) + mask, dim=-1)
        o = (att @ v).transpose(1, 2).reshape(Bsz, T, H * hd)
        x = x + lin(o, p + "attn_output.weight")
        h2 = R.rmsnorm(x, P[p + "ffn_norm.weight"], hp.eps)
        act = F.silu(lin(h2, p + "ffn_gate.weight")) * lin(h2, p + "ffn_up.weight")
        x = x + lin(act, p + "ffn_down.weight")
    x = R.rmsnorm(x, P["output_norm.weight"], hp.eps)
    if hp.tied:
        return x @ P["token_embd.weight"].t()
    return lin(x, "output.weight")


def lora_loss(hp, P, L, alpha, windows, rope=None):
    """windows [B, T+1] of entries: >= 0 a token, < -1 token -2-e that is no target. Mean over targets."""
    tokens = torch.where(windows >= 0, windows, -2 - windows)
    targets = torch.where(windows[:, 1:] >= 0, windows[:, 1:], torch.full_like(windows[:, 1:], -100))
    logits = lora_logits(hp, P, L, alpha, tokens[:, :-1], rope)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)


def load_base(path, dtype):
    hp, _, P = R.load_model(path, dtype)
    for p in P.values():
        p.requires_grad_(False)
    return hp, P


# ----------------------------------------------------------------------------------------------
# data

def write_text(path):
    R.write_docs(path, N_DOCS)


def write_jsonl(path):
    docs = R.split_documents(open(VAL, "rb").read())[:N_DOCS]
    n = 0
    with open(path, "w") as f:
        for d in docs:
            sents = [s for s in re.split(r"(?<=[.!?])\s+", d.decode("utf-8", "replace")) if s]
            for a, b in zip(sents, sents[1:]):
                f.write(json.dumps({"prompt": a, "completion": " " + b}) + "\n")
                n += 1
    return n


# ----------------------------------------------------------------------------------------------
# (a) gradients

def check_grads(label, model, data, targets, rank, alpha, T, B, d, windows_from_tern=False):
    adapter = os.path.join(d, f"adapter_{label}.gguf")
    common = [TERN, "finetune", "--lora", "-m", model, "--data", data, "--ctx", str(T), "--batch", str(B),
              "--no-shuffle", "--rank", str(rank), "--alpha", str(alpha), "--targets", targets, "-t", THREADS,
              "-q", "-o", adapter]
    # a few steps so that B != 0 (at B = 0, A's gradient is exactly zero)
    run(common + ["--steps", "3", "--lr", "1e-2", "--warmup", "0"])
    grads = os.path.join(d, f"grads_{label}.gguf")
    run(common + ["--steps", "4", "--resume", "--dump-grads", grads])
    _, tg = read_gguf(grads)
    hp, P = load_base(model, torch.float64)
    a, L = load_adapter(adapter, torch.float64)
    if windows_from_tern:
        mb = torch.tensor(np.asarray(tg["train.windows"]).reshape(B, T + 1).round().astype(np.int64))
    else:
        S = R.token_stream(TERN, model, open(data, "rb").read())
        mb = R.micro_batch(R.make_windows(S, T), 0, B)
        tw = np.asarray(tg["train.windows"]).reshape(B, T + 1).round().astype(np.int64)
        if not np.array_equal(tw, mb.numpy()):
            print(f"FAIL [grads {label}] tern's first micro-batch differs from the windows built here")
            return 1
    loss = lora_loss(hp, P, L, a, mb)
    loss.backward()
    loss = loss.item()
    n_scored = int((mb[:, 1:] >= 0).sum())
    print(f"[grads {label}] {hp}; targets {targets}, rank {rank}, alpha {alpha}; batch {B} x {T}, "
          f"{n_scored} scored targets; {len(L)} adapted tensors")
    fails = R.check_dump_loss(f"grads {label}", tg, loss, LOSS_TOL)
    want = {}
    for base, (A, Bm) in L.items():
        want[base + ".lora_a"] = A.grad
        want[base + ".lora_b"] = Bm.grad
    got_names = set(tg) - {"train.loss", "train.windows"}
    if got_names != set(want):
        print(f"FAIL [grads {label}] tensor names differ: missing {sorted(set(want) - got_names)} "
              f"extra {sorted(got_names - set(want))}")
        fails += 1
    worst = 0.0
    shown = 0
    for n, gt in want.items():
        if n not in tg:
            continue
        gt = gt.numpy()
        gg = np.asarray(tg[n], dtype=np.float64)
        if gg.shape != gt.shape:
            print(f"FAIL [grads {label}] {n}: shape {gg.shape}, want {gt.shape}")
            fails += 1
            continue
        nrm = np.linalg.norm(gt)
        r = np.linalg.norm(gg - gt) / max(nrm, 1e-30)
        worst = max(worst, r)
        bad = r > GRAD_TOL or nrm == 0.0
        fails += bad
        if bad or shown < 4 or n.startswith("blk.0.") or n.startswith("output"):
            print(f"  {n:34s} {str(gt.shape):>10s} rel L2 {r:9.3g}  |g| {nrm:9.3g}{'  FAIL' if bad else ''}")
            shown += 1
    print(f"{'ok  ' if fails == 0 else 'FAIL'} [grads {label}] worst tensor rel L2 error {worst:.3g} "
          f"(bound {GRAD_TOL:g})")
    return fails


# ----------------------------------------------------------------------------------------------
# (b) AdamW steps

def parse_steps(stdout):
    recs = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            o = json.loads(line)
            if isinstance(o, dict) and "step" in o:
                recs.append(o)
    return recs


def check_curve(data, d):
    T, B, A_, steps = 64, 4, 2, 20
    lr, min_lr, warmup, wd, b1, b2, eps, clip = 3e-3, 3e-4, 3, 0.01, 0.9, 0.999, 1e-8, 1.0
    rank, alpha, targets = 8, 16, "q,k,v,o,down"
    out = os.path.join(d, "curve.gguf")
    init = os.path.join(d, "curve_init.gguf")
    common = [TERN, "finetune", "--lora", "-m", MODEL, "--data", data, "--ctx", str(T), "--batch", str(B),
              "--grad-accum", str(A_), "--rank", str(rank), "--alpha", str(alpha), "--targets", targets,
              "--lr", str(lr), "--min-lr", str(min_lr), "--warmup", str(warmup), "--weight-decay", str(wd),
              "--beta1", str(b1), "--beta2", str(b2), "--eps", str(eps), "--clip", str(clip), "--no-shuffle",
              "--seed", "7", "-t", THREADS, "-q"]
    run(common + ["--steps", "0", "-o", init])
    r = run(common + ["--steps", str(steps), "--json", "-o", out])
    got = {g["step"]: g for g in parse_steps(r.stdout)}

    hp, P = load_base(MODEL, torch.float32)
    P0 = {n: p.clone() for n, p in P.items()}
    a, L = load_adapter(init, torch.float32)
    S = R.token_stream(TERN, MODEL, open(data, "rb").read())
    windows = R.make_windows(S, T)
    params = [t for pair in L.values() for t in pair]
    opt = torch.optim.AdamW(params, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    rope = R.rope_tables(hp, T, torch.float32)
    print(f"[curve] {windows.shape[0]} windows of {T}; {steps} steps x {A_} x {B}; targets {targets}, rank {rank}, "
          f"alpha {alpha}; {sum(p.numel() for p in params)} adapter parameters")
    fails = 0
    worst_loss = worst_lr = worst_gn = 0.0
    for s in range(steps):
        lr_s = R.lr_at(s, lr, min_lr, warmup, steps)
        for g in opt.param_groups:
            g["lr"] = lr_s
        opt.zero_grad(set_to_none=True)
        tot = 0.0
        for k in range(A_):
            loss = lora_loss(hp, P, L, a, R.micro_batch(windows, s * A_ + k, B), rope)
            (loss / A_).backward()
            tot += loss.item()
        gn = torch.nn.utils.clip_grad_norm_(params, clip).item()
        opt.step()
        w = {"step": s + 1, "loss": tot / A_, "lr": lr_s, "grad_norm": gn}
        g = got.get(s + 1)
        if g is None:
            print(f"FAIL [curve] tern printed no step {s + 1}")
            fails += 1
            continue
        dl = abs(g["loss"] - w["loss"]) / max(1.0, abs(w["loss"]))
        dlr = abs(g["lr"] - w["lr"]) / w["lr"]
        dgn = abs(g["grad_norm"] - w["grad_norm"]) / max(w["grad_norm"], 1e-12)
        worst_loss, worst_lr, worst_gn = max(worst_loss, dl), max(worst_lr, dlr), max(worst_gn, dgn)
        bad = dl > CURVE_TOL or dlr > 1e-6 or dgn > GNORM_TOL
        fails += bad
        if bad or s < 3 or (s + 1) % 5 == 0:
            print(f"  {s + 1:4d} loss tern {g['loss']:.6f} torch {w['loss']:.6f} ({dl:.2e})  lr {g['lr']:.3e}  "
                  f"gnorm tern {g['grad_norm']:.5f} torch {w['grad_norm']:.5f}{'  FAIL' if bad else ''}")
    print(f"{'ok  ' if fails == 0 else 'FAIL'} [curve] max loss diff {worst_loss:.3g} (bound {CURVE_TOL:g}); "
          f"max lr rel diff {worst_lr:.3g}; max grad_norm rel diff {worst_gn:.3g} (bound {GNORM_TOL:g})")
    _, tw = read_gguf(out)
    worst_w, worst_name = 0.0, ""
    for base, (A, Bm) in L.items():
        for n, t in ((base + ".lora_a", A), (base + ".lora_b", Bm)):
            if n not in tw:
                print(f"FAIL [curve] {n} missing from {out}")
                fails += 1
                continue
            x = t.detach().double().numpy()
            rel = np.linalg.norm(np.asarray(tw[n]) - x) / np.linalg.norm(x)
            if rel > worst_w:
                worst_w, worst_name = rel, n
    ok = worst_w <= FINAL_TOL
    fails += not ok
    print(f"{'ok  ' if ok else 'FAIL'} [curve] final adapter: max per-tensor rel L2 diff {worst_w:.3g} ({worst_name}; "
          f"bound {FINAL_TOL:g})")
    same = all(torch.equal(P[n], P0[n]) for n in P)
    fails += not same
    print(f"{'ok  ' if same else 'FAIL'} [curve] the torch base stayed frozen")
    return fails


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["grads", "curve"])
    ap.add_argument("--keep", help="work in this directory and keep its files")
    a = ap.parse_args()
    skip = R.skip_reason("finetune")
    if skip:
        print(f"SKIP: {skip}")
        return 77
    torch.set_num_threads(1)
    d = a.keep or tempfile.mkdtemp(prefix="tern_lora_oracle_")
    os.makedirs(d, exist_ok=True)
    fails = 0
    try:
        data = os.path.join(d, "data.txt")
        write_text(data)
        if a.only in (None, "grads"):
            fails += check_grads("stories260K-all", MODEL, data, "q,k,v,o,gate,up,down,output", 4, 8, 64, 4, d)
            init = os.path.join(d, "init_gqa.gguf")
            run([TERN, "train", "--vocab-from", MODEL, "--n-embd", "48", "--n-layer", "2", "--n-head", "6",
                 "--n-head-kv", "2", "--n-ff", "100", "--ctx", "32", "--steps", "0", "--seed", "3", "-t", THREADS,
                 "--data", data, "-o", init])
            fails += check_grads("gqa-48x2", init, data, "q,v,down,output", 3, 5, 32, 4, d)
            jsonl = os.path.join(d, "data.jsonl")
            n = write_jsonl(jsonl)
            print(f"[grads jsonl] {n} prompt/completion examples")
            fails += check_grads("stories260K-jsonl", MODEL, jsonl, "q,k,v,o", 4, 4, 64, 4, d, windows_from_tern=True)
        if a.only in (None, "curve"):
            fails += check_curve(data, d)
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
