#!/usr/bin/env python3
"""Draws goodput against request rate from bench/goodput_curve.sh's JSON files as an SVG.

    python3 bench/goodput_chart.py OUT_DIR "0.5 1 2" out.svg "objective text"

Reads OUT_DIR/tern_r<R>.json, fixed_r<R>.json and (when present) peer_r<R>.json; plots each
engine's goodput (requests/s meeting the objectives) and the offered rate as the ideal line.
"""
import json
import os
import sys
from html import escape


def load(path, key):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        v = json.load(f).get(key)
    return float(v) if v is not None else None


def main():
    out_dir, rates_text, svg_path, title = sys.argv[1:5]
    rates = [float(r) for r in rates_text.split()]
    names = [r for r in rates_text.split()]
    series = [
        ("tern, TBT target", "tern", "#1f77b4"),
        ("tern, token budget alone", "fixed", "#ff7f0e"),
        ("llama.cpp (node-llama-cpp)", "peer", "#2ca02c"),
    ]
    data = []
    for label, prefix, color in series:
        ys = [load(os.path.join(out_dir, f"{prefix}_r{n}.json"), "goodput_req_s") for n in names]
        if any(y is not None for y in ys):
            data.append((label, color, ys))
    w, h, left, right, top, bottom = 640, 400, 60, 20, 40, 50
    x_max = max(rates) * 1.05
    y_max = max([max(rates)] + [y for _, _, ys in data for y in ys if y is not None]) * 1.1
    px = lambda x: left + (w - left - right) * x / x_max
    py = lambda y: h - bottom - (h - top - bottom) * y / y_max
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
             f'<rect width="{w}" height="{h}" fill="white"/>',
             f'<text x="{w / 2}" y="20" text-anchor="middle" font-size="14">Goodput vs request rate ({escape(title)})</text>']
    for i in range(6):
        y = y_max * i / 5
        parts.append(f'<line x1="{left}" y1="{py(y):.1f}" x2="{w - right}" y2="{py(y):.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.2f}</text>')
    for r in rates:
        parts.append(f'<text x="{px(r):.1f}" y="{h - bottom + 16}" text-anchor="middle">{r:g}</text>')
    parts.append(f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle">offered rate (requests/s, Poisson)</text>')
    parts.append(f'<text x="16" y="{h / 2}" text-anchor="middle" transform="rotate(-90 16 {h / 2})">goodput (requests/s)</text>')
    parts.append(f'<line x1="{px(0):.1f}" y1="{py(0):.1f}" x2="{px(max(rates)):.1f}" y2="{py(max(rates)):.1f}" '
                 'stroke="#999" stroke-dasharray="4 4"/>')
    for k, (label, color, ys) in enumerate(data):
        pts = [(px(x), py(y)) for x, y in zip(rates, ys) if y is not None]
        parts.append('<polyline fill="none" stroke-width="2" stroke="%s" points="%s"/>'
                     % (color, " ".join(f"{a:.1f},{b:.1f}" for a, b in pts)))
        for a, b in pts:
            parts.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{color}"/>')
        parts.append(f'<rect x="{left + 10}" y="{top + 4 + 18 * k}" width="12" height="12" fill="{color}"/>')
        parts.append(f'<text x="{left + 28}" y="{top + 14 + 18 * k}">{escape(label)}</text>')
    parts.append(f'<text x="{left + 28}" y="{top + 14 + 18 * len(data)}" fill="#999">- - offered rate (all requests good)</text>')
    parts.append("</svg>")
    with open(svg_path, "w") as f:
        f.write("\n".join(parts) + "\n")


if __name__ == "__main__":
    main()
