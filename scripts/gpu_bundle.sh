#!/usr/bin/env bash
# Builds spes (with CUDA) for another x86-64 machine that has the NVIDIA driver, the CUDA
# toolkit and NCCL but none of our Debian libraries (the lent GPU machines), and packs what
# it needs into one archive, OUT/bundle.tar.xz (OUT defaults to .gpu-bundle, git-ignored):
#
#   scripts/gpu_bundle.sh [OUT]
#   NCCL_SRC=DIR scripts/gpu_bundle.sh [OUT]     # also build and carry NCCL from its source
#   BUNDLE_BUILD=build XZ_LEVEL=0 scripts/gpu_bundle.sh [OUT]   # pack an existing CUDA build, fast
#
# Inside:
#   build/  spes, the GPU test programs, the GPU bench (-march=x86-64-v3, debug info stripped)
#   lib/    every shared library ldd lists that is not glibc's, the driver's or the CUDA
#           toolkit's: OpenBLAS, libyaml, jansson, gRPC + abseil, protobuf-c, OpenMPI, PMIx, ...
#   mpi/    OpenMPI's runtime (mpirun, orted, ompi-server, its components and help texts, PMIx's
#           plugins), relocated by env.sh's OPAL_* / PMIX_* variables: the GPU machines have no
#           MPI, and the multi-rank tests start their ranks with mpirun
#   nccl/   with NCCL_SRC only: libnccl.so.2 built from that source (NCCL >= 2.30 lets two
#           ranks share one GPU, which the machines' own NCCL 2.28 refuses), for CUDA_ARCHS and
#           only the collectives src/parallel/nccl.c calls (the full library is ~200 MiB compressed,
#           over the 64 MiB a call can carry). env.sh does not put it on LD_LIBRARY_PATH:
#           scripts/gpu_check.sh runs the 2-rank test with it, everything else with the
#           machine's own NCCL.
#   data/   Tiny Shakespeare (the GPU quality test)
#   env.sh  LD_LIBRARY_PATH, PATH, the OPAL_*/PMIX_* variables, SPES_BIN, SPES_BUILD,
#           SPES_TEST_DATA, SPES_BUNDLE
# On the GPU machine, from the repository root, with OUT carried: bash scripts/gpu_check.sh
# (unpacks, runs the GPU tests and the GPU bench, keeps every log under $OUT).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-.gpu-bundle}
CUDA_ARCHS=${CUDA_ARCHS:-90}   # H100/H200; override for other GPUs
command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
  { echo "gpu_bundle: nvcc not found: a GPU bundle needs the CUDA toolkit here" >&2; exit 1; }
if [ -n "${BUNDLE_BUILD:-}" ]; then
  BUILD=$BUNDLE_BUILD   # pack this existing CUDA build as it is (tests/integration/gpu_bundle_mpi.sh)
  [ -x "$BUILD/spes" ] && [ -d "$BUILD/tests-gpu" ] ||
    { echo "gpu_bundle: $BUILD has no CUDA build (spes and tests-gpu/)" >&2; exit 1; }
else
  # A build directory of its own (objects stay here, only programs travel).
  BUILD=build-gpu-bundle
  make -j"$(nproc)" build BUILD=$BUILD ARCH=-march=x86-64-v3 CUDA_ARCHS="$CUDA_ARCHS"
