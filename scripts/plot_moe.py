#!/usr/bin/env python3
"""Plots the fraction of the roofline floor against T per preset from `moekit bench moe --json` files.

    scripts/plot_moe.py OUT.png bench_moe_A.json bench_moe_B.json ...

Needs matplotlib (present on the GPU machines); the benchmark itself does not.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    fig, ax = plt.subplots(figsize=(8, 5))
    for path in argv[2:]:
        with open(path) as f:
            report = json.load(f)
        rows = sorted(report["rows"], key=lambda r: r["tokens"])
        ax.plot([r["tokens"] for r in rows], [r["floor_fraction_graph"] for r in rows], marker="o",
                label=report["preset"])
    ax.set_xscale("log", base=2)
    ax.axhline(0.85, color="grey", linestyle="--", linewidth=0.8)
    ax.axhline(0.70, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlabel("tokens T")
    ax.set_ylabel("fraction of the roofline floor (graph replay)")
    ax.set_title("moekit bf16 experts on " + report.get("device", "GPU"))
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(argv[1], dpi=120)


if __name__ == "__main__":
    main(sys.argv)
