#!/usr/bin/env bash
# The GPU bundle's OpenMPI (scripts/gpu_bundle.sh): the lent GPU machines have no MPI, so the
# bundle carries OpenMPI's runtime (mpirun, orted, ompi-server, the components, PMIx), which
# its env.sh relocates. Here, in a mount namespace where Debian's OpenMPI and PMIx are hidden
# (an empty tmpfs over their directories, /dev/null over their libraries and programs), the
# unpacked bundle's spes trains with several ranks: tests/integration/dist_torchrun.sh (ranks
# from mpirun, torchrun-style ranks joined over ompi-server, a killed rank) passes with no
# OpenMPI but the bundle's.
# Packs the existing build ($SPES_BUILD, which must be a CUDA build). Skipped without one,
# without root or mount namespaces (a container without CAP_SYS_ADMIN), and under ASan.
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/integration/lib/require.sh
require_spes
require_mpirun
[ -z "${SPES_ASAN:-}" ] || { echo "SKIPPED: the bundle packs a release build, not an ASan one"; exit 77; }
build=${SPES_BUILD:-$PWD/build}
[ -d "$build/tests-gpu" ] || { echo "SKIPPED: $build is not a CUDA build (no nvcc here)"; exit 77; }
{ [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null; } ||
  { echo "SKIPPED: needs root and mount namespaces (unshare -m) to hide Debian's OpenMPI"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
BUNDLE_BUILD=$build XZ_LEVEL=0 bash scripts/gpu_bundle.sh "$tmp/out" >"$tmp/bundle.log" 2>&1 ||
  { echo "FAIL: gpu_bundle.sh"; tail -20 "$tmp/bundle.log"; exit 1; }
mkdir "$tmp/b"
tar -xJf "$tmp/out/bundle.tar.xz" -C "$tmp/b"

unshare -m --propagation private bash -s "$tmp/b" "$build" <<'HIDDEN'
set -euo pipefail
bundle=$1 build=$2
lib=/usr/lib/x86_64-linux-gnu
for d in $lib/openmpi $lib/pmix2 /etc/openmpi /usr/share/openmpi; do
  [ -d "$d" ] && mount -t tmpfs none "$d"
done
for f in $lib/libmpi.so* $lib/libopen-rte.so* $lib/libopen-pal.so* $lib/libmca_common_*.so* \
  /usr/bin/orterun /usr/bin/orted /usr/bin/orte-server; do
  [ -e "$f" ] && mount --bind /dev/null "$f"
done
if /usr/bin/mpirun --version >/dev/null 2>&1; then echo "FAIL: Debian's mpirun still runs"; exit 1; fi
source "$bundle/env.sh"
[ "$(command -v mpirun)" = "$bundle/mpi/bin/mpirun" ] || { echo "FAIL: mpirun is $(command -v mpirun)"; exit 1; }
[ "$(command -v ompi-server)" = "$bundle/mpi/bin/ompi-server" ] || { echo "FAIL: no ompi-server in the bundle"; exit 1; }
if ldd "$SPES_BIN" | grep "not found"; then echo "FAIL: the bundle's spes misses a library"; exit 1; fi
echo "Debian's OpenMPI hidden; $(mpirun --version | head -1) from the bundle"
SPES_BUILD=$build bash tests/integration/dist_torchrun.sh
HIDDEN
echo "gpu_bundle_mpi: OK"
