#!/usr/bin/env bash
# Builds spes (with CUDA) for another x86-64 machine that has the NVIDIA driver, the CUDA
# toolkit and NCCL but none of our Debian libraries (the GPU test machines), and gathers
# what it needs into one folder:
#
#   scripts/gpu_bundle.sh [OUT]        OUT defaults to .gpu-bundle (git-ignored)
#
# OUT/build/    spes, the unit/GPU test programs and the benches (portable: -march=x86-64-v3)
# OUT/lib/      every shared library ldd lists that is not glibc, the driver or the CUDA
#               toolkit's own (OpenBLAS, libyaml, jansson, gRPC + abseil, protobuf-c, OpenMPI, ...)
# OUT/env.sh    `source OUT/env.sh` there: LD_LIBRARY_PATH, SPES_BIN, SPES_BUILD
#
# On the GPU machine, from the repository root (the working tree travels, OUT is carried):
#   source .gpu-bundle/env.sh && bash tests/run_gpu.sh .gpu-bundle/build
#   source .gpu-bundle/env.sh && bash bench/run_gpu.sh .gpu-bundle/build
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-.gpu-bundle}
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
  { echo "gpu_bundle: nvcc not found: a GPU bundle needs the CUDA toolkit here" >&2; exit 1; }
# A build directory of its own (objects stay here, only programs travel).
# CUDA_ARCHS=90 keeps the bundle small for an H100/H200; override for other GPUs.
make -j"$(nproc)" build BUILD=build-gpu-bundle ARCH=-march=x86-64-v3 CUDA_ARCHS="${CUDA_ARCHS:-90}"
rm -rf "$OUT"
BUILD="$OUT/build"
mkdir -p "$BUILD/tests-gpu" "$BUILD/bench"
cp build-gpu-bundle/spes "$BUILD/"
cp build-gpu-bundle/tests-gpu/* "$BUILD/tests-gpu/" 2>/dev/null || true
cp build-gpu-bundle/bench/gpu_train_step "$BUILD/bench/"
rm -f "$BUILD"/tests-gpu/*.d
strip --strip-debug "$BUILD/spes" "$BUILD"/tests-gpu/* "$BUILD"/bench/*

# Libraries the GPU machine provides itself: glibc's, the driver's, the CUDA toolkit's
# (cudart is static; cuBLAS/cuBLASLt are loaded at run time; NCCL is too large to carry).
provided='^(linux-vdso|ld-linux|libc|libm|libdl|librt|libpthread|libresolv|libcuda|libnvidia|libnccl|libcublas|libcudart)\.'
mkdir -p "$OUT/lib"
for bin in "$BUILD/spes" "$BUILD"/tests-gpu/* "$BUILD"/bench/*; do
  [ -x "$bin" ] && [ -f "$bin" ] || continue
  ldd "$bin" 2>/dev/null | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  if [[ "$name" =~ $provided ]]; then continue; fi
  cp -L "$path" "$OUT/lib/$name"
done

cat > "$OUT/env.sh" <<'EOF'
# Sourced on the GPU machine from the repository root.
_bundle=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export LD_LIBRARY_PATH="$_bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export SPES_BIN="$_bundle/build/spes" SPES_BUILD="$_bundle/build"
EOF
size=$(du -sm "$OUT" | awk '{print $1}')
echo "gpu_bundle: $OUT ready (~${size} MiB of binaries and libraries; the carry limit is 64 MiB in all)"
