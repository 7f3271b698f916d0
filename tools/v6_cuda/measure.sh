#!/usr/bin/env bash
# On a GPU machine (nvcc, ncu, compute-sanitizer there): builds tools/v6_cuda/time6.cu, times the
# version-6 CUDA codec on bf16/fp16/fp32 Gaussians (16M and 64M) and ReLU outputs, and a data file if
# given, each round trip checked bit for bit, and the reduce step (ROWS: 64 and 16 MB buckets in 8
# and 64 rows, sums checked bit for bit); profiles each kernel; runs the sanitizers.
# Usage: bash tools/v6_cuda/measure.sh OUT_DIR [DATA.bf16]   (BUILD_ONLY=1: build and stop, e.g. on a
# CPU machine with nvcc, then carry OUT_DIR so the GPU machine spends no time compiling)
set -u
here=$(cd "$(dirname "$0")" && pwd); out=${1:?OUT_DIR}; data=${2:-}
mkdir -p "$out"
[ -x "$out/time6" ] || nvcc -O3 -std=c++17 -arch=sm_90 -lineinfo -o "$out/time6" "$here/time6.cu" || exit 1
[ "${BUILD_ONLY:-0}" = 1 ] && exit 0
{ for dt in bf16 fp16 fp32; do for n in 16777216 67108864; do timeout 60 "$out/time6" $dt gaussian $n 20; done; done
  timeout 60 "$out/time6" bf16 relu 67108864 20
  [ -n "$data" ] && for n in 16777216 67108864; do timeout 60 "$out/time6" bf16 file $n 20 "$data"; done
  timeout 60 "$out/time6" bf16 gaussian 67108864 20
  # the reduce step: a 64 MB and a 16 MB bucket of bf16 cut into 8 and 64 rows, fp32's 64 MB in 8
  for rows in 8 64; do for n in 33554432 8388608; do ROWS=$rows timeout 60 "$out/time6" bf16 gaussian $n 20; done; done
  ROWS=8 timeout 60 "$out/time6" fp32 gaussian 16777216 20; } 2>&1 | tee "$out/time6.log"
ROWS=64 timeout 180 ncu --clock-control none -k regex:"Group|Scan|Code|Decode|Accumulate" --launch-count 6 --metrics \
  gpu__time_duration.sum,dram__bytes.sum,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum \
  --csv --log-file "$out/ncu.csv" "$out/time6" bf16 gaussian 67108864 1 > /dev/null 2>&1
compute-sanitizer --tool memcheck --error-exitcode 9 "$out/time6" fp32 gaussian 1000003 1 2>&1 | tail -2 | tee "$out/sanitize.log"
compute-sanitizer --tool racecheck --error-exitcode 9 "$out/time6" bf16 relu 70001 1 2>&1 | tail -2 | tee -a "$out/sanitize.log"
ROWS=11 compute-sanitizer --tool racecheck --error-exitcode 9 "$out/time6" bf16 gaussian 500000 1 2>&1 | tail -2 | tee -a "$out/sanitize.log"
compute-sanitizer --tool synccheck --error-exitcode 9 "$out/time6" fp16 gaussian 70001 1 2>&1 | tail -2 | tee -a "$out/sanitize.log"
