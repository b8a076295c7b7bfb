#!/usr/bin/env bash
# A save_folder whose disk cannot take the run's checkpoints is said at the start of `spes train`
# (train/save_space.h), not first at the failing save: on small tmpfs mounts, one too small for
# a single checkpoint and one that takes two of the three a run keeping 2 holds at once. A disk
# with room says nothing. And `spes plan`'s checkpoint size is what a save writes (the
# .safetensors to the byte, the small files inside their allowance).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/require.sh
require_spes
tmp=$(mktemp -d)
. tests/integration/lib/tmpfs_disk.sh
cleanup() { tmpfs_unmount_all; rm -rf "$tmp"; }
trap cleanup EXIT
[ -n "${KEEP:-}" ] && trap - EXIT
export SPES_NUM_THREADS=1


source tests/integration/lib/tiny_model.sh
tiny_tokens "$tmp" 200
tiny_config "$tmp" space
cat >> "$tmp/tiny.yaml" <<EOF
max_duration: 20
global_train_batch_size: 8
device_train_microbatch_size: 8
save_interval_unsharded: 5
save_num_unsharded_checkpoints_to_keep: 2
console_log_interval: 5
EOF

fail=0
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }
warned() { grep -c "warn\] save_folder $1" "$2" || true; }

# One checkpoint (529 kB planned, 468 kB written) does not fit 300 kB: said before step 1, and the saves then fail as said.
tmpfs_disk tiny 300k
# (--save_retry=0: the final save is not retried; train_save_full_disk.sh tests the retries.)
if "$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/tiny/run" --save_retry=0 > "$tmp/tiny.log" 2>&1; then bad "the run on a 300 kB disk saved"; fi
grep -q "warn\] save_folder $tmp/tiny/run: [0-9.]* kB free on its filesystem, and a checkpoint takes 529 kB: the save at step 5 will fail unless space is freed" "$tmp/tiny.log" ||
  bad "no warning of the first save on a 300 kB disk"
warn_line=$(grep -n "warn\] save_folder" "$tmp/tiny.log" | head -1 | cut -d: -f1)
step_line=$(grep -n "info\] step 1/" "$tmp/tiny.log" | head -1 | cut -d: -f1)
[ -n "$warn_line" ] && [ -n "$step_line" ] && [ "$warn_line" -lt "$step_line" ] || bad "the warning did not come before step 1"
grep -q "No space left on device" "$tmp/tiny.log" || bad "the save on a 300 kB disk did not fail for space"

# Two fit in 1.1 MB, and keeping 2 holds 3 while the third save runs: said at the start.
tmpfs_disk two 1100k
if "$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/two/run" --save_retry=0 > "$tmp/two.log" 2>&1; then bad "the run on a 1.1 MB disk saved 4 times"; fi
grep -q "warn\] save_folder $tmp/two/run: 1.1[0-9]* MB free on its filesystem; the run's 4 saves left of 529 kB each, keeping 2 (save_num_unsharded_checkpoints_to_keep), need up to 1.59 MB more: a later save will fail unless space is freed" "$tmp/two.log" ||
  bad "no warning of a later save on a 1.1 MB disk"
[ -d "$tmp/two/run/step10" ] || bad "the 1.1 MB disk did not keep step10"
# Keeping all four needs more: the same disk, keep everything
tmpfs_disk all 1100k
"$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/all/run" --save_num_unsharded_checkpoints_to_keep=-1 \
  --max_duration=10 > "$tmp/all.log" 2>&1 || bad "two saves on a 1.1 MB disk failed"
[ "$(warned "$tmp/all/run" "$tmp/all.log")" = 0 ] || bad "warned of two saves that fit"

# Room: no warning; the plan's checkpoint is the saved one.
tmpfs_disk room 20m
"$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/room/run" > "$tmp/room.log" 2>&1 || { cat "$tmp/room.log"; bad "the run with room failed"; }
[ "$(warned "$tmp/room/run" "$tmp/room.log")" = 0 ] || bad "warned with room"
"$SPES_BIN" plan "$tmp/tiny.yaml" --json > "$tmp/plan.json" 2> "$tmp/plan.log" || { cat "$tmp/plan.log"; bad "spes plan failed"; }
"$SPES_BIN" plan "$tmp/tiny.yaml" > "$tmp/plan.txt" 2>> "$tmp/plan.log" || bad "spes plan (text) failed"
grep -q "^checkpoints: 529 kB each on disk (model, AdamW moments); 4 saves in 20 steps (every 5 steps and at the end), keeping 2: save_folder holds up to 1.59 MB" "$tmp/plan.txt" ||
  { grep checkpoints "$tmp/plan.txt"; bad "spes plan's checkpoints line"; }
python3 - "$tmp/plan.json" "$tmp/room/run/step20" <<'EOF' || bad "the plan's checkpoint size is not the saved one"
import json, os, sys
plan = json.load(open(sys.argv[1]))["checkpoint"]
d = sys.argv[2]
tensors = sum(os.path.getsize(os.path.join(d, f)) for f in ("model.safetensors", "train_state.safetensors"))
small = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)) - tensors
allowance = 64 << 10
print(f"checkpoint: planned {plan['bytes']} bytes, saved {tensors} in the .safetensors + {small} in small files")
assert plan["bytes"] == tensors + allowance and small <= allowance, plan
assert plan["saves"] == 4 and plan["save_folder_bytes"] == 3 * plan["bytes"], plan
EOF

[ "$fail" = 0 ] || exit 1
echo "train_save_space: OK"
