#!/usr/bin/env bash
# Network faults: the server in one network namespace, the 4 `spes train` peers in another,
# joined by a veth pair on the test's own addresses (10.213.77.1/2). tc netem on the link adds
# 20 ms delay with jitter and 1% packet loss, and the link is cut for 3 s (a partition) after the
# round of step 6. The run completes and the final weights of every peer are byte-identical
# (cmp) to an undisturbed run on loopback with the same seeds. Needs root and iproute2;
# skipped (77) where `ip netns add` is not permitted; without netem only the partition runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/reliability.sh
reliability_begin
SPES=$(realpath "$SPES")
command -v ip >/dev/null && command -v tc >/dev/null || { echo "SKIPPED: needs iproute2 (ip, tc)"; exit 77; }

ns_srv=spes_srv_$$ ns_peer=spes_peer_$$
cleanup_extra() {
  ip netns del "$ns_srv" 2>/dev/null || true
  ip netns del "$ns_peer" 2>/dev/null || true
}
ip netns add "$ns_srv" 2>/dev/null || { echo "SKIPPED: ip netns add is not permitted here (needs root / CAP_SYS_ADMIN)"; exit 77; }
ip netns add "$ns_peer"
ip link add veth_s$$ type veth peer name veth_p$$
ip link set veth_s$$ netns "$ns_srv"
ip link set veth_p$$ netns "$ns_peer"
ip -n "$ns_srv" addr add 10.213.77.1/24 dev veth_s$$
ip -n "$ns_peer" addr add 10.213.77.2/24 dev veth_p$$
for ns in "$ns_srv" "$ns_peer"; do ip -n "$ns" link set lo up; done
ip -n "$ns_srv" link set veth_s$$ up
ip -n "$ns_peer" link set veth_p$$ up
# Both directions: delay with jitter and loss. Without the netem qdisc (kernel module
# sch_netem) the partition below is still tested, and the test says so.
impairment="20 ms delay, 1% loss each way, one 3 s partition"
if ! ip netns exec "$ns_peer" tc qdisc add dev veth_p$$ root netem delay 20ms 5ms loss 1% 2>/dev/null; then
  impairment="NO delay/loss (netem qdisc unavailable in this kernel), one 3 s partition"
  echo "warning: tc netem is not available here; testing the partition only"
else
  ip netns exec "$ns_srv" tc qdisc add dev veth_s$$ root netem delay 20ms 5ms loss 1%
fi

reliability_data
STEPS=12

# 1. Undisturbed run on loopback.
mkdir -p "$dir/calm"
port=$(( 20000 + RANDOM % 20000 ))
"$SPES" server --total_peers 4 --num_train_experts_per_node 1 --host 127.0.0.1 --port "$port" >"$dir/calm/server.log" 2>&1 &
server_pid=$!
pids+=($server_pid)
peer_pids=()
for peer in 0 1 2 3; do
  reliability_peer $peer "$port" $STEPS "$dir/calm/peer$peer" "$dir/calm/peer$peer.log"
  peer_pids+=($last_pid); pids+=($last_pid)
done
for i in 0 1 2 3; do wait "${peer_pids[$i]}" || { echo "calm peer $i failed"; tail -20 "$dir/calm/peer$i.log"; exit 1; }; done
kill "$server_pid"; wait "$server_pid" || true

# 2. The same run across the impaired link, with a 3 s partition.
mkdir -p "$dir/net"
ip netns exec "$ns_srv" "$SPES" server --total_peers 4 --num_train_experts_per_node 1 --host 10.213.77.1 \
  --port 50051 >"$dir/net/server.log" 2>&1 &
server_pid=$!
pids+=($server_pid)
peer_pids=()
start=$(date +%s)
for peer in 0 1 2 3; do
  # reliability_peer connects to 127.0.0.1:<port>; override the address for this network.
  ip netns exec "$ns_peer" bash -c "source tests/integration/lib/reliability.sh; SPES='$SPES' dir='$dir'; \
    reliability_peer $peer 50051 $STEPS '$dir/net/peer$peer' '$dir/net/peer$peer.log' $STEPS \
    --spes_config.server_addr=10.213.77.1:50051; wait \$last_pid" &
  peer_pids+=($!); pids+=($!)
done
reliability_wait_log "step 6: aggregated 4 peers" "$dir/net/server.log"
ip -n "$ns_peer" link set veth_p$$ down
echo "link cut (partition) for 3 s after the round of step 6"
sleep 3
ip -n "$ns_peer" link set veth_p$$ up
for i in 0 1 2 3; do wait "${peer_pids[$i]}" || { echo "peer $i failed across the impaired link"; tail -20 "$dir/net/peer$i.log"; tail -20 "$dir/net/server.log"; exit 1; }; done
kill "$server_pid"; wait "$server_pid" || true
echo "impaired run: $(( $(date +%s) - start )) s, $impairment"

for peer in 0 1 2 3; do
  cmp -s "$dir/calm/peer$peer/step$STEPS/model.safetensors" "$dir/net/peer$peer/step$STEPS/model.safetensors" ||
    { echo "peer $peer: final weights differ from the undisturbed run"; exit 1; }
done
echo "network faults: final weights of 4 peers byte-identical to the undisturbed run"