fi
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
chmod 755 "$STAGE"
rm -rf "$OUT"
mkdir -p "$STAGE/build/tests-gpu" "$STAGE/build/bench" "$STAGE/lib" "$STAGE/data" "$OUT"
cp $BUILD/spes "$STAGE/build/"
cp $BUILD/tests-gpu/* "$STAGE/build/tests-gpu/"
cp $BUILD/bench/gpu_train_step "$STAGE/build/bench/"
rm -f "$STAGE"/build/tests-gpu/*.d
strip --strip-debug "$STAGE/build/spes" "$STAGE"/build/tests-gpu/* "$STAGE"/build/bench/*

# ---- OpenMPI's runtime (Debian's openmpi-bin 4.1 with its external PMIx) ----
MPI_LIBDIR=/usr/lib/x86_64-linux-gnu/openmpi/lib
PMIX_DIR=/usr/lib/x86_64-linux-gnu/pmix2
mkdir -p "$STAGE/mpi/bin" "$STAGE/mpi/etc" "$STAGE/mpi/share" "$STAGE/mpi/pmix/lib" "$STAGE/mpi/pmix/share"
cp -L /usr/bin/orterun "$STAGE/mpi/bin/mpirun"
cp -L /usr/bin/orted /usr/bin/orte-server "$STAGE/mpi/bin/"
ln -s orte-server "$STAGE/mpi/bin/ompi-server"
cp -rL "$MPI_LIBDIR/openmpi3" "$STAGE/mpi/openmpi3"             # the MCA components
cp -rL /usr/share/openmpi "$STAGE/mpi/share/"                    # help texts
cp /etc/openmpi/openmpi-mca-params.conf "$STAGE/mpi/etc/"       # Debian's: no ucx/ofi/openib
cp -rL "$PMIX_DIR/lib/pmix" "$STAGE/mpi/pmix/lib/"
cp -rL "$PMIX_DIR/share/pmix" "$STAGE/mpi/pmix/share/"
strip --strip-debug "$STAGE"/mpi/bin/orte* "$STAGE"/mpi/bin/mpirun

# ---- shared libraries ----
# Libraries the GPU machine provides itself: glibc's, the driver's, the CUDA toolkit's
# (cudart is static; cuBLAS/cuBLASLt are loaded at run time; NCCL is the machine's or nccl/).
provided='^(linux-vdso|ld-linux|libc|libm|libdl|librt|libpthread|libresolv|libcuda|libnvidia|libnccl|libcublas|libcudart)\.'
# needed FILE...: "NAME PATH" for each library ldd resolves for these files.
needed() { for f in "$@"; do ldd "$f" 2>/dev/null | awk '$3 ~ /^\// {print $1, $3}'; done | sort -u; }
carry_libs() {   # carry_libs FILE...: copies the libraries they need into lib/
  needed "$@" | while read -r name path; do
    [[ "$name" =~ $provided ]] || cp -L "$path" "$STAGE/lib/$name"
  done
}
carry_libs "$STAGE/build/spes" "$STAGE"/build/tests-gpu/* "$STAGE"/build/bench/* "$STAGE"/mpi/bin/orte* \
  "$STAGE/mpi/bin/mpirun"
# The components and their libraries (libpmix, OpenMPI's libmca_common_*), except a component
# that needs a fabric's library (libfabric, UCX, verbs, PSM): OpenMPI skips a component it cannot
# load, and the ranks of one node use shared memory and TCP.
fabric='^(libfabric|libuc[mpst]|libibverbs|librdmacm|libpsm|libefa|libmlx)'
for comp in "$STAGE"/mpi/openmpi3/*.so "$STAGE"/mpi/pmix/lib/pmix/*.so; do
  if needed "$comp" | grep -qE "$fabric"; then rm "$comp"; else carry_libs "$comp"; fi
done

# ---- NCCL from source (optional) ----
# NCCL_SRC: a checkout of https://github.com/NVIDIA/nccl (tag v2.30.7-1 was used); its objects
# go to NCCL_BUILD (default $BUILD/nccl), so a second run rebuilds nothing.
if [ -n "${NCCL_SRC:-}" ]; then
  NCCL_BUILD=$(realpath -m "${NCCL_BUILD:-$BUILD/nccl}")
  cuda_home=$(dirname "$(dirname "$(realpath "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")")
  # The toolkit's include folder may hold an older NCCL's headers (this one holds 2.28's), which
  # NCCL's host compiles would take before its own: give them the folder without those.
  cuda_inc=$NCCL_BUILD/cuda-include
  rm -rf "$cuda_inc"
  mkdir -p "$cuda_inc"
  for f in "$cuda_home"/include/*; do
    case $(basename "$f") in nccl*) ;; *) ln -s "$f" "$cuda_inc/" ;; esac
  done
  # The collectives src/parallel/nccl.c calls: all-reduce sums (f32, f64, i64 = u64, bytes),
  # reduce sum f32 (the reduce-scatter), broadcast (the all-gather, bytes), and what NCCL turns
  # them into: grouped broadcasts run as AllGatherV (NCCL_ALLGATHERV_ENABLE, on by default). A
  # function left out is built as a no-op, silently: keep this list in step with nccl.c.
  funcs='AllReduce Sum (i8|u8|i64|u64|f32|f64) * *|Reduce Sum f32 * *|Broadcast * *|AllGather * *|AllGatherV * *|SendRecv'
  gencode=$(for a in $CUDA_ARCHS; do printf -- '-gencode=arch=compute_%s,code=sm_%s ' "$a" "$a"; done)
  # NCCL's makefile does not regenerate its kernels when ONLY_FUNCS or the architectures change:
  # start its device part over when they differ from the last build's.
  stamp="$NCCL_BUILD/spes-nccl-flags"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$funcs $gencode" ]; then rm -rf "${NCCL_BUILD:?}/obj/device" "${NCCL_BUILD:?}/lib"; fi
  make -C "$NCCL_SRC" -j"$(nproc)" src.build BUILDDIR="$NCCL_BUILD" CUDA_HOME="$cuda_home" CUDA_INC="$cuda_inc" \
    NVCC_GENCODE="$gencode" ONLY_FUNCS="$funcs"
  echo "$funcs $gencode" >"$stamp"
  mkdir -p "$STAGE/nccl"
  cp -L "$NCCL_BUILD/lib/libnccl.so.2" "$STAGE/nccl/"
  strip --strip-debug "$STAGE/nccl/libnccl.so.2"
fi

data=${SPES_TEST_DATA:-../shared/data}
if [ -f "$data/tinyshakespeare.txt" ]; then cp "$data/tinyshakespeare.txt" "$STAGE/data/"; fi
cat >"$STAGE/env.sh" <<'EOF'
# Sourced on the GPU machine (after unpacking the bundle anywhere).
_bundle=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export SPES_BUNDLE="$_bundle"
export LD_LIBRARY_PATH="$_bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$_bundle/mpi/bin:$PATH"
export SPES_BIN="$_bundle/build/spes" SPES_BUILD="$_bundle/build" SPES_TEST_DATA="$_bundle/data"
# OpenMPI and PMIx look for their components, help texts and settings where Debian put them
# unless told otherwise (OpenMPI's and PMIx's installdirs "env" components read these).
export OPAL_PREFIX="$_bundle/mpi" OPAL_EXEC_PREFIX="$_bundle/mpi" OPAL_BINDIR="$_bundle/mpi/bin"
export OPAL_LIBDIR="$_bundle/lib" OPAL_PKGLIBDIR="$_bundle/mpi/openmpi3" OPAL_SYSCONFDIR="$_bundle/mpi/etc"
export OPAL_DATAROOTDIR="$_bundle/mpi/share" OPAL_DATADIR="$_bundle/mpi/share" OPAL_PKGDATADIR="$_bundle/mpi/share/openmpi"
export PMIX_PREFIX="$_bundle/mpi/pmix" PMIX_EXEC_PREFIX="$_bundle/mpi/pmix" PMIX_LIBDIR="$_bundle/lib"
export PMIX_PKGLIBDIR="$_bundle/mpi/pmix/lib/pmix" PMIX_DATADIR="$_bundle/mpi/pmix/share" PMIX_PKGDATADIR="$_bundle/mpi/pmix/share/pmix"
EOF
tar -C "$STAGE" -cf - . | xz -T0 -"${XZ_LEVEL:-9}" > "$OUT/bundle.tar.xz"
mib=$(du -m "$OUT/bundle.tar.xz" | cut -f1)
echo "gpu_bundle: $OUT/bundle.tar.xz ($mib MiB; the carry limit is 64 MiB with the working tree)"
if [ "$mib" -gt 56 ]; then echo "gpu_bundle: too large to carry with the working tree" >&2; exit 1; fi
