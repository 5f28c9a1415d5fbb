#!/usr/bin/python3
"""train_torch_bench.py: training speed of `tern train` against PyTorch eager on the same shapes.

  train_torch_bench.py compare [--tern PATH] [--shared DIR] [--shapes stories260k,5m] [--rounds 3]
                               [--long] [--json] [--openblas-dir DIR | --system-blas]
      Rounds alternate tern / torch (the machine is noisy); per shape it reports the medians over
      rounds of each run's median tok/s (steps after the warm-up ones), the ratio tern / torch,
      achieved GFLOP/s and % of the machine's FMA peak (bench/fma_peak, 2 threads, the best ISA),
      and each run's peak RSS (/usr/bin/time -f %M). --long: 5 rounds, 3x the steps.
      BLAS: Debian's torch calls whatever libblas.so.3 the system selects; on a machine where that
      is the netlib reference BLAS (libblas3: ~3 GFLOP/s) torch would be measured with a crippled
      matmul. So the torch runs get an OpenBLAS libblas.so.3 first on LD_LIBRARY_PATH when one is
      found (--openblas-dir DIR, $TORCH_OPENBLAS_DIR, /usr/lib/x86_64-linux-gnu/openblas-openmp or
      -pthread; e.g. `apt-get download libopenblas0-openmp && dpkg -x *.deb DIR` and pass
      DIR/usr/lib/x86_64-linux-gnu/openblas-openmp); --system-blas measures torch as installed.
      With OpenBLAS on an AVX-512 CPU, OPENBLAS_CORETYPE=SkylakeX (replacing any set): 0.3.21 takes recent
      AMD cores for Haswell (AVX2 kernels, half the speed). The report names torch's BLAS library.
  train_torch_bench.py torch --n-embd E --n-layer L --n-head H --n-head-kv K --n-ff F --vocab V
                             --ctx T --batch B --steps N [--tied] [--threads 2]
      One PyTorch run (float32, eager, torch.set_num_threads(threads)): random weights and tokens,
      a full AdamW step (forward, backward, clip_grad_norm_ 1.0, AdamW with weight decay on 2-D
      tensors) per step; prints one JSON line per step {"step", "tok_s", "step_s"}.

Both engines run the same model (tests/py/train_torch_ref.py's forward is the torch model), the
same B x T tokens per optimizer step (no gradient accumulation), on 2 threads.

FLOP count (per optimizer step, "useful" flops, the same for both engines):
    n_matmul = n_layer * (E*(H*hd) + 2*E*(K*hd) + (H*hd)*E + 3*E*F) + V*E     (the output projection;
               the embedding lookup is no matmul)
    flops    = 6 * n_matmul * B*T                 (forward 2, backward 4 per weight and token)
             + 6 * B * n_layer * T^2 * E          (attention: QK^T and PV, 2*T^2*E each over the
                                                   full square, halved for causality, x3 fwd+bwd)
GFLOP/s = flops * steps/s / 1e9; % peak = GFLOP/s / fma_peak's 2-thread GFLOP/s.
"""
import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

SHAPES = {
    # name: (n_embd, n_layer, n_head, n_head_kv, n_ff)   vocab 512 (stories260K's tokenizer)
    "stories260k": (64, 5, 8, 4, 172),
    "5m": (256, 6, 8, 4, 688),
}
# (steps, warm-up steps ignored) per shape, default run; --long multiplies the steps by 3
STEPS = {"stories260k": (10, 3), "5m": (5, 1)}
VOCAB = 512
CTX = 256
BATCH = 8
THREADS = 2


def n_params(E, L, H, K, F, V, tied):
    hd = E // H
    per_layer = E * (H * hd) + 2 * E * (K * hd) + (H * hd) * E + 3 * E * F + 2 * E  # + 2 norms
    matmul = L * (E * (H * hd) + 2 * E * (K * hd) + (H * hd) * E + 3 * E * F) + V * E
    total = V * E + L * per_layer + E + (0 if tied else V * E)
    return total, matmul


def step_flops(E, L, H, K, F, V, B, T):
    _, matmul = n_params(E, L, H, K, F, V, False)
    return 6.0 * matmul * B * T + 6.0 * B * L * T * T * E


