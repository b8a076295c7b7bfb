#!/usr/bin/env bash
# Sync traffic on a shaped link: `spes server` and 4 `spes train` peers, each in its own network
# namespace, every peer joined to the server's namespace by its own veth pair shaped with tc to
# 100 Mbit/s each way (and 20 ms each way = 40 ms RTT where the kernel has the netem qdisc).
# Tiny Shakespeare (byte tokenizer, the last 32 KiB held out), the tiny MoE of
# configs/tiny_shakespeare.yaml, 4 peers x 1 expert, sync every BENCH_NET_SYNC steps.
# Per configuration (payload F32 / BF16 / int8 / int4, overlap off / on) it reports:
#   - payload MB per peer per round, up and down (the peers' logs: safetensors bytes);
#   - link MB per peer per round, up and down, and the server's egress per round (tc's byte
#     counters on the veths: TCP/IP, HTTP/2 and gRPC framing included);
#   - the fraction of wall time the peers' training thread spends in sync work (mean of 4);
#   - the final validation cross-entropy on the held-out text, and against F32 sync.
# The baselines are today's protocol: F32 and BF16 rounds of a `spes` built before this work
# (BENCH_NET_BASELINE_BIN, e.g. the main branch's build; without it the baseline rows are ours
# with overlap off, which already leave own experts out of downloads). Ratios are ours over
# the BF16 baseline's bytes and the F32 baseline's validation loss. Payload figures are given
# over every round and over the steady rounds (2..N: the first round of a delta run has no base
# and goes in F32). Needs root (ip netns, tc); otherwise, or without the tbf qdisc, it reports
# SKIPPED. Usage: sudo bash bench/net/shaped_link.sh  (env: SPES_BIN, BENCH_NET_BASELINE_BIN,
# SPES_TEST_DATA, BENCH_NET_STEPS=100, BENCH_NET_SYNC=10, BENCH_NET_RATE=100mbit,
# BENCH_NET_OUT=dir to keep, BENCH_NET_CONFIGS="f32 bf16 int8 int4 ..." to run only those of
# ours: f32 bf16 int8 int4 and each with +overlap; default all eight).
set -euo pipefail
cd "$(dirname "$0")/../.."
SPES=$(realpath "${SPES_BIN:-build/spes}")
BASE=${BENCH_NET_BASELINE_BIN:+$(realpath "$BENCH_NET_BASELINE_BIN")}
DATA=${SPES_TEST_DATA:-../shared/data}
STEPS=${BENCH_NET_STEPS:-100}
SYNC=${BENCH_NET_SYNC:-10}
RATE=${BENCH_NET_RATE:-100mbit}
[ -x "$SPES" ] || { echo "SKIPPED: $SPES is not built"; exit 0; }
[ -f "$DATA/tinyshakespeare.txt" ] || { echo "SKIPPED: no $DATA/tinyshakespeare.txt"; exit 0; }

NS=snb$$
srv="${NS}s"
cleanup() {
  for p in 0 1 2 3; do ip netns pids "${NS}p$p" 2>/dev/null | xargs -r kill -9 2>/dev/null || true; done
  ip netns pids "$srv" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  for p in 0 1 2 3; do ip netns del "${NS}p$p" 2>/dev/null || true; done
  ip netns del "$srv" 2>/dev/null || true
  [ -n "${BENCH_NET_OUT:-}" ] || rm -rf "$out"
}
if [ -n "${BENCH_NET_OUT:-}" ]; then out=$BENCH_NET_OUT; rm -rf "$out"; mkdir -p "$out"; else out=$(mktemp -d); fi
trap cleanup EXIT

# ---- the link ----
if ! ip netns add "$srv" 2>"$out/netns.err"; then
  echo "SKIPPED: cannot create network namespaces here ($(head -1 "$out/netns.err")); run as root"; exit 0
fi
shape() {   # <ns> <dev>: rate (and delay) on the device's egress; sets $shaping
  if ip netns exec "$1" tc qdisc add dev "$2" root netem delay 20ms rate "$RATE" limit 100000 2>/dev/null; then
    shaping="netem: $RATE, 20 ms each way (40 ms RTT)"
  elif ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$RATE" burst 256kb latency 500ms 2>/dev/null; then
    shaping="tbf: $RATE; RTT NOT emulated (this kernel has no netem qdisc)"
  else
    echo "SKIPPED: this kernel has neither the netem nor the tbf qdisc"; exit 0
  fi
}
ip -n "$srv" link set lo up
for p in 0 1 2 3; do
  ip netns add "${NS}p$p"
  ip link add "${NS}a$p" type veth peer name "${NS}b$p"
  ip link set "${NS}a$p" netns "$srv"
  ip link set "${NS}b$p" netns "${NS}p$p"
  ip -n "$srv" addr add "10.78.$p.1/24" dev "${NS}a$p"
  ip -n "${NS}p$p" addr add "10.78.$p.2/24" dev "${NS}b$p"
  ip -n "$srv" link set "${NS}a$p" up
  ip -n "${NS}p$p" link set "${NS}b$p" up
  ip -n "${NS}p$p" link set lo up
  shape "$srv" "${NS}a$p"        # server -> peer p (its download)
  shape "${NS}p$p" "${NS}b$p"    # peer p -> server (its upload)
