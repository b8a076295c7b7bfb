#!/usr/bin/env bash
# sync_int8_e2e.sh with the outer optimizer on the server (--outer_lr 0.7 --outer_momentum 0.9)
# and the peers' config expecting it (spes_config.outer_lr / outer_momentum, checked in Hello):
# the int8 deltas the server sends are those of the post-outer-step aggregate, and every peer
# reconstructs byte for byte the aggregate the server keeps (and steps from next round).
set -euo pipefail
cd "$(dirname "$0")/../.."
export RELIABILITY_PEER_ARGS="--spes_config.outer_lr=0.7 --spes_config.outer_momentum=0.9"
SYNC_INT8_SERVER_FLAGS="--outer_lr 0.7 --outer_momentum 0.9" exec bash tests/integration/sync_int8_e2e.sh "$@"
