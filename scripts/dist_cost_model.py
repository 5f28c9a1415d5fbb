#!/usr/bin/env python3
"""Cost model of tern's parallel layouts (docs/distributed.md): predicted decode tok/s and
prompt time of tensor and pipeline parallelism on N nodes joined by a network of a given
bandwidth and latency. Python's standard library only.

Decode is bound by memory bandwidth: a node's time for one token is the weight bytes it reads
over its bandwidth B. Prompt processing is bound by compute: a node runs P prompt tokens/s.
Per generated token of one sequence, and per prompt of T tokens:

  one node         decode W / B                         prompt T / P
  tensor parallel  decode W / (N B) + 2 L ar(E) + ag(V / N)
                   prompt T / (N P) + 2 L ar(T E)
                   ar(n floats): tern's all-reduce is an all-gather of the partial sums summed in
                   rank order: ceil(log2 N) latencies + (N - 1) 4 n bytes over the link
  pipeline         decode W / B + N (a + 4 E / link)    (stages work one after another: a
                                                          pipeline adds capacity, not speed)
                   prompt (m + N - 1) (T / (m N P) + a + 4 E T / m / link) with m micro-batches:
                   the bubble (N - 1) / (m + N - 1) shrinks as m grows
"""
import argparse
import math

SHAPES = {
    # name: (n_embd, n_layer, n_vocab, bytes of the q4_0 file's weights)
    "tinyllama-1.1b": (2048, 22, 32000, 0.62e9),
    "llama2-7b": (4096, 32, 32000, 3.83e9),
    "llama3-8b": (4096, 32, 128256, 4.66e9),
}


def log_rounds(n):
    return math.ceil(math.log2(n)) if n > 1 else 0


def decode_s(layout, W, E, L, V, N, B, link, lat):
    if N == 1:
        return W / B
    if layout == "tp":
        ar = log_rounds(N) * lat + (N - 1) * 4 * E / link
        ag = log_rounds(N) * lat + (N - 1) * 4 * V / N / link
        return W / (N * B) + 2 * L * ar + ag
    return W / B + N * (lat + 4 * E / link)


def prompt_s(layout, T, E, L, N, P, link, lat, m):
    if N == 1:
        return T / P
    if layout == "tp":
        return T / (N * P) + 2 * L * (log_rounds(N) * lat + (N - 1) * 4 * E * T / link)
    return (m + N - 1) * (T / (m * N * P) + lat + 4 * E * T / m / link)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="llama2-7b", choices=sorted(SHAPES))
    ap.add_argument("--mem-gbs", type=float, default=40.0, help="one node's memory read bandwidth, GB/s")
    ap.add_argument("--prompt-tok-s", type=float, default=25.0, help="one node's prompt-processing rate, tok/s")
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens")
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--nodes", default="1,2,4,8")
    ap.add_argument("--links", default="10:100,1:1000", help="GBIT:LATENCY_US pairs")
    a = ap.parse_args()
    E, L, V, W = SHAPES[a.shape]
    B = a.mem_gbs * 1e9
    print(f"{a.shape}: {W / 1e9:.2f} GB of q4_0 weights, {L} layers of {E}; one node reads {a.mem_gbs:g} GB/s "
          f"and prompts {a.prompt_tok_s:g} tok/s; prompt of {a.prompt} tokens, pipeline of {a.micro_batches} micro-batches")
    print("| link | nodes | decode tok/s tp | decode tok/s pp | prompt s tp | prompt s pp | decode | prompt |")
    print("|---|---|---|---|---|---|---|---|")
    for spec in a.links.split(","):
        gbit, lat_us = (float(x) for x in spec.split(":"))
        link, lat = gbit * 1e9 / 8, lat_us * 1e-6
        one_d, one_p = W / B, a.prompt / a.prompt_tok_s
        for N in (int(n) for n in a.nodes.split(",")):
            d = {k: decode_s(k, W, E, L, V, N, B, link, lat) for k in ("tp", "pp")}
            p = {k: prompt_s(k, a.prompt, E, L, N, a.prompt_tok_s, link, lat, a.micro_batches) for k in ("tp", "pp")}
            best_d = min(("one node", one_d), ("tp", d["tp"]), ("pp", d["pp"]), key=lambda x: x[1])[0]
            best_p = min(("one node", one_p), ("tp", p["tp"]), ("pp", p["pp"]), key=lambda x: x[1])[0]
            print(f"| {gbit:g} Gbit/s + {lat_us:g} us | {N} | {1 / d['tp']:.1f} | {1 / d['pp']:.1f} | "
                  f"{p['tp']:.1f} | {p['pp']:.1f} | {best_d} | {best_p} |")


if __name__ == "__main__":
    main()
