#!/usr/bin/env bash
# The server's state dir on a disk that fills up (a small tmpfs; root only, skipped otherwise):
# 1. the disk has less than one upload free: the server warns at the first Hello, naming the state
#    dir, what a round needs and what is free (server/state_space.h); uploads are refused
#    UNAVAILABLE naming the server's disk, peers retry, Status still answers;
# 2. room for the round's uploads but not its aggregate: the uploads are taken, the aggregate waits
#    unwritten (logged, and said by Status: `spes status` and the waiting peers' log lines), peers wait;
# 3. space comes back: the run goes on by itself and completes, every peer holding the server's
#    aggregates, no temp file left, and a restart from the state dir resumes where it was.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/reliability.sh
reliability_begin --venv
mounted=""
cleanup_extra() {   # the killed server and peers first: a mount they hold files on is busy
  wait 2>/dev/null || true
  [ -z "$mounted" ] || umount "$mounted" 2>/dev/null || umount -l "$mounted" 2>/dev/null || true
}
mkdir -p "$dir/disk"
if ! mount -t tmpfs -o size=16m tmpfs "$dir/disk" 2>/dev/null; then
  echo "SKIPPED: cannot mount a tmpfs (needs root) to fill a disk"
  exit 77
fi
mounted="$dir/disk"
reliability_data
fail() { echo "FAIL: $*"; echo "server log:"; grep -v "upload refused" "$dir/server.log" | tail -15; exit 1; }
state="$dir/disk/state"
free_bytes() { df -B1 --output=avail "$dir/disk" | tail -1 | tr -d ' '; }
# leave_free BYTES: the filler file takes (or, shrunk, gives back) what leaves BYTES free.
leave_free() {
  local have now
  have=$(stat -c %s "$dir/disk/filler" 2>/dev/null || echo 0)
  now=$(free_bytes)
  if [ "$have" = 0 ]; then fallocate -l $((now - $1)) "$dir/disk/filler"; else truncate -s $((have + now - $1)) "$dir/disk/filler"; fi
}
wait_log() {   # PATTERN: up to 60 s
  for _ in $(seq 600); do grep -qs "$1" "$dir/server.log" && return 0; sleep 0.1; done
  fail "the server never logged '$1'"
}

# The tiny model: an upload is 1.2 MB, an aggregate 2.4 MB.
leave_free $((600 * 1024))
reliability_server --state_dir "$state"
wait_log "listening on"
mkdir -p "$dir/run"
( reliability_run_peers "$dir/run" 4 2 --spes_config.retry_timeout_s=120 ) >"$dir/peers.log" 2>&1 &
peers_pid=$!
pids+=("$peers_pid")

# 1. Less than an upload free.
wait_log "server: --state_dir $state: [0-9.]* [kM]B free on its filesystem; a round needs up to [0-9.]* MB more there (4 uploads of up to 1.2[0-9]* MB each, and 3 aggregates of 2.3[0-9]* MB kept with --keep_steps 2 while the next is written, 0 there now)"
wait_log "upload refused: upload from peer [0-3] for step 2: the server cannot store it now: the server's disk under $state took no more (full? nothing of it was kept; retry later): .*No space left on device"
"$SPES" status "127.0.0.1:$port" >"$dir/status.txt" 2>&1 || fail "Status did not answer while the disk was full: $(cat "$dir/status.txt")"
kill -0 "$server_pid" || fail "the server died"
echo "ok: less than an upload free: warned at the first Hello, uploads refused naming the disk, Status answers"

# 2. Room for the round's uploads (4 x 1.2 MB) but not its aggregate (2.4 MB more).
leave_free $((5800 * 1024))
wait_log "step 2: cannot write the aggregate to the state dir $state: .*No space left on device.*; the round keeps its 4 uploads"
sleep 1
ls "$state"/upload_s2_p*.safetensors >/dev/null || fail "the round's uploads are not on disk"
[ ! -f "$state/aggregate_s2.safetensors" ] || fail "an aggregate was written on a full disk"
kill -0 "$peers_pid" || fail "the peers gave up while the aggregate waited: $(tail -5 "$dir/peers.log")"
# Status says why (spes status, and the waiting peers' log lines: client.c note_waiting).
"$SPES" status "127.0.0.1:$port" >"$dir/status.txt" 2>&1 || fail "Status did not answer: $(cat "$dir/status.txt")"
grep -q "not published *step 2: cannot write the aggregate to the state dir $state: .*No space left on device (retried)" \
  "$dir/status.txt" || fail "spes status does not say why step 2 is not published: $(cat "$dir/status.txt")"
for _ in $(seq 150); do grep -qs "but cannot publish the aggregate: step 2: cannot write" "$dir"/run/peer*.log && break; sleep 0.1; done
grep -qs "still waiting for the aggregate after [0-9]* s; the server has the uploads of 4 of 4 peers but cannot publish the aggregate: step 2: cannot write the aggregate to the state dir $state: .*No space left on device (it retries)" \
  "$dir"/run/peer*.log || fail "no waiting peer says why: $(grep -h "still waiting" "$dir"/run/peer*.log | tail -2)"
echo "ok: room for the uploads only: they are taken, the aggregate waits unwritten, peers wait"

# 3. Space comes back.
rm -f "$dir/disk/filler"
wait "$peers_pid" || { cat "$dir/peers.log"; fail "the peers did not complete once space was back"; }
kill -0 "$server_pid" || fail "the server died"
cp "$dir/server.log" "$dir/run/server.log"
ln -s "$state" "$dir/run/state"
server_matches_peers "$dir/run" 2 4
peers_match_aggregate "$dir/run" 4 2 4
leftover=$(find "$state" -name "*.part.*" -o -name "*.tmp*" | head -3)
[ -z "$leftover" ] || fail "temp files left in the state dir: $leftover"
grep -q "took no more" "$dir"/run/peer*.log && fail "a peer saw the full disk as final" || true
kill "$server_pid"
wait "$server_pid" 2>/dev/null || true
reliability_server --state_dir "$state"
wait_log "resumed from state dir $state: model fingerprint [0-9a-f]*, 2 rounds completed (last step 4), 2 aggregates kept"
echo "ok: space back: the run completed by itself, no temp file left, the state dir resumes"
