#!/usr/bin/env bash
# Per-rank memory of each data-parallel strategy (docs/distributed.md), measured next to its
# theory, for N = 1, 2, 4 ranks on the cpu, plus tokens/s of 2 ranks x 1 thread against 1 rank
# x 2 threads, and of 2 ranks with the gradient reduction overlapped with the backward
# (ddp.overlap_grad_reduce, the default) against reduced after it.
# usage: bash bench/dist_memory.sh [build-dir]   (BENCH_DIST_MEMORY_ONLY=1: the memory table only)
# Model: tiny_shakespeare's MoE widened (d_model 256, 4 layers, 8 experts: ~8.7M parameters);
# random byte-level tokens. "Measured" is the size of every buffer the rank allocated for
# each role (the trainer's "memory per rank" line), and rank 0's peak RSS; theory is
# ZeRO's: P parameters, T trainable, fp32: params 4P (ZeRO-3: 4T/N + 4(P-T) frozen, plus the
# part buffers B it logs: the working buffers of the largest part, two with fsdp.prefetch,
# one without), gradients 4T (4T/N under ZeRO-2/3, plus the part gradient buffers they log:
# two with ddp.overlap_grad_reduce, one without), AdamW state 8T (8T/N under ZeRO-1/2/3).
set -euo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/.."
case $BUILD in /*) SPES=$BUILD/spes ;; *) SPES=$PWD/$BUILD/spes ;; esac
[ -x "$SPES" ] || { echo "dist_memory: skipped (no $SPES)"; exit 0; }
command -v mpirun >/dev/null || { echo "dist_memory: skipped (no mpirun)"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$tmp/tokens.npy" <<'PY'
import random, struct, sys
random.seed(5)
n = 256 * 128
open(sys.argv[1], "wb").write(struct.pack("<%dH" % n, *(random.randrange(257) for _ in range(n))))
PY
common=(configs/tiny_shakespeare.yaml --data.paths="[$tmp/tokens.npy]" --model.d_model=256 --model.n_layers=4
        --model.moe_num_experts=8 --model.mlp_hidden_size=512 --global_train_batch_size=8
        --device_train_microbatch_size=2 --eval_interval=100000 --save_interval_unsharded=100000
        --try_load_latest_save=false --device=cpu --scheduler.t_warmup=0)

run() {   # run NAME NPROC THREADS STEPS [overrides]
  local name=$1 n=$2 th=$3 steps=$4
  shift 4
  "$SPES" train "${common[@]}" --save_folder="$tmp/$name" --threads="$th" --max_duration="$steps" \
    --nproc_per_node "$n" "$@" >"$tmp/$name.log" 2>&1 || { echo "dist_memory: failed ($name)"; tail "$tmp/$name.log"; exit 1; }
}
field() { sed -n "s/.*memory per rank.*$1 \([0-9.]*\) MB.*/\1/p" "$2" | head -1; }
part_buffers() { sed -n "s/.*zero3 per rank.* part buffers\( ([^)]*)\)\{0,1\} \([0-9.]*\) MB.*/\2/p" "$1" | head -1; }
part_grad_buffer() { sed -n "s/.*zero[23] per rank: gradient shard.*part gradient buffers\{0,1\}\( ([^)]*)\)\{0,1\} \([0-9.]*\) MB.*/\2/p" "$1" | head -1; }

