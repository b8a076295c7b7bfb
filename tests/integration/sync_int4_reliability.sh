#!/usr/bin/env bash
# sync_int8_reliability.sh with spes_config.payload_dtype: int4: server restart (the int4 delta
# kept in the state dir, the same bytes served after a restart), unsynced resume (the error
# feedback in the checkpoint) and peer crash-and-rejoin, each byte-identical to an undisturbed
# int4 run where the test says so.
set -euo pipefail
cd "$(dirname "$0")/../.."
SYNC_DELTA=int4 exec bash tests/integration/sync_int8_reliability.sh "$@"
