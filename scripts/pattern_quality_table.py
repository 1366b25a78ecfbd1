#!/usr/bin/env python3
"""Markdown tables from `tessel eval --json` output (docs/perf-log.md, "Pattern quality").

usage: pattern_quality_table.py eval.json [more.json ...]

Table 1: rel_l2 of each method at densities 0.1/0.2/0.3/0.5, linearly interpolated along the
method's own (density, rel_l2) points ("-" outside their range). Table 2: every measured point
with the random mask's rel_l2 at the same density (interpolated along the random points) and the
ratio random / method.
"""
import json
import sys


def interpolate(points, x):
    points = sorted(points)
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return None


def main(paths):
    rows = []
    config = None
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        config = config or data["config"]
        for r in data["results"]:
            name = r["method"]
            if name == "dynamic_topk" and "cdf" in path:
                name = "dynamic_topk (cdf)"
            rows.append(dict(r, method=name))
    random = [(r["density"], r["rel_l2"]) for r in rows if r["method"] == "random"]
    methods = []
    for r in rows:
        if r["method"] not in methods:
            methods.append(r["method"])
    print("| method | d=0.1 | d=0.2 | d=0.3 | d=0.5 |")
    print("|---|---|---|---|---|")
    for m in methods:
        pts = [(r["density"], r["rel_l2"]) for r in rows if r["method"] == m]
        cells = []
        for d in (0.1, 0.2, 0.3, 0.5):
            v = interpolate(pts, d)
            cells.append("-" if v is None else f"{v:.4f}")
        print(f"| {m} | " + " | ".join(cells) + " |")
    print()
    print("| method | param | density | rel_l2 | cosine | random rel_l2 at that density | random / method | estimate ms | attn ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["method"] == "random":
            continue
        base = interpolate(random, r["density"])
        ratio = "-" if base is None or r["rel_l2"] == 0 else f"{base / r['rel_l2']:.1f}x"
        base_text = "-" if base is None else f"{base:.4f}"
        print(f"| {r['method']} | {r['param']:g} | {r['density']:.3f} | {r['rel_l2']:.4f} | {r['cosine']:.5f} | {base_text} | {ratio} | "
              f"{r['estimate_ms']:.1f} | {r['attn_ms']:.0f} |")
    print()
    print(f"dense attention: {config['dense_ms']:.0f} ms; config: " + json.dumps({k: config[k] for k in sorted(config) if k != 'dense_ms'}))


if __name__ == "__main__":
    main(sys.argv[1:])