echo "| strategy | ranks N | parameters MB (theory) | gradients MB (theory) | optimizer state MB (theory) | collective scratch MB | peak RSS rank 0 MB |"
echo "|---|---|---|---|---|---|---|"
P=""; T=""
for n in 1 2 4; do
  # ":off": ddp.overlap_grad_reduce and fsdp.prefetch false (ZeRO-2/3: one part gradient buffer
  # instead of two; ZeRO-3: one part buffer instead of two)
  for v in ddp SHARD_OPTIM SHARD_GRAD_OP FULL_SHARD SHARD_GRAD_OP:off FULL_SHARD:off; do
    s=${v%:off}
    [ $n = 1 ] && [ $s != ddp ] && continue
    name="${s}_$n"; extra=(); label=$s
    [ "$v" != "$s" ] && { name="${s}_off_$n"; extra=(--ddp.overlap_grad_reduce=false --fsdp.prefetch=false); label="$s, overlap off"; }
    if [ $s = ddp ]; then run "$name" $n 1 1 --distributed_strategy=ddp; else run "$name" $n 1 1 --fsdp.sharding_strategy=$s "${extra[@]}"; fi
    log="$tmp/$name.log"
    if [ -z "$P" ]; then
      P=$(sed -n 's/.*model: \([0-9]*\) parameters, \([0-9]*\) trainable.*/\1/p' "$log")
      T=$(sed -n 's/.*model: \([0-9]*\) parameters, \([0-9]*\) trainable.*/\2/p' "$log")
    fi
    read -r tp tg to < <(python3 -c "
P, T, N, s = $P, $T, $n, '$s'
B, Bg = float('$(part_buffers "$log")' or 0), float('$(part_grad_buffer "$log")' or 0)
mb = 1 / 1048576
p = 4 * T / N + 4 * (P - T) + B / mb if s == 'FULL_SHARD' else 4 * P
g = 4 * T / (N if s in ('SHARD_GRAD_OP', 'FULL_SHARD') else 1) + Bg / mb
o = 8 * T / (N if s != 'ddp' else 1)
print('%.2f %.2f %.2f' % (p * mb, g * mb, o * mb))")
    rss=$(python3 -c "import json; print('%.1f' % json.loads(open('$tmp/$name/metrics.jsonl').readline())['perf']['peak_rss_mb'])")
    [ $n = 1 ] && label="single (any)"
    printf "| %s | %d | %.2f (%s) | %.2f (%s) | %.2f (%s) | %.2f | %s |\n" "$label" $n \
      "$(field parameters "$log")" "$tp" "$(field gradients "$log")" "$tg" "$(field "optimizer state" "$log")" "$to" \
      "$(field "collective scratch" "$log")" "$rss"
  done
done
echo "P = $P parameters, T = $T trainable (fp32); ZeRO-3's part buffers: $(part_buffers "$tmp/FULL_SHARD_2.log") MB, ZeRO-2/3's part gradient buffers: $(part_grad_buffer "$tmp/SHARD_GRAD_OP_2.log") MB"
[ "${BENCH_DIST_MEMORY_ONLY:-}" = 1 ] && exit 0

# Throughput: the same 12 steps, 2 ranks x 1 thread (DDP) against 1 rank x 2 threads (and 1 x 1).
tps() { python3 -c "
import json
rows = [json.loads(l) for l in open('$1/metrics.jsonl') if '\"perf\"' in l][2:]   # skip the warm-up steps
print('%.0f' % (sum(r['tokens'] for r in rows) / sum(r['perf']['step_s'] for r in rows)))"; }
run tp_1x1 1 1 12
run tp_1x2 1 2 12
run tp_2x1 2 1 12 --distributed_strategy=ddp
c=$(tps "$tmp/tp_1x1"); a=$(tps "$tmp/tp_1x2"); b=$(tps "$tmp/tp_2x1")
echo "tokens/s: 1 rank x 1 thread $c, 1 rank x 2 threads $a, 2 ranks x 1 thread (DDP) $b"
# Overlap: 2 ranks x 1 thread, overlap on against off, with the default 25 MB buckets (2 per
# step here) and 4 MB buckets (8 per step: more of them start early). The machine may be
# shared: on and off runs alternate, 5 of each, and the figure is the median over every timed
# step of the 5 runs (tokens / step seconds), not one run's mean.
median_tps() { python3 -c "
import json, statistics, sys
rates = []
for d in sys.argv[1:]:
    rows = [json.loads(l) for l in open(d + '/metrics.jsonl') if '\"perf\"' in l][2:]
    rates += [r['tokens'] / r['perf']['step_s'] for r in rows]
print('%.0f' % statistics.median(rates))" "$@"; }
# ZeRO-2/3 reduce (and ZeRO-3 gathers) per part, not in buckets: "off" there also turns off
# ZeRO-3's prefetch of the next part.
for cfg in "ddp 25" "ddp 4" "SHARD_OPTIM 4" "SHARD_GRAD_OP part" "FULL_SHARD part"; do
  read -r s mb <<<"$cfg"
  strat=(--fsdp.sharding_strategy=$s); [ $s = ddp ] && strat=(--distributed_strategy=ddp)
  off_flags=(--ddp.overlap_grad_reduce=false); unit="${mb} MB buckets"
  if [ "$mb" = part ]; then off_flags+=(--fsdp.prefetch=false); unit="per part"; else strat+=(--ddp.bucket_cap_mb=$mb); fi
  ons=(); offs=()
  for rep in 1 2 3 4 5; do
    run "ov_on_${s}_${mb}_$rep" 2 1 12 "${strat[@]}"
    run "ov_off_${s}_${mb}_$rep" 2 1 12 "${strat[@]}" "${off_flags[@]}"
    ons+=("$tmp/ov_on_${s}_${mb}_$rep"); offs+=("$tmp/ov_off_${s}_${mb}_$rep")
  done
  on=$(median_tps "${ons[@]}"); off=$(median_tps "${offs[@]}")
  echo "tokens/s, 2 ranks x 1 thread, $s, $unit (median of 5 alternating runs): overlapped $on, after the backward $off, ratio $(python3 -c "print('%.3f' % ($on / $off))")"
done
echo "dist_memory: params_mb_n1=$(field parameters "$tmp/ddp_1.log") opt_mb_zero1_n4=$(field "optimizer state" "$tmp/SHARD_OPTIM_4.log") tok_s_1x2=$a tok_s_2x1=$b"
