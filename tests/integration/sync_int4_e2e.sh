#!/usr/bin/env bash
# sync_int8_e2e.sh with spes_config.payload_dtype: int4 (4-bit codes packed two per byte, bf16
# scales, docs/communication.md): 4 peers, 5 rounds; byte-identical weights after every round,
# equal to the server's aggregate; later rounds go up and down as int4 deltas; the aggregate
# recomputed in numpy from the int4 uploads.
set -euo pipefail
cd "$(dirname "$0")/../.."
SYNC_DELTA=int4 exec bash tests/integration/sync_int8_e2e.sh "$@"
