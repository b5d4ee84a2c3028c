#!/usr/bin/env python3
"""Expected rows a grouped GEMM computes per routed row when each expert's rows are padded to whole row tiles.

With uniform routing each token picks K distinct experts of E, so one expert's routed rows are Binomial(T, K / E);
a tile of h rows computes ceil(r / h) * h rows for an expert with r rows. Prints, per T, the mean rows per expert,
the expected rows computed per routed row for each tile height, and the ratio of the last height to the first.

    scripts/padding_model.py --experts 128 --top-k 4 --tokens 6144,7680,8192 [--tiles 64,128]
"""
import argparse
import math


def binomial_pmf(n, p):
    """(k, P(k)) for Binomial(n, p), skipping terms below 1e-15."""
    if p >= 1.0:  # K = E: every expert gets every token
        yield n, 1.0
        return
    lp, lq = math.log(p), math.log1p(-p)
    for k in range(n + 1):
        pr = math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * lp + (n - k) * lq)
        if pr > 1e-15:
            yield k, pr


def rows_computed_per_routed_row(tokens, top_k, experts, tile):
    """E[ceil(r / tile) * tile] / E[r] for r ~ Binomial(tokens, top_k / experts)."""
    mean = tokens * top_k / experts
    padded = sum(pr * math.ceil(k / tile) * tile for k, pr in binomial_pmf(tokens, top_k / experts))
    return padded / mean


def main():
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("--experts", type=int, required=True, help="routed experts E")
    ap.add_argument("--top-k", type=int, required=True, help="experts per token K (K <= E)")
    ap.add_argument("--tokens", required=True, help="comma-separated T values (each >= 1)")
    ap.add_argument("--tiles", default="64,128", help="comma-separated row-tile heights (default 64,128)")
    a = ap.parse_args()
    tokens = [int(t) for t in a.tokens.split(",")]
    tiles = [int(h) for h in a.tiles.split(",")]
    if not 1 <= a.top_k <= a.experts:
        ap.error(f"--top-k ({a.top_k}) must be in [1, --experts ({a.experts})]")
    if any(t < 1 for t in tokens) or any(h < 1 for h in tiles):
        ap.error("every --tokens and --tiles value must be >= 1")
    head = " | ".join(f"{h}-row tiles" for h in tiles)
    print(f"| T | rows per expert | {head} | {tiles[-1]} / {tiles[0]} |")
    print("|---" * (len(tiles) + 3) + "|")
    for t in tokens:
        ratios = [rows_computed_per_routed_row(t, a.top_k, a.experts, h) for h in tiles]
        cells = " | ".join(f"{r:.3f}" for r in ratios)
        print(f"| {t} | {t * a.top_k / a.experts:.1f} | {cells} | {ratios[-1] / ratios[0]:.3f} |")


if __name__ == "__main__":
    main()
