#!/usr/bin/env bash
# bench/gpu_kernel_table.py (the profile stage of scripts/gpu_check.sh) on ncu CSVs whose sums
# are known by construction, in both layouts ncu writes: the details page (one row per kernel
# and metric, thousands grouped, ncu's own messages before the header) and the raw page (a
# column per metric, units in the row under the header); then the inputs it must refuse with
# a message instead of a table.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
t=bench/gpu_kernel_table.py

# Five launches: rmsnorm 2 x 40 us (bf16 and f32 templates), a cuBLAS GEMM 1,500 and 500 us,
# adamw 960 us; the other metric row of each kernel must be ignored. Total 3,040 us.
cat >"$dir/details.csv" <<'CSV'
==PROF== Connected to process 123 (/tmp/spes-bundle/build/bench/gpu_train_step)
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","123","gpu_train_step","h","void rmsnorm_forward_kernel<__nv_bfloat16, float, 8>(T1 *, float *, const T2 *, const float *, int, int, float)","1","7","(256, 1, 1)","(512, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","40,000"
"0","123","gpu_train_step","h","void rmsnorm_forward_kernel<__nv_bfloat16, float, 8>(T1 *, float *, const T2 *, const float *, int, int, float)","1","7","(256, 1, 1)","(512, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes.sum","byte","1,000"
"1","123","gpu_train_step","h","sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cublas","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","1,500"
"2","123","gpu_train_step","h","void rmsnorm_forward_kernel<float, float, 8>(T1 *, float *, const T2 *, const float *, int, int, float)","1","7","(256, 1, 1)","(512, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","40"
"3","123","gpu_train_step","h","sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cublas","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","msecond","0.5"
"4","123","gpu_train_step","h","adamw_kernel(const AdamWDesc *, int, AdamWScalars)","1","7","(256, 1, 1)","(9000, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","960"
CSV
python3 "$t" "$dir/details.csv" >"$dir/out"
grep -q "^kernels of the profiled step: 5 launches, 3.040 ms in all" "$dir/out" ||
  { cat "$dir/out"; echo "details page: total not 5 launches, 3.040 ms"; exit 1; }
# by kernel: the GEMM 2 launches 2.000 ms (65.8%), adamw 0.960, rmsnorm 2 launches 0.080 (mean 40 us)
grep -Eq "^ +2 +2\.000 +65\.8% +1000\.0  sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_cublas$" "$dir/out" ||
  { cat "$dir/out"; echo "details page: GEMM row"; exit 1; }
grep -Eq "^ +2 +0\.080 +2\.6% +40\.0  rmsnorm_forward_kernel$" "$dir/out" ||
  { cat "$dir/out"; echo "details page: rmsnorm grouped without template arguments"; exit 1; }
grep -Eq "^ +1 +0\.040 +1\.3% +40\.0  rmsnorm_forward_kernel<float, float, 8>$" "$dir/out" ||
  { cat "$dir/out"; echo "details page: the templated table"; exit 1; }
grep -Eq "^ +1 +0\.960 .* adamw_kernel$" "$dir/out" || { cat "$dir/out"; echo "details page: adamw"; exit 1; }
# --top 1: the rest in one line
python3 "$t" --top 1 "$dir/details.csv" >"$dir/top1"
grep -Eq "^ +3 +1\.040 +34\.2% .*\(2 more\)$" "$dir/top1" || { cat "$dir/top1"; echo "--top 1: the rest line"; exit 1; }

# The raw page: the same first three launches, units row under the header.
cat >"$dir/raw.csv" <<'CSV'
"ID","Process ID","Process Name","Host Name","Kernel Name","gpu__time_duration.sum"
"","","","","","usecond"
"0","123","gpu_train_step","h","void rmsnorm_forward_kernel<__nv_bfloat16, float, 8>(T1 *, float *)","40"
"1","123","gpu_train_step","h","sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_cublas","1500"
"2","123","gpu_train_step","h","void rmsnorm_forward_kernel<float, float, 8>(T1 *, float *)","40"
CSV
python3 "$t" "$dir/raw.csv" >"$dir/out"
grep -q "^kernels of the profiled step: 3 launches, 1.580 ms in all" "$dir/out" ||
  { cat "$dir/out"; echo "raw page: total"; exit 1; }

# Refused, with a message naming the file and what is wrong.
refuse() {   # refuse WHAT EXPECTED-MESSAGE-PART FILE
  if python3 "$t" "$3" >"$dir/o" 2>"$dir/e"; then echo "$1: accepted"; exit 1; fi
  grep -q "$2" "$dir/e" || { cat "$dir/e"; echo "$1: message lacks '$2'"; exit 1; }
}
printf '==PROF== Disconnected\n' >"$dir/empty.csv"
refuse "no header" "no ncu CSV header" "$dir/empty.csv"
sed 's/"usecond","960"/"fortnight","960"/' "$dir/details.csv" >"$dir/unit.csv"
refuse "unknown unit" "kernel ID 4: unknown time unit 'fortnight'" "$dir/unit.csv"
sed 's/"usecond","960"/"usecond","n\/a"/' "$dir/details.csv" >"$dir/nan.csv"
refuse "not a number" "'n/a' is not a number" "$dir/nan.csv"
grep -v gpu__time_duration "$dir/details.csv" >"$dir/none.csv"
refuse "no durations" "did the profiled step" "$dir/none.csv"
refuse "missing file" "cannot read" "$dir/absent.csv"
echo "gpu_kernel_table: both ncu layouts summed and grouped; 5 bad inputs refused"
