"""Summarizes scripts/ab-moe.sh runs: OUT_DIR/{A,B}_PRESET_rROUND.json (bench moe --json) -> markdown tables.

For each preset and T: each kernel's cold median (median over rounds) for A and B, kernels matched by name and
occurrence (the second device_kernel of A against the second of B), so that a kernel only one side launches (an
activation pass that the other fuses into GEMM1) gets a row of its own with "-" on the other side; then, last so
that the tail of any log shows it, the median over rounds of the experts graph time of A and of B (or another row
field, e.g. route_experts_graph_us), their ratio (B / A, below 1 when B is faster) and the range over rounds.
Usage: python3 scripts/ab_moe_table.py OUT_DIR [FIELD]
"""
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

NAME = re.compile(r"^(A|B)_(.+)_r(\d+)\.json$")


def load(out_dir):
    """runs[preset][tokens][side] -> list of rows (one per round)."""
    runs = defaultdict(lambda: defaultdict(lambda: {"A": [], "B": []}))
    for path in sorted(Path(out_dir).glob("*.json")):
        m = NAME.match(path.name)
        if not m:
            continue
        side, preset = m.group(1), m.group(2)
        for row in json.loads(path.read_text())["rows"]:
            runs[preset][row["tokens"]][side].append(row)
    return runs


def fmt_range(values):
    return f"{min(values):.1f}-{max(values):.1f}" if len(values) > 1 else f"{values[0]:.1f}"


def cells(runs):
    """(preset, tokens, A rows, B rows) in preset and T order."""
    for preset in sorted(runs):
        for tokens in sorted(runs[preset]):
            yield preset, tokens, runs[preset][tokens]["A"], runs[preset][tokens]["B"]


def keyed(kernels):
    """[(name, occurrence)] of one run's kernel list, in launch order."""
    seen = defaultdict(int)
    keys = []
    for k in kernels:
        keys.append((k["name"], seen[k["name"]]))
        seen[k["name"]] += 1
    return keys


def merged_keys(a, b):
    """The keys of launch orders a and b in one order: a's, with each of b's own keys after the key b launched
    before it."""
    out = list(a)
    for i, key in enumerate(b):
        if key not in out:
            out.insert(out.index(b[i - 1]) + 1 if i > 0 else 0, key)
    return out


def median_kernel(rounds, key):
    """Median over rounds of the cold median of the kernel `key` (name, occurrence), or "-" where no round has it."""
    vals = [k["median_us"] for r in rounds for k, kk in zip(r, keyed(r)) if kk == key]
    return f"{statistics.median(vals):.1f}" if vals else "-"


def main(argv):
    if len(argv) not in (2, 3):
        print(__doc__.strip())
        return 2
    field = argv[2] if len(argv) == 3 else "experts_graph_us"
    runs = load(argv[1])
    if not runs:
        print(f"no A_*/B_* JSON files in {argv[1]}")
        return 1
    print("| preset | T | kernel | A cold us | B cold us |")
    print("|---|---|---|---|---|")
    for preset, tokens, a, b in cells(runs):
        if not a or not b:
            continue
        ka = [r.get("experts_kernels", []) for r in a]
        kb = [r.get("experts_kernels", []) for r in b]
        for key in merged_keys(keyed(ka[0]), keyed(kb[0])):
            name = key[0] if key[1] == 0 else f"{key[0]} ({key[1] + 1})"
            print(f"| {preset} | {tokens} | {name} | {median_kernel(ka, key)} | {median_kernel(kb, key)} |")
    print()
    first = next(r for _, _, a, b in cells(runs) for r in a + b)
    if field not in first:
        print(f"no row field {field!r} in the JSON (fields: {', '.join(sorted(first))})")
        return 2
    print(f"{field}:")
    print("| preset | T | A tactics | B tactics | A us | B us | B / A | A range | B range |")
    print("|---|---|---|---|---|---|---|---|---|")
    for preset, tokens, a, b in cells(runs):
        if not a or not b:
            print(f"| {preset} | {tokens} | missing {'A' if not a else 'B'} |||||||")
            continue
        ga = [r[field] for r in a]
        gb = [r[field] for r in b]
        ma, mb = statistics.median(ga), statistics.median(gb)
        ta = f"{a[0]['gemm1']} / {a[0]['gemm2']}"
        tb = f"{b[0]['gemm1']} / {b[0]['gemm2']}"
        print(f"| {preset} | {tokens} | {ta} | {tb} | {ma:.1f} | {mb:.1f} | {mb / ma:.3f} | {fmt_range(ga)} | "
              f"{fmt_range(gb)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
