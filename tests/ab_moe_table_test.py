#!/usr/bin/env python3
"""Checks scripts/ab_moe_table.py on bench moe JSON it writes itself: kernels matched by name and occurrence (a
pass one side fuses away gets a row with "-" on that side, the second GEMM stays against the second GEMM), the
medians over rounds and the ratio of the compared field. Exits 1 naming the first line that differs."""
import json
import subprocess
import sys
import tempfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "ab_moe_table.py"


def write(out, side, preset, rnd, tokens, kernels, graph_us):
    row = {"tokens": tokens, "gemm1": "g1", "gemm2": "g2", "experts_graph_us": graph_us,
           "experts_kernels": [{"name": n, "median_us": v} for n, v in kernels]}
    (out / f"{side}_{preset}_r{rnd}.json").write_text(json.dumps({"rows": [row]}))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        unfused = [("gather", 3.0), ("device_kernel", 139.0), ("activation", 2.8), ("device_kernel", 71.0),
                   ("combine", 3.3)]
        fused = [("gather", 3.0), ("device_kernel", 140.0), ("device_kernel", 71.2), ("combine", 3.3)]
        # A unfused, B fused; rounds of 212 / 214 / 213 us against 210 / 211 / 209 us (medians 213 and 210).
        for rnd, (ga, gb) in enumerate([(212.0, 210.0), (214.0, 211.0), (213.0, 209.0)], start=1):
            write(out, "A", "p", rnd, 16, unfused, ga)
            write(out, "B", "p", rnd, 16, [(n, v + rnd - 2) for n, v in fused], gb)
        # A GEMV call against a grouped one: no kernel in common but the combine.
        write(out, "A", "q", 1, 1, [("expert_gemv_kernel", 10.0), ("expert_gemv_kernel", 6.0), ("combine", 2.0)], 20.0)
        write(out, "B", "q", 1, 1, [("gather", 1.0), ("device_kernel", 12.0), ("combine", 2.0)], 30.0)
        text = subprocess.run([sys.executable, str(SCRIPT), str(out)], check=True, capture_output=True,
                              text=True).stdout
    expected = [
        "| p | 16 | gather | 3.0 | 3.0 |",
        "| p | 16 | device_kernel | 139.0 | 140.0 |",
        "| p | 16 | activation | 2.8 | - |",
        "| p | 16 | device_kernel (2) | 71.0 | 71.2 |",
        "| p | 16 | combine | 3.3 | 3.3 |",
        "| q | 1 | gather | - | 1.0 |",
        "| q | 1 | device_kernel | - | 12.0 |",
        "| q | 1 | expert_gemv_kernel | 10.0 | - |",
        "| q | 1 | expert_gemv_kernel (2) | 6.0 | - |",
        "| q | 1 | combine | 2.0 | 2.0 |",
        "| p | 16 | g1 / g2 | g1 / g2 | 213.0 | 210.0 | 0.986 | 212.0-214.0 | 209.0-211.0 |",
        "| q | 1 | g1 / g2 | g1 / g2 | 20.0 | 30.0 | 1.500 | 20.0 | 30.0 |",
    ]
    lines = text.splitlines()
    for want in expected:
        if want not in lines:
            print(f"missing line: {want}\n--- output:\n{text}")
            return 1
    kernel_rows = [l for l in lines if l.startswith("| p | 16 |")][:5]
    if kernel_rows != expected[:5]:
        print("kernel rows out of launch order:\n" + "\n".join(kernel_rows))
        return 1
    print("ab_moe_table: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
