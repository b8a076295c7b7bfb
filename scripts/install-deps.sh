#!/usr/bin/env bash
# Installs the Debian packages SPES-C builds and tests with, and only those that are missing.
# Idempotent: a second run installs nothing and prints nothing but the summary line.
set -euo pipefail

PACKAGES=(
  build-essential pkg-config
  libopenblas-openmp-dev      # OpenMP build of OpenBLAS: shares our OpenMP thread pool, no oversubscription
  libyaml-dev                 # config loader
  libjansson-dev              # JSON (config.json, tokenizer.json, safetensors headers)
  libgrpc-dev protobuf-c-compiler libprotobuf-c-dev   # wire protocol: gRPC core + protobuf-c
  libzstd-dev zlib1g-dev libsnappy-dev                # compressed inputs (.gz, .zst, parquet pages)
  libpcre2-dev libutf8proc-dev                        # tokenizer regexes (Unicode properties), NFC
  libcmocka-dev                                       # unit tests
  libopenmpi-dev openmpi-bin                          # ranks inside a node (src/parallel/): MPI collectives, mpirun
  python3-venv python3-grpcio python3-protobuf        # test-only: reference virtualenv, interop client
  clang libclang-rt-14-dev                            # sanitizers and libFuzzer
  iproute2
  libisal-dev                                         # CRC-32C (crc32_iscsi) of TensorBoard event records
  libmicrohttpd-dev                                   # the server's status page (spes server --status_port)
  chromium                                            # test-only: the status page loaded in a headless browser
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps: done"