done
echo "link: each peer has its own veth to the server, $shaping"

# ---- data: tinyshakespeare, the last 32 KiB held out ----
python3 - "$DATA/tinyshakespeare.txt" "$out" <<'PY'
import sys
text = open(sys.argv[1], "rb").read()
open(f"{sys.argv[2]}/train.txt", "wb").write(text[:-32 * 1024])
open(f"{sys.argv[2]}/val.txt", "wb").write(text[-32 * 1024:])
PY
for split in train val; do
  "$SPES" tokenize --file_glob "$out/$split.txt" --tokenizer_name_or_path bytes --output_prefix "$out/${split}_" \
    --dtype uint16 >/dev/null 2>&1
  mv "$out/${split}_"*.npy "$out/$split.npy"
done

tx_bytes() { ip netns exec "$1" tc -s qdisc show dev "$2" | sed -n 's/^ *Sent \([0-9]*\) bytes.*/\1/p' | head -1; }

# run <name> <binary> <payload> <overlap>: one training run; appends a row to $out/rows.tsv
run() {
  local name=$1 bin=$2 payload=$3 overlap=$4 port=50051 p
  local extra=()
  [ "$overlap" = true ] && extra+=(--spes_config.sync_overlap=true)
  local d="$out/$name"
  mkdir -p "$d"
  local before_down=() before_up=()
  for p in 0 1 2 3; do before_down[$p]=$(tx_bytes "$srv" "${NS}a$p"); before_up[$p]=$(tx_bytes "${NS}p$p" "${NS}b$p"); done
  ip netns exec "$srv" "$bin" server --total_peers 4 --num_train_experts_per_node 1 --host 0.0.0.0 --port $port \
    >"$d/server.log" 2>&1 &
  local server=$! pids=() starts=()
  for p in 0 1 2 3; do
    starts[$p]=$(date +%s.%N)
    ip netns exec "${NS}p$p" env SPES_NUM_THREADS=1 "$bin" train configs/tiny_shakespeare.yaml \
      --data.paths="[$out/train.npy]" --data.seed=$((1 + p)) \
      --evaluators="[{label: val, type: lm, data: {paths: [$out/val.npy]}}]" --device_eval_batch_size=32 \
      --using_spes=true --spes_config.num_peers=4 --spes_config.peer_id=$p --spes_config.num_train_experts_per_node=1 \
      --spes_config.sync_steps=$SYNC --spes_config.server_addr=10.78.$p.1:$port \
      --spes_config.payload_dtype=$payload "${extra[@]}" \
      --max_duration=$STEPS --eval_interval=$STEPS --save_folder="$d/peer$p" --save_interval_unsharded=null \
      --try_load_latest_save=false --threads=1 >"$d/peer$p.log" 2>&1 &
    pids[$p]=$!
  done
  local ends=()
  for p in 0 1 2 3; do
    wait "${pids[$p]}" || { echo "$name: peer $p failed:"; tail -5 "$d/peer$p.log"; kill $server; return 1; }
    ends[$p]=$(date +%s.%N)
  done
  kill $server; wait $server 2>/dev/null || true
  local down=0 up=0
  for p in 0 1 2 3; do
    down=$((down + $(tx_bytes "$srv" "${NS}a$p") - before_down[$p]))
    up=$((up + $(tx_bytes "${NS}p$p" "${NS}b$p") - before_up[$p]))
  done
  python3 - "$d" "$name" "$STEPS" "$SYNC" "$up" "$down" "${starts[*]}" "${ends[*]}" >>"$out/rows.tsv" <<'PY'
import json, re, sys
d, name, steps, sync, up, down = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
starts, ends = [float(x) for x in sys.argv[7].split()], [float(x) for x in sys.argv[8].split()]
rounds = steps // sync
up_mb, down_mb, idle = [], [], []
for p in range(4):
    log = open(f"{d}/peer{p}.log").read()
    rows = re.findall(r"sync step \d+: .*? up ([0-9.]+) MB, down ([0-9.]+) MB", log)
    assert len(rows) == rounds, f"{d}/peer{p}.log: {len(rows)} rounds, expected {rounds}"
    up_mb.append([float(u) for u, _ in rows])
    down_mb.append([float(x) for _, x in rows])
    blocked = re.findall(r"sync: training blocked [0-9.]+s at step \d+, ([0-9.]+)s in all", log)
    if blocked:
        idle.append(float(blocked[-1]) / (ends[p] - starts[p]))
    else:   # a baseline build without that line: its rounds' own totals (rounds block training there)
        idle.append(sum(float(t) for t in re.findall(r"sync step \d+: ([0-9.]+)s total", log)) / (ends[p] - starts[p]))
# Exact payload bytes from the server's closing line (the peers' logs round to 0.01 MB): over the
# run, and over the steady rounds 2..N less the first round as the peers logged it.
total = re.search(r"stopped after \d+ rounds .*?, (\d+) bytes in, (\d+) bytes out", open(f"{d}/server.log").read())
if total:
    t_up, t_down = int(total.group(1)) / 1e6, int(total.group(2)) / 1e6
    first_up, first_down = sum(r[0] for r in up_mb), sum(r[0] for r in down_mb)
    up_mb = [[t_up / 4 / rounds] * rounds]
    down_mb = [[t_down / 4 / rounds] * rounds]
    steady = [(t_up - first_up) / 4 / (rounds - 1), (t_down - first_down) / 4 / (rounds - 1)]
evals = [json.loads(l) for l in open(f"{d}/peer0/metrics.jsonl") if '"eval"' in l]
ce = evals[-1]["ce"]
mean = lambda per_peer, first: sum(sum(r[first:]) for r in per_peer) / sum(len(r[first:]) for r in per_peer)
s_up, s_down = steady if total else (mean(up_mb, 1), mean(down_mb, 1))
print("\t".join(str(x) for x in [name, mean(up_mb, 0), mean(down_mb, 0), s_up, s_down,
                                  up / 4 / rounds / 1e6, down / 4 / rounds / 1e6, down / rounds / 1e6, sum(idle) / 4, ce]))
PY
  echo "$name done"
}

