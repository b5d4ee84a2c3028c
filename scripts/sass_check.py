#!/usr/bin/env python3
"""Checks the machine code (SASS) of moekit's CUDA libraries without a GPU.

    sass_check.py --cuobjdump PATH [--min-gemms N] LIB.a...

For every kernel in the libraries' device code (cuobjdump -sass):
  - the code is for sm_90a;
  - no instruction touches local memory (LDL, STL: a stack frame or spilled registers);
  - a CUTLASS GEMM kernel (cutlass::device_kernel) issues warpgroup MMAs (HGMMA), so its tensor-core path was not
    lowered to something slower;
and at least N CUTLASS GEMM kernels exist. Prints one line per kernel (instructions, HGMMA, local accesses) and
exits 1 naming every kernel that breaks a rule.
"""
import argparse
import os
import re
import subprocess
import sys

FUNCTION = re.compile(r"^\s*Function : (\S+)")
ARCH = re.compile(r"^arch = (\S+)")
INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(?:\.[A-Z0-9_.]+)?\b")


def kernels(lib, cuobjdump):
    """Yields (arch, name, opcodes) for each kernel of `lib`."""
    # cuobjdump runs nvdisasm, which scripts/setup.sh puts beside it.
    env = dict(os.environ, PATH=os.path.dirname(os.path.abspath(cuobjdump)) + os.pathsep + os.environ.get("PATH", ""))
    out = subprocess.run([cuobjdump, "-sass", lib], check=True, capture_output=True, text=True, env=env).stdout
    arch, name, ops = None, None, []
    for line in out.splitlines():
        m = ARCH.match(line)
        if m:
            arch = m.group(1)
            continue
        m = FUNCTION.match(line)
        if m:
            if name:
                yield arch, name, ops
            name, ops = m.group(1), []
            continue
        m = INSTRUCTION.search(line)
        if m and name:
            ops.append(m.group(1))
    if name:
        yield arch, name, ops


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cuobjdump", required=True)
    ap.add_argument("--min-gemms", type=int, default=1, help="fewest CUTLASS GEMM kernels expected")
    ap.add_argument("libs", nargs="+")
    args = ap.parse_args()

    failures, gemms, total = [], 0, 0
    for lib in args.libs:
        for arch, name, ops in kernels(lib, args.cuobjdump):
            total += 1
            hgmma = sum(op == "HGMMA" for op in ops)
            local = sum(op in ("LDL", "STL") for op in ops)
            is_gemm = "cutlass13device_kernel" in name and "gemm" in name
            gemms += is_gemm
            print(f"{len(ops):6d} instructions  {hgmma:3d} HGMMA  {local:3d} local  {arch}  {name[:110]}")
            if arch != "sm_90a":
                failures.append(f"{name}: built for {arch}, not sm_90a")
            if local:
                failures.append(f"{name}: {local} local-memory instructions (LDL/STL)")
            if is_gemm and hgmma == 0:
                failures.append(f"{name}: a CUTLASS GEMM without HGMMA")
            if not ops:
                failures.append(f"{name}: no instructions parsed")
    if gemms < args.min_gemms:
        failures.append(f"{gemms} CUTLASS GEMM kernels found, expected at least {args.min_gemms}")
    print(f"sass_check: {total} kernels, {gemms} CUTLASS GEMMs")
    for f in failures:
        print(f"sass_check: FAIL {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
