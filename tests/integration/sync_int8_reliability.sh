#!/usr/bin/env bash
# int8 delta payloads under failures, with every peer on spes_config.payload_dtype: int8:
#  - the server-restart test (SIGKILL at four points, some while peers download an int8 delta:
#    the delta is kept in the state dir, so the restarted server serves the same bytes; final
#    weights byte-identical to an undisturbed int8 run);
#  - the unsynced-resume test (peers save "synced": false and resume, redoing the round; the
#    checkpoint carries the error feedback and the base step, so the resumed peers end
#    byte-identical to an undisturbed int8 run);
#  - the peer crash-and-rejoin test (partial rounds; the rejoined peer starts again from a whole
#    aggregate).
# SYNC_DELTA=int4: the same with payload_dtype int4 (sync_int4_reliability.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
DELTA=${SYNC_DELTA:-int8}
export RELIABILITY_PEER_ARGS="--spes_config.payload_dtype=$DELTA"
for t in reliability_server_restart spes_peer_unsynced reliability_peer_rejoin; do
  echo "== $t with $DELTA payloads"
  status=0
  bash "tests/integration/$t.sh" || status=$?
  [ $status -eq 0 ] || exit $status
done
echo "$DELTA payloads: server restart, unsynced resume and peer rejoin passed"
