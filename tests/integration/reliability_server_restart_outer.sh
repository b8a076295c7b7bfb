#!/usr/bin/env bash
# reliability_server_restart.sh with the outer optimizer on (--outer_lr 0.7 --outer_momentum
# 0.9): the server SIGKILLed and restarted mid-run, its outer state reloaded from --state_dir;
# the final weights of every peer byte-identical to an undisturbed run with the same flags.
set -euo pipefail
cd "$(dirname "$0")/../.."
export RELIABILITY_PEER_ARGS="--spes_config.outer_lr=0.7 --spes_config.outer_momentum=0.9"   # the peers' Hello states it
RELIABILITY_SERVER_FLAGS="--outer_lr 0.7 --outer_momentum 0.9" exec bash tests/integration/reliability_server_restart.sh "$@"
