#!/usr/bin/env bash
# Builds spes (with CUDA) for another x86-64 machine that has the NVIDIA driver, the CUDA
# toolkit and NCCL but none of our Debian libraries (the GPU test machines), and packs what
# it needs into one archive, OUT/bundle.tar.xz (~14 MiB; OUT defaults to .gpu-bundle, git-ignored):
#
#   scripts/gpu_bundle.sh [OUT]
#
# Inside: build/ (spes, the GPU test programs, the GPU bench; -march=x86-64-v3, debug info
# stripped), lib/ (every shared library ldd lists that is not glibc's, the driver's or the CUDA
# toolkit's: OpenBLAS, libyaml, jansson, gRPC + abseil, protobuf-c, OpenMPI, ...), data/ (Tiny
# Shakespeare for the GPU quality test) and env.sh (LD_LIBRARY_PATH, SPES_BIN, SPES_BUILD,
# SPES_TEST_DATA). On the GPU machine, from the repository root, with OUT carried:
#   mkdir -p /tmp/spes && tar -xJf .gpu-bundle/bundle.tar.xz -C /tmp/spes && source /tmp/spes/env.sh
#   bash tests/run_gpu.sh /tmp/spes/build; bash bench/run_gpu.sh /tmp/spes/build
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-.gpu-bundle}
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
  { echo "gpu_bundle: nvcc not found: a GPU bundle needs the CUDA toolkit here" >&2; exit 1; }
# A build directory of its own (objects stay here, only programs travel).
# CUDA_ARCHS=90 keeps the bundle small for an H100/H200; override for other GPUs.
make -j"$(nproc)" build BUILD=build-gpu-bundle ARCH=-march=x86-64-v3 CUDA_ARCHS="${CUDA_ARCHS:-90}"
STAGE=build-gpu-bundle/stage
rm -rf "$STAGE" "$OUT"
mkdir -p "$STAGE/build/tests-gpu" "$STAGE/build/bench" "$STAGE/lib" "$STAGE/data" "$OUT"
cp build-gpu-bundle/spes "$STAGE/build/"
cp build-gpu-bundle/tests-gpu/* "$STAGE/build/tests-gpu/"
cp build-gpu-bundle/bench/gpu_train_step "$STAGE/build/bench/"
rm -f "$STAGE"/build/tests-gpu/*.d
strip --strip-debug "$STAGE/build/spes" "$STAGE"/build/tests-gpu/* "$STAGE"/build/bench/*

# Libraries the GPU machine provides itself: glibc's, the driver's, the CUDA toolkit's
# (cudart is static; cuBLAS/cuBLASLt are loaded at run time; NCCL is too large to carry).
provided='^(linux-vdso|ld-linux|libc|libm|libdl|librt|libpthread|libresolv|libcuda|libnvidia|libnccl|libcublas|libcudart)\.'
for bin in "$STAGE/build/spes" "$STAGE"/build/tests-gpu/* "$STAGE"/build/bench/*; do
  ldd "$bin" 2>/dev/null | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  if [[ "$name" =~ $provided ]]; then continue; fi
  cp -L "$path" "$STAGE/lib/$name"
done

data=${SPES_TEST_DATA:-../shared/data}
if [ -f "$data/tinyshakespeare.txt" ]; then cp "$data/tinyshakespeare.txt" "$STAGE/data/"; fi
printf '%s\n' '# Sourced on the GPU machine (after unpacking the bundle anywhere).' \
  '_bundle=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)' \
  'export LD_LIBRARY_PATH="$_bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"' \
  'export SPES_BIN="$_bundle/build/spes" SPES_BUILD="$_bundle/build" SPES_TEST_DATA="$_bundle/data"' \
  > "$STAGE/env.sh"
tar -C "$STAGE" -cf - build lib data env.sh | xz -T0 -9 > "$OUT/bundle.tar.xz"
echo "gpu_bundle: $OUT/bundle.tar.xz ($(du -m "$OUT/bundle.tar.xz" | cut -f1) MiB; the carry limit is 64 MiB with the working tree)"