: >"$out/rows.tsv"
if [ -n "$BASE" ]; then
  run "F32 today" "$BASE" f32 false
  run "BF16 today" "$BASE" bf16 false
fi
for config in ${BENCH_NET_CONFIGS:-f32 bf16 int8 int4 f32+overlap bf16+overlap int8+overlap int4+overlap}; do
  payload=${config%+overlap}
  run "$config" "$SPES" "$payload" "$([ "$payload" = "$config" ] && echo false || echo true)"
done

python3 - "$out/rows.tsv" "$shaping" "$STEPS" "$SYNC" <<'PY'
import sys
rows = {r[0]: [float(x) for x in r[1:]] for r in (l.rstrip("\n").split("\t") for l in open(sys.argv[1]))}
f32 = rows.get("F32 today") or rows["f32"]
bf16 = rows.get("BF16 today") or rows["bf16"]
base = "today's build" if "BF16 today" in rows else "ours, overlap off (no baseline build given)"
print(f"\nshaped link: {sys.argv[2]}; {sys.argv[3]} steps, sync every {sys.argv[4]} steps, 4 peers + server on this machine")
print("MB per peer per round (payload: safetensors bytes from the server's totals, all rounds / steady rounds 2..N;")
print("link: tc bytes incl. TCP/gRPC);")
print("egress: the server's link MB per round; idle: training-thread time in sync / wall; baselines: " + base)
print(f"{'config':13} {'pay up':>7} {'pay dn':>7} {'steady up':>9} {'steady dn':>9} {'link up':>7} {'link dn':>7} "
      f"{'egress':>7} {'idle':>6} {'val ce':>7} {'ce/F32':>7} {'link/BF16':>9} {'steady/BF16':>11}")
for name, (pu, pd, su, sd, lu, ld, eg, idle, ce) in rows.items():
    print(f"{name:13} {pu:7.3f} {pd:7.3f} {su:9.3f} {sd:9.3f} {lu:7.3f} {ld:7.3f} {eg:7.3f} {100 * idle:5.1f}% "
          f"{ce:7.4f} {ce / f32[8]:7.4f} {(lu + ld) / (bf16[4] + bf16[5]):9.3f} {(su + sd) / (bf16[2] + bf16[3]):11.3f}")
for name in ("int8", "int4"):
    if name not in rows: continue
    q = rows[name]
    print(f"\n{name} vs BF16: link bytes per round {(q[4] + q[5]) / (bf16[4] + bf16[5]):.3f}x, payload over the run "
          f"{(q[0] + q[1]) / (bf16[0] + bf16[1]):.3f}x, steady payload {(q[2] + q[3]) / (bf16[2] + bf16[3]):.3f}x "
          f"(goal <= 0.25); val ce vs F32 {100 * (q[8] / f32[8] - 1):+.2f}% (goal within 0.5%)")
for name in ("f32", "bf16", "int8", "int4"):
    if name in rows and name + "+overlap" in rows:
        print(f"overlap {name}: idle {100 * rows[name][7]:.1f}% -> {100 * rows[name + '+overlap'][7]:.1f}% (goal < 5%)")
PY
