#!/usr/bin/env python3
"""Decode speed and cache bytes against the context: one SVG from `tern bench --depth ... --json`.

    tern bench -m mamba.gguf -p 0 -n 32 --depth 1024,4096,16384,32768 --json > mamba.json
    tern bench -m llama.gguf -p 0 -n 32 --depth 1024,4096,16384,32768 --json > llama.json
    python3 scripts/plot_decode_depth.py mamba.json:Mamba-2 llama.json:Llama -o depth.svg

Left: tg tok/s at each depth relative to the first depth (1.0 = no slower). Right: the cache a
sequence holds at that depth (K/V rows of every position + a recurrent model's fixed state).
Both x axes are log2 of the depth. Standard library only.
"""
import argparse
import json
import math
import sys

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"]


def nice_ticks(lo, hi, want=5):
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / want
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw), default=10 * mag)
    first = math.floor(lo / step) * step
    ticks, t = [], first
    while not ticks or ticks[-1] < hi - step * 1e-9:  # the last tick covers hi
        ticks.append(round(t, 10))
        t += step
    return ticks


def esc(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def panel(series, key, title, ylabel, x0, y0, w, h):
    """series: [(label, color, [(depth, value)])] -> SVG elements of one panel."""
    xs = [math.log2(d) for _, _, pts in series for d, _ in pts]
    ys = [v for _, _, pts in series for _, v in pts]
    xlo, xhi = min(xs), max(xs)
    if xhi == xlo:
        xhi = xlo + 1
    yt = nice_ticks(0, max(ys) * 1.05)
    ylo, yhi = yt[0], yt[-1]
    px = lambda x: x0 + (x - xlo) / (xhi - xlo) * w
    py = lambda y: y0 + h - (y - ylo) / (yhi - ylo) * h
    out = [f'<text x="{x0 + w / 2}" y="{y0 - 12}" text-anchor="middle" font-weight="bold">{esc(title)}</text>',
           f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#888"/>']
    for t in yt:
        out.append(f'<line x1="{x0}" y1="{py(t):.1f}" x2="{x0 + w}" y2="{py(t):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{x0 - 6}" y="{py(t) + 4:.1f}" text-anchor="end">{t:g}</text>')
    for e in range(math.ceil(xlo), math.floor(xhi) + 1):
        d = 2 ** e
        label = f"{d // 1024}k" if d >= 1024 else str(d)
        out.append(f'<line x1="{px(e):.1f}" y1="{y0 + h}" x2="{px(e):.1f}" y2="{y0 + h + 4}" stroke="#888"/>')
        out.append(f'<text x="{px(e):.1f}" y="{y0 + h + 18}" text-anchor="middle">{label}</text>')
    out.append(f'<text x="{x0 + w / 2}" y="{y0 + h + 36}" text-anchor="middle">context (tokens, log scale)</text>')
    out.append(f'<text x="{x0 - 44}" y="{y0 + h / 2}" text-anchor="middle" '
               f'transform="rotate(-90 {x0 - 44} {y0 + h / 2})">{esc(ylabel)}</text>')
    for label, color, pts in series:
        path = " ".join(f"{'M' if i == 0 else 'L'}{px(math.log2(d)):.1f},{py(v):.1f}" for i, (d, v) in enumerate(pts))
        out.append(f'<path d="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for d, v in pts:
            out.append(f'<circle cx="{px(math.log2(d)):.1f}" cy="{py(v):.1f}" r="3" fill="{color}"/>')
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reports", nargs="+", help="FILE.json or FILE.json:LABEL (tern bench --depth ... --json)")
    ap.add_argument("-o", "--output", required=True, help="SVG file to write")
    ap.add_argument("--title", default="Decode against the context")
    a = ap.parse_args()
    import os
    inputs = [os.path.realpath(spec.partition(":")[0]) for spec in a.reports]
    if os.path.realpath(a.output) in inputs:
        sys.exit(f"{a.output}: is one of the input reports; write the chart elsewhere")
    speed, cache = [], []
    for i, spec in enumerate(a.reports):
        path, _, label = spec.partition(":")
        with open(path) as f:
            j = json.load(f)
        runs = j.get("depth_runs")
        if not runs:
            sys.exit(f"{path}: no depth_runs (run tern bench with --depth ... --json)")
        label = label or j.get("model", path)
        color = COLORS[i % len(COLORS)]
        base = runs[0]["tg_tok_s"]
        speed.append((label, color, [(r["depth"], r["tg_tok_s"] / base) for r in runs]))
        cache.append((label, color, [(r["depth"], r["cache_bytes"] / 2**20) for r in runs]))
    w, h, left, top = 380, 260, 70, 60
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * w + 3 * left}" height="{h + top + 110}" '
           f'font-family="sans-serif" font-size="12">',
           f'<text x="{w + 1.5 * left}" y="22" text-anchor="middle" font-size="15" font-weight="bold">{esc(a.title)}</text>']
    svg += panel(speed, "tg", "decode speed / at the first depth", "relative tok/s", left, top, w, h)
    svg += panel(cache, "cache", "cache per sequence", "MiB", 2 * left + w + 20, top, w, h)
    for i, (label, color, _) in enumerate(speed):
        y = top + h + 60 + 16 * (i // 3)
        x = left + (i % 3) * 250
        svg.append(f'<rect x="{x}" y="{y - 9}" width="14" height="4" fill="{color}"/>')
        svg.append(f'<text x="{x + 20}" y="{y - 4}">{esc(label)}</text>')
    svg.append("</svg>")
    with open(a.output, "w") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
