#!/usr/bin/env bash
# Nsight Compute profiles of the fused router and of the MoE expert kernels, for finding where the time goes
# (run on the GPU machine after a build). Reports and SASS-level source pages go to $OUT_DIR.
#   BUILD_DIR=build OUT_DIR=/tmp/prof scripts/profile-kernels.sh [route] [moe PRESET T] [gemms PRESET T G1 G2]
set -uo pipefail
build="${BUILD_DIR:-build}"
out="${OUT_DIR:-prof-out}"
moekit="$build/tools/moekit"
mkdir -p "$out"
ncu_run() { ncu --clock-control none "$@"; }

# route NAME ARGS...: one router launch (--verify-only), full set with source, SASS page as CSV.
route() {
  local name="$1"
  shift
  ncu_run --set full --import-source yes --warp-sampling-interval 0 -k regex:route_fused -c 1 -f \
    -o "$out/route_$name" \
    "$moekit" bench route "$@" --verify-only >"$out/route_$name.log" 2>&1
  ncu --import "$out/route_$name.ncu-rep" --page source --csv --print-source sass >"$out/route_${name}_sass.csv" 2>&1
  ncu --import "$out/route_$name.ncu-rep" --page details >"$out/route_${name}_details.txt" 2>&1
}

# moe PRESET T: per-kernel duration, DRAM bytes and grid of every launch of a short bench run.
moe() {
  ncu_run --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size,launch__block_size,\
launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,launch__occupancy_limit_registers \
    -k regex:'expert_gemv|route_fused|combine_kernel|gather_tokens|activation_slots|fill_grouped|device_kernel' -c 16 --csv --page raw "$moekit" bench moe --preset "$1" --tokens "$2" --samples 3 >"$out/moe_$1_T$2.csv" 2>&1
}

# gemms PRESET T G1 G2: DRAM bytes, L2 hit rate and duration of the two grouped GEMMs of one call at T with tactics
# G1 / G2 (`moekit tactics` lists them), to compare against the weights' bytes: a tile whose row tiles miss each
# other's weight tiles in L2 reads the weights more than once. The verification's 1-token call comes first; its
# GEMMs are skipped.
gemms() {
  local csv="$out/gemms_$1_T$2_$3_$4.csv"
  ncu_run --print-units base \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct \
    -k regex:device_kernel -c 4 --csv --page raw "$moekit" bench moe --preset "$1" --tokens "$2" --samples 3 \
    --verify-tokens 1 --gemm1 "$3" --gemm2 "$4" >"$csv" 2>&1
  python3 - "$csv" "$1" "$2" "$3" "$4" <<'PY'
import csv, sys
path, preset, tokens, g1, g2 = sys.argv[1:]
rows = [r for r in csv.reader(open(path)) if r]
head = next((i for i, r in enumerate(rows) if r[0] == "ID"), None)
if head is None:
    sys.exit(f"no profile in {path}")
hdr = rows[head]
launches = [dict(zip(hdr, r)) for r in rows[head + 2:]]  # the row after the header holds the units
if len(launches) < 4:
    sys.exit(f"{path}: {len(launches)} grouped GEMM launches, expected 4")
num = lambda d, k: float(d[k].replace(",", ""))
print(f"| {preset} T={tokens} | GEMM | GB read | GB written | L2 hit % | us |")
print("|---|---|---|---|---|---|")
for name, tactic, d in (("GEMM1", g1, launches[2]), ("GEMM2", g2, launches[3])):
    print(f"| tactic {tactic} | {name} | {num(d, 'dram__bytes_read.sum') / 1e9:.2f} | "
          f"{num(d, 'dram__bytes_write.sum') / 1e9:.3f} | {num(d, 'lts__t_sector_hit_rate.pct'):.1f} | "
          f"{num(d, 'gpu__time_duration.sum') / 1e3:.1f} |")
PY
}

if [[ $# -eq 0 ]]; then set -- route; fi
case "$1" in
  route)
    dsv3=(--experts 256 --top-k 8 --block 64 --method sigmoid_grouped --n-group 8 --topk-group 4 --scale 2.5 --bias)
    route dsv3_T1 "${dsv3[@]}" --tokens 1
    route dsv3_T1024 "${dsv3[@]}" --tokens 1024
    route seed6_T8 --experts 512 --top-k 10 --block 8 --method softmax_topk --tokens 8
    ;;
  moe) moe "$2" "$3" ;;
  gemms) gemms "$2" "$3" "$4" "$5" ;;
esac