# ----------------------------------------------------------------------------------------------
# the torch worker

def torch_main(a):
    import torch
    sys.path.insert(0, os.path.join(ROOT, "tests/py"))
    import train_torch_ref as R
    torch.set_num_threads(a.threads)
    hp = R.HParams.make(a.vocab, a.n_embd, a.n_layer, a.n_head, a.n_head_kv, a.n_ff, tied=a.tied)
    P = R.random_params(hp, torch.float32, seed=0)
    params = list(P.values())
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    g = torch.Generator().manual_seed(1)
    rope = R.rope_tables(hp, a.ctx, torch.float32)
    n_tok = a.batch * a.ctx
    for s in range(a.steps):
        win = torch.randint(0, a.vocab, (a.batch, a.ctx + 1), generator=g)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = R.loss_fn(hp, P, win, rope)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        lv = loss.item()
        dt = time.perf_counter() - t0
        print(json.dumps({"step": s + 1, "loss": lv, "grad_norm": float(gn), "step_s": dt, "tok_s": n_tok / dt}),
              flush=True)
    n_total, _ = n_params(a.n_embd, a.n_layer, a.n_head, a.n_head_kv, a.n_ff, a.vocab, a.tied)
    assert n_total == sum(p.numel() for p in params), (n_total, sum(p.numel() for p in params))
    blas = sorted({ln.split()[-1] for ln in open("/proc/self/maps") if "blas" in ln and "/" in ln})
    print(json.dumps({"final": True, "n_params": n_total, "blas": blas}), flush=True)
    return 0


# ----------------------------------------------------------------------------------------------
# the comparison

def timed(cmd, env=None):
    """Runs cmd under /usr/bin/time -f %M; returns (stdout, peak RSS MiB, wall s)."""
    with tempfile.NamedTemporaryFile("r", suffix=".rss") as tf:
        t0 = time.perf_counter()
        r = subprocess.run(["/usr/bin/time", "-o", tf.name, "-f", "%M"] + cmd, capture_output=True, text=True,
                           env=env)
        wall = time.perf_counter() - t0
        if r.returncode != 0:
            raise RuntimeError(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}")
        lines = [ln for ln in open(tf.name).read().split() if ln.strip().isdigit()]
        rss = int(lines[-1]) / 1024.0 if lines else float("nan")
    return r.stdout, rss, wall


def step_lines(stdout):
    out = []
    for ln in stdout.splitlines():
        ln = ln.strip()
        if ln.startswith("{"):
            try:
                o = json.loads(ln)
            except json.JSONDecodeError:
                continue
            if isinstance(o, dict) and "step" in o:
                out.append(o)
    return out


def median_tok_s(recs, warm):
    xs = [float(r["tok_s"]) for r in recs if r["step"] > warm and r.get("tok_s") is not None]
    if not xs:
        xs = [float(r["tok_s"]) for r in recs if r.get("tok_s") is not None]
    return statistics.median(xs) if xs else float("nan")


def fma_peak(tern):
    cands = [os.path.join(os.path.dirname(os.path.abspath(tern)), "bench/fma_peak")] if tern else []
    for b in ("release", "h_torch"):
        cands.append(os.path.join(ROOT, "build", b, "bench/fma_peak"))
    exe = next((c for c in cands if os.path.exists(c)), None)
    if exe is None:  # not built by cmake: compile it on the side
        exe = os.path.join(tempfile.gettempdir(), f"fma_peak_{os.getpid()}")
        subprocess.run([os.environ.get("CXX", "c++"), "-std=c++20", "-O2", "-pthread",
                        os.path.join(HERE, "fma_peak.cpp"), "-o", exe], check=True)
    r = subprocess.run([exe, "--threads", f"1,{THREADS}", "--json"], capture_output=True, text=True, check=True)
    o = json.loads(r.stdout.strip().splitlines()[-1])
    isa = "avx512" if "avx512" in o else "avx2"
    return isa, float(o[isa]["1"]), float(o[isa][str(THREADS)])


