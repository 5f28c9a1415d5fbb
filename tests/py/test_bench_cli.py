"""`tern bench --json`: the decode roofline share is the median of each tg run's share against the
bandwidth measured beside it (before and after the run, reading the model's own weights where
they are: tools/bandwidth_probe.h), so the per-run lists must be consistent
with each other and with the medians reported; --no-bandwidth skips the probes; nothing to
measure is a clear error. A stories260k-shape model written by `tern synth` (no ../shared needed).
Exit code 77 = skipped (no tern binary)."""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

TERN = os.environ.get("TERN_BINARY", "tern")
if not (os.path.exists(TERN) or shutil.which(TERN)):
    print(f"SKIP: no tern binary at {TERN}")
    sys.exit(77)

failures = 0


def check(cond, what):
    global failures
    print(("ok   " if cond else "FAIL ") + what)
    failures += not cond


def close(a, b, rel=1e-9):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-30)


with tempfile.TemporaryDirectory() as d:
    model = os.path.join(d, "tiny.gguf")
    subprocess.run([TERN, "synth", "--shape", "stories260k", "--type", "f32", "-o", model], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def bench(*args):
        r = subprocess.run([TERN, "bench", "-m", model, "-t", "2", "--json", *args],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        return r.returncode, r.stdout, r.stderr

    reps = 3
    rc, out, err = bench("-p", "8", "-n", "8", "-r", str(reps))
    check(rc == 0, f"bench runs (rc {rc}: {err.strip()[:200]})")
    j = json.loads(out)
    for key in ("pp_tok_s", "tg_tok_s", "weight_bytes", "bandwidth_gb_s", "tg_roofline_pct"):
        check(key in j and j[key] > 0, f"{key} = {j.get(key)}")
    check(j["bandwidth_probe"] == "weights", f"the probe reads the model's own weights ({j.get('bandwidth_probe')})")
    check(len(j["tg_runs"]) == reps and len(j["bandwidth_runs"]) == reps and len(j["tg_roofline_pct_runs"]) == reps,
          "one tg time, bandwidth and roofline share per rep")
    bpt = j["bytes_per_token"]
    shares = [100.0 * tg * bpt / (bw * 1e9) for tg, bw in zip(j["tg_runs"], j["bandwidth_runs"])]
    check(all(close(a, b) for a, b in zip(shares, j["tg_roofline_pct_runs"])),
          "each run's share = its tg x bytes per token / its own bandwidth")
    check(close(j["tg_roofline_pct"], statistics.median(j["tg_roofline_pct_runs"])), "tg_roofline_pct is their median")
    check(close(j["bandwidth_gb_s"], statistics.median(j["bandwidth_runs"])), "bandwidth_gb_s is the runs' median")
    check(close(j["tg_roofline_tok_s"], j["bandwidth_gb_s"] * 1e9 / bpt), "roofline tok/s = bandwidth / bytes per token")
    # The probe reads two ways (one walk a thread; interleaved prefetched walks) and each run's
    # bandwidth is the faster of the two, before and after the run, averaged: at least the
    # faster of the two ways' averages, at most their sum.
    ways = list(zip(j["bandwidth_runs"], j["bandwidth_one_stream_runs"], j["bandwidth_streams_runs"]))
    check(len(ways) == reps and all(one > 0 and streams > 0 for _, one, streams in ways),
          "both ways measured beside every run")
    check(all(max(one, streams) * (1 - 1e-9) <= bw <= one + streams for bw, one, streams in ways),
          "each run's bandwidth is the faster way's")
    check(close(j["bandwidth_streams_gb_s"], statistics.median(j["bandwidth_streams_runs"])) and
          close(j["bandwidth_one_stream_gb_s"], statistics.median(j["bandwidth_one_stream_runs"])),
          "the two ways' figures are their runs' medians")

    rc, out, err = bench("-p", "8", "-n", "4", "-r", "2", "--no-bandwidth")
    j = json.loads(out) if rc == 0 else {}
    check(rc == 0 and j["bandwidth_gb_s"] == 0 and j["bandwidth_runs"] == [] and j["tg_roofline_pct"] == 0,
          "--no-bandwidth: no probe, no share")

    rc, out, err = bench("-p", "8", "-n", "0", "-r", "2")
    j = json.loads(out) if rc == 0 else {}
    check(rc == 0 and len(j["bandwidth_runs"]) == 1 and j["bandwidth_gb_s"] > 0 and j["tg_roofline_pct_runs"] == [],
          "pp only: one bandwidth probe, no share")

    # --roofline: the three compute probes, each measured or named as missing by what this CPU
    # reports (/proc/cpuinfo), and pp as a share of the FP32 FMA peak (an f32 model).
    rc, out, err = bench("-p", "8", "-n", "0", "-r", "2", "--roofline")
    j = json.loads(out) if rc == 0 else {}
    check(rc == 0, f"--roofline runs (rc {rc}: {err.strip()[:200]})")
    peaks = {p["name"]: p for p in j.get("compute_peaks", [])}
    check(sorted(peaks) == ["bf16_dot", "fp32_fma", "int8_dot"], f"three compute probes ({sorted(peaks)})")
    flags = set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    for name, p in peaks.items():
        if "missing" in p:
            check(p["gops"] == 0 and "this CPU has no" in p["missing"], f"{name} not measured: {p['missing']}")
        else:
            check(p["gops"] > 0 and p["instruction"], f"{name} = {p['gops']:.1f} G op/s ({p['instruction']})")
    if flags:
        check(("missing" in peaks.get("bf16_dot", {})) == ("avx512_bf16" not in flags),
              "bf16_dot is measured exactly when the CPU has avx512_bf16")
        check(("missing" in peaks.get("fp32_fma", {})) == ("fma" not in flags), "fp32_fma measured when the CPU has FMA")
    check(j.get("pp_compute_peak") == "fp32_fma", f"an f32 model's pp is measured against fp32_fma ({j.get('pp_compute_peak')})")
    if "missing" not in peaks.get("fp32_fma", {"missing": 1}):
        check(close(j["pp_gflops"], j["pp_tok_s"] * j["pp_flops_per_token"] / 1e9), "pp GFLOP/s = pp tok/s x flops per token")
        check(close(j["pp_compute_pct"], 100 * j["pp_gflops"] / peaks["fp32_fma"]["gops"]), "pp share = GFLOP/s / peak")
    # stories260k: 5 layers of q, o (64 x 64), k, v (64 x 32), gate, up, down (64 x 172); an
    # 8-token prompt's attention over 4.5 positions on average, 8 heads of 8.
    weights = 5 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 172)
    check(close(j.get("pp_flops_per_token", 0), 2 * weights + 4 * 4.5 * 5 * 8 * 8),
          f"flops per prompt token ({j.get('pp_flops_per_token')})")

    rc, out, err = bench("-p", "0", "-n", "0")
    check(rc != 0 and "nothing to measure" in err, f"-p 0 -n 0 is an error (rc {rc}: {err.strip()[:120]})")

    # --verify-curve: one row per k, the first the reference, ratios and ceilings consistent.
    rc, out, err = bench("-p", "0", "-n", "0", "-r", "1", "--no-bandwidth", "--verify-curve", "4", "--verify-ctx", "16")
    check(rc == 0, f"--verify-curve runs (rc {rc}: {err.strip()[:200]})")
    if rc == 0:
        vc = json.loads(out).get("verify_curve", [])
        check([e["k"] for e in vc] == [1, 2, 3, 4], f"one row per k ({[e.get('k') for e in vc]})")
        check(vc and close(vc[0]["relative"], 1.0) and all(e["ms"] > 0 for e in vc), "k = 1 is the reference, times > 0")
        check(all(close(e["relative"], e["ms"] / vc[0]["ms"]) and close(e["speedup_ceiling"], e["k"] / e["relative"])
                  for e in vc), "relative = ms / ms(1), ceiling = k / relative")

    # --depth: tg after each context, the cache it holds there (K/V rows of every position: a
    # transformer's grows by kv_bytes_per_token a token); scripts/plot_decode_depth.py charts it.
    rc, out, err = bench("-p", "0", "-n", "4", "-r", "2", "--no-bandwidth", "--depth", "8,40")
    check(rc == 0, f"--depth runs (rc {rc}: {err.strip()[:200]})")
    if rc == 0:
        j = json.loads(out)
        runs = j.get("depth_runs", [])
        check([r["depth"] for r in runs] == [8, 40] and all(r["tg_tok_s"] > 0 for r in runs), f"one row a depth ({runs})")
        check(all(r["cache_bytes"] == r["depth"] * j["kv_bytes_per_token"] + j["state_bytes_per_sequence"] for r in runs),
              "cache bytes = depth x K/V bytes per token + the fixed state")
        report = os.path.join(d, "depth.json")
        with open(report, "w") as f:
            f.write(out)
        plot = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "plot_decode_depth.py")
        chart = os.path.join(d, "depth.svg")
        r = subprocess.run([sys.executable, plot, report + ":tiny", "-o", chart], capture_output=True, text=True)
        check(r.returncode == 0 and open(chart).read().startswith("<svg") and "tiny" in open(chart).read(),
              f"the chart is written ({r.stderr.strip()[:120]})")
        r = subprocess.run([sys.executable, plot, report, "-o", report], capture_output=True, text=True)
        check(r.returncode != 0 and "input" in r.stderr and json.load(open(report)) == j,
              f"the chart never overwrites a report ({r.stderr.strip()[:120]})")
        no_depth = os.path.join(d, "plain.json")
        with open(no_depth, "w") as f:
            json.dump({"model": "m"}, f)
        r = subprocess.run([sys.executable, plot, no_depth, "-o", chart], capture_output=True, text=True)
        check(r.returncode != 0 and "no depth_runs" in r.stderr, f"a report without --depth is named ({r.stderr.strip()[:120]})")
    for args, what in ((["-n", "0", "--depth", "8"], "-n must be > 0"), (["--depth", "0"], "--depth")):
        rc, out, err = bench("-p", "8", *args)
        check(rc != 0 and what in err, f"{' '.join(args)}: an error naming {what} (rc {rc}: {err.strip()[:120]})")

    # --lookup with --spec-prompts: plain and speculative side by side on real text; the greedy
    # outputs must be the same tokens (the random-weight model repeats itself, so lookup guesses).
    prompts = os.path.join(d, "prompts.txt")
    with open(prompts, "w") as f:
        f.write("once upon a time there was a cat\\nthe cat\n")
        f.write("tom had a ball. tom liked the ball. tom\n")
    rc, out, err = bench("--lookup", "2", "--spec-prompts", prompts, "-n", "24", "-r", "2")
    check(rc == 0, f"--lookup --spec-prompts runs (rc {rc}: {err.strip()[:200]})")
    if rc == 0:
        j = json.loads(out)
        check(j["drafter"] == "lookup" and j["prompts"] == 2 and j["compared_outputs"] == 4, f"2 prompts x 2 rounds ({j})")
        check(j["identical_outputs"] == j["compared_outputs"], "every speculative output equals the plain one")
        check(j["plain_tok_s"] > 0 and j["spec_tok_s"] > 0 and 0 <= j["acceptance_rate"] <= 1, "speeds and acceptance")
        check(close(j["speedup"], statistics.median(j["speedup_runs"])), "speedup is the rounds' median")
    empty = os.path.join(d, "empty.txt")
    open(empty, "w").close()
    for args, what in ((["--lookup", "2"], "--spec-prompts"),
                       (["--lookup", "2", "--spec-prompts", empty], "no prompts"), (["--spec-prompts", prompts], "--lookup"),
                       (["--lookup", "2", "--draft", model, "--spec-prompts", prompts], "--lookup, --draft"),
                       (["--lookup", "2", "--spec-prompts", os.path.join(d, "none.txt")], "--spec-prompts")):
        rc, out, err = bench(*args)
        check(rc != 0 and what in err, f"{' '.join(a if a != prompts else 'P' for a in args)}: an error naming {what} "
                                       f"(rc {rc}: {err.strip()[:120]})")

sys.exit(1 if failures else 0)
