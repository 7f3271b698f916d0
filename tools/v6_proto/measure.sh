#!/usr/bin/env bash
# On a GPU machine (nvcc and ncu there): builds the prototype's variants, times each on 16M and 64M
# values of every kind, and profiles the default build's kernels. Usage: bash measure.sh OUT_DIR [DATA.bf16]
# (DATA.bf16: raw bfloat16 values, e.g. real weights, repeated to the size).
set -u
here=$(cd "$(dirname "$0")" && pwd); out=${1:?OUT_DIR}; data=${2:-}
mkdir -p "$out"
# Built where this runs unless OUT_DIR holds them already (build on the CPU machine with
# BUILD_ONLY=1 and carry OUT_DIR: nvcc there spends no device time).
build() { [ -x "$out/v6_$1" ] || nvcc -O3 -std=c++17 -arch=sm_90 "${@:2}" -o "$out/v6_$1" "$here/v6_proto.cu" || exit 1; }
build default
build family -DV6_GROUP_TABLES=0
build direct -DV6_DECODE_WINDOW=0
build hold -DV6_COMPRESS_REREAD=0 -DV6_COMPRESS_MIN_CTAS=2
build peek9 -DV6_PEEK=9
[ "${BUILD_ONLY:-0}" = 1 ] && exit 0
{ for v in default family direct hold peek9; do for n in 16777216 67108864; do echo -n "$v "; timeout 60 "$out/v6_$v" gaussian $n 20; done; done
  for k in mixed relu bits; do echo -n "default "; timeout 60 "$out/v6_default" $k 67108864 20; done
  [ -n "$data" ] && for n in 16777216 67108864; do echo -n "default file "; timeout 60 "$out/v6_default" file $n 20 "$data"; done
  echo -n "default again "; timeout 60 "$out/v6_default" gaussian 67108864 20; } 2>&1 | tee "$out/v6.log"
timeout 120 ncu --clock-control none -k regex:"Group|Compress|Decode" --launch-count 3 --metrics \
  gpu__time_duration.sum,dram__bytes.sum,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum \
  --csv --log-file "$out/ncu.csv" "$out/v6_default" gaussian 67108864 1 > /dev/null 2>&1
timeout 120 ncu --clock-control none -k regex:"Decode" --launch-count 1 --metrics \
  gpu__time_duration.sum,smsp__inst_executed.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum \
  --csv --log-file "$out/ncu_direct.csv" "$out/v6_direct" gaussian 67108864 1 > /dev/null 2>&1
compute-sanitizer --tool memcheck --error-exitcode 9 "$out/v6_default" mixed 1048576 2 2>&1 | tail -2 | tee "$out/sanitize.log"
compute-sanitizer --tool racecheck --error-exitcode 9 "$out/v6_default" mixed 65536 1 2>&1 | tail -2 | tee -a "$out/sanitize.log"