def openblas_dir(a):
    cands = [a.openblas_dir, os.environ.get("TORCH_OPENBLAS_DIR"), "/usr/lib/x86_64-linux-gnu/openblas-openmp",
             "/usr/lib/x86_64-linux-gnu/openblas-pthread"]
    for c in cands:
        if c and os.path.exists(os.path.join(c, "libblas.so.3")):
            return c
    return None


def final_line(stdout):
    for ln in reversed(stdout.splitlines()):
        if ln.startswith("{") and '"final"' in ln:
            return json.loads(ln)
    return {}


def gguf_tensor_count(path):
    sys.path.insert(0, os.path.join(ROOT, "tests/py"))
    from gguf_np import read_gguf
    _, t = read_gguf(path)
    n = sum(int(v.size) for v in t.values())
    return n, "output.weight" not in t


def compare_main(a):
    tern = a.tern or os.environ.get("TERN_BINARY") or os.path.join(ROOT, "build/release/tern")
    shared = a.shared or os.environ.get("TERN_SHARED_DIR") or os.path.join(ROOT, "../shared")
    vocab_model = os.path.join(shared, "models/stories260K.gguf")
    data = os.path.join(shared, "data/tinystories/tinystories_train_prefix_4M.txt")
    for f in (vocab_model, data):
        if not os.path.exists(f):
            print(f"missing {f}", file=sys.stderr)
            return 2
    if subprocess.run([tern, "train", "--help"], capture_output=True).returncode != 0:
        print(f"`{tern} train --help` fails: no train command", file=sys.stderr)
        return 2
    rounds = a.rounds or (5 if a.long else 3)
    torch_env = dict(os.environ)
    torch_env["OMP_NUM_THREADS"] = str(THREADS)
    ob = None if a.system_blas else openblas_dir(a)
    if ob:
        torch_env["LD_LIBRARY_PATH"] = ob + ((":" + torch_env["LD_LIBRARY_PATH"]) if torch_env.get("LD_LIBRARY_PATH")
                                             else "")
        # OpenBLAS 0.3.21 does not know recent AMD cores and falls back to its Haswell (AVX2)
        # kernels; on an AVX-512 CPU its SkylakeX kernels are ~2x faster.
        # An OPENBLAS_CORETYPE already in the environment (some images pin Haswell) is replaced
        # too: the peer must run at its best on this CPU.
        if " avx512f" in open("/proc/cpuinfo").read():
            torch_env["OPENBLAS_CORETYPE"] = "SkylakeX"
    elif not a.system_blas and not a.json:
        print("warning: no OpenBLAS found (--openblas-dir); torch runs with the system libblas.so.3", file=sys.stderr)
    torch_blas = None
    isa, peak1, peak = fma_peak(tern)
    if not a.json:
        print(f"FMA peak ({isa}): {peak1:.1f} GFLOP/s on 1 thread, {peak:.1f} on {THREADS}")
    results = []
    work = tempfile.mkdtemp(prefix="tern_train_bench_")
    try:
        for name in a.shapes.split(","):
            E, L, H, K, F = SHAPES[name]
            steps, warm = STEPS[name]
            if a.long:
                steps *= 3
            out = os.path.join(work, f"{name}.gguf")
            tern_cmd = [tern, "train", "--vocab-from", vocab_model, "--n-embd", str(E), "--n-layer", str(L),
                        "--n-head", str(H), "--n-head-kv", str(K), "--n-ff", str(F), "--steps", str(steps),
                        "--batch", str(BATCH), "--ctx", str(CTX), "-t", str(THREADS), "--json", "--data", data,
                        "-o", out]
            tied = None
            per = {"tern": [], "torch": []}
            for rnd in range(rounds):
                so, rss, wall = timed(tern_cmd)
                recs = step_lines(so)
                per["tern"].append((median_tok_s(recs, warm), rss, wall))
                if tied is None:
                    n_file, tied = gguf_tensor_count(out)
                torch_cmd = ["/usr/bin/python3", os.path.abspath(__file__), "torch", "--n-embd", str(E),
                             "--n-layer", str(L), "--n-head", str(H), "--n-head-kv", str(K), "--n-ff", str(F),
                             "--vocab", str(VOCAB), "--ctx", str(CTX), "--batch", str(BATCH), "--steps", str(steps),
                             "--threads", str(THREADS)] + (["--tied"] if tied else [])
                so, rss, wall = timed(torch_cmd, torch_env)
                torch_blas = final_line(so).get("blas", torch_blas)
                per["torch"].append((median_tok_s(step_lines(so), warm), rss, wall))
                if not a.json:
                    print(f"  {name} round {rnd + 1}: tern {per['tern'][-1][0]:8.0f} tok/s, "
                          f"torch {per['torch'][-1][0]:8.0f} tok/s", flush=True)
            n_total, _ = n_params(E, L, H, K, F, VOCAB, tied)
            flops = step_flops(E, L, H, K, F, VOCAB, BATCH, CTX)
            row = {"shape": name, "n_embd": E, "n_layer": L, "n_head": H, "n_head_kv": K, "n_ff": F,
                   "vocab": VOCAB, "ctx": CTX, "batch": BATCH, "threads": THREADS, "steps": steps,
                   "warmup_steps_ignored": warm, "rounds": rounds, "tied": tied, "n_params": n_total,
                   "n_params_file": n_file, "flop_per_step": flops}
            for eng in ("tern", "torch"):
                tok = statistics.median(x[0] for x in per[eng])
                gf = flops * tok / (BATCH * CTX) / 1e9
                row[eng] = {"tok_s": tok, "tok_s_rounds": [round(x[0], 1) for x in per[eng]],
                            "gflop_s": gf, "pct_peak": 100.0 * gf / peak,
                            "peak_rss_mib": max(x[1] for x in per[eng]),
                            "wall_s_median": statistics.median(x[2] for x in per[eng])}
            row["ratio_tern_over_torch"] = row["tern"]["tok_s"] / row["torch"]["tok_s"]
            results.append(row)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = {"torch_blas": torch_blas, "openblas_coretype": torch_env.get("OPENBLAS_CORETYPE"), "peak_isa": isa, "peak_gflop_s_1t": peak1, f"peak_gflop_s_{THREADS}t": peak, "shapes": results}
    if a.json:
        print(json.dumps(summary))
    else:
        print()
        print(f"{'shape':12s} {'params':>9s} {'engine':6s} {'tok/s':>9s} {'GFLOP/s':>8s} {'%peak':>6s} "
              f"{'RSS MiB':>8s} {'ratio':>6s}")
        for r in results:
            for eng in ("tern", "torch"):
                e = r[eng]
                ratio = f"{r['ratio_tern_over_torch']:6.2f}" if eng == "tern" else ""
                print(f"{r['shape']:12s} {r['n_params']:9d} {eng:6s} {e['tok_s']:9.0f} {e['gflop_s']:8.2f} "
                      f"{e['pct_peak']:6.2f} {e['peak_rss_mib']:8.1f} {ratio:>6s}")
        print(f"(B={BATCH}, T={CTX}, {THREADS} threads, medians of {rounds} alternating rounds; ratio = tern/torch "
              f"tok/s; peak = {peak:.0f} GFLOP/s {isa} {THREADS} threads; torch BLAS: {torch_blas})")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compare")
    c.add_argument("--tern")
    c.add_argument("--shared")
    c.add_argument("--shapes", default="stories260k,5m")
    c.add_argument("--rounds", type=int, default=0)
    c.add_argument("--long", action="store_true")
    c.add_argument("--json", action="store_true")
    c.add_argument("--openblas-dir")
    c.add_argument("--system-blas", action="store_true")
    t = sub.add_parser("torch")
    for k in ("n-embd", "n-layer", "n-head", "n-head-kv", "n-ff", "steps"):
        t.add_argument("--" + k, type=int, required=True)
    t.add_argument("--vocab", type=int, default=VOCAB)
    t.add_argument("--ctx", type=int, default=CTX)
    t.add_argument("--batch", type=int, default=BATCH)
    t.add_argument("--threads", type=int, default=THREADS)
    t.add_argument("--tied", action="store_true")
    a = ap.parse_args()
    return compare_main(a) if a.cmd == "compare" else torch_main(a)


if __name__ == "__main__":
    sys.exit(main())
