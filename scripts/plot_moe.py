#!/usr/bin/env python3
"""Plots the fraction of the roofline floor against T per preset from `moekit bench moe --json` files, and where a
file has the cuBLAS reference (`bench moe --cublas`), the reference's cold floor fraction as a dashed line of the
same colour.

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
        line, = ax.plot([r["tokens"] for r in rows], [r["floor_fraction_graph"] for r in rows], marker="o",
                        label=report["preset"])
        ref = [r for r in rows if "cublas_baseline" in r]
        if ref:
            ax.plot([r["tokens"] for r in ref], [r["cublas_baseline"]["floor_fraction_cold"] for r in ref],
                    linestyle="--", marker=".", color=line.get_color(), alpha=0.7,
                    label=report["preset"] + ": cuBLAS reference (cold)")
    ax.set_xscale("log", base=2)
    ax.axhline(0.85, color="grey", linestyle="--", linewidth=0.8)
    ax.axhline(0.70, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlabel("tokens T")
    ax.set_ylabel("fraction of the roofline floor (graph replay)")
    ax.set_title("moekit bf16 experts on " + report.get("device", "GPU"))
    ax.legend(fontsize="small")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(argv[1], dpi=120)


if __name__ == "__main__":
    main(sys.argv)
