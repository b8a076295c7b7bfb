#!/usr/bin/env bash
# Everything that reads a checkpoint or a model directory, given damaged or inconsistent input:
# `spes train --resume` on a save_folder whose newest stepN/ is damaged, and `spes eval` /
# `spes export` / load_path on Hugging Face directories whose files disagree. Each case must
# end in an error naming what and where (path, tensor, key), never a crash, a silent wrong
# result or a resume from the wrong place, and no checkpoint may be changed or removed.
# (train_resume.sh covers the good paths and the config-hash check; test_train_checkpoint the
# damaged train_state.json keys; export_hf.sh missing and mis-shaped tensors.)
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/require.sh
require_spes
tmp=$(mktemp -d)
chmod 755 "$tmp"   # the unreadable-checkpoint case runs as another user
trap 'chmod -R u+rwX "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
export SPES_NUM_THREADS=1

source tests/integration/lib/tiny_model.sh
tiny_tokens "$tmp"
tiny_config "$tmp" hostile
cat >> "$tmp/tiny.yaml" <<EOF
max_duration: 4
global_train_batch_size: 8
device_train_microbatch_size: 8
save_interval_unsharded: 2
save_num_unsharded_checkpoints_to_keep: 3
console_log_interval: 2
EOF
"$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/base" > "$tmp/base.log" 2>&1 || { cat "$tmp/base.log"; exit 1; }

fail=0
bad() { echo "FAIL: $*"; fail=$((fail + 1)); }

# The save_folder's files, with their checksums: a failed resume must leave them all as they were.
snapshot() { (cd "$1" && find . -path ./metrics.jsonl -prune -o -name 'events.out.*' -prune -o -print | sort |
  while read -r f; do if [ -f "$f" ]; then echo "$f $(md5sum < "$f")"; else echo "$f"; fi; done); }

# damaged NAME SETUP: a copy of the base run, SETUP run inside it (its newest is step4).
damaged() { rm -rf "${tmp:?}/$1"; cp -a "$tmp/base" "$tmp/$1"; (cd "$tmp/$1" && eval "$2"); }

# resume_refused NAME PATTERN [AS...]: --resume must exit non-zero, say PATTERN (an ERE) in its
# last line, resume nothing, and leave every checkpoint file as it was.
resume_refused() {
  local name=$1 pattern=$2
  shift 2
  local before was=$fail
  before=$(snapshot "$tmp/$name")
  if "$@" "$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/$name" --resume --max_duration=6 > "$tmp/$name.log" 2>&1; then
    bad "$name: resume succeeded"; tail -3 "$tmp/$name.log"; return
  fi
  local last
  last=$(tail -1 "$tmp/$name.log")
  grep -q "resumed from" "$tmp/$name.log" && bad "$name: resumed before failing: $(grep 'resumed from' "$tmp/$name.log")"
  echo "$last" | grep -Eq "$pattern" || bad "$name: unclear error (want /$pattern/): $last"
  [ "$(snapshot "$tmp/$name")" = "$before" ] || bad "$name: the save_folder changed: $(diff <(echo "$before") <(snapshot "$tmp/$name") | head -5)"
  [ "$fail" != "$was" ] || echo "ok $name: $last"
}

# --- A stepN that is not a checkpoint directory. Skipped, the run resumed from step2, trained
# to step 4 and only then failed to save (the work since step2 lost); an unreadable step4 was
# skipped the same way and the save then swapped it to step4.tmp, which the next prune deletes.
damaged file_step 'rm -r step4 && echo x > step4'
resume_refused file_step "step4 is not a checkpoint directory"
damaged dangling_step 'rm -r step4 && ln -s ../never_created step4'
resume_refused dangling_step "step4 is not a checkpoint directory.*symbolic link"
if [ "$(id -u)" = 0 ] && command -v setpriv > /dev/null; then
  damaged unreadable_step 'chmod -R a+rwX . && chmod 000 step4'
  chmod a+rwx "$tmp/unreadable_step"
  resume_refused unreadable_step "step4.*Permission denied" setpriv --reuid=65534 --regid=65534 --clear-groups
elif [ "$(id -u)" != 0 ]; then
  damaged unreadable_step 'chmod 000 step4'
  resume_refused unreadable_step "step4.*Permission denied"
else
  echo "(root without setpriv: the unreadable step directory is not checked)"
fi

# --- train_state.json disagreeing with its directory. "step": 2 in step4 resumed step4's
# weights at step 2, trimmed the loss log to step 2 and re-saved (replaced) step4; "step": 999
# exited 0 without training; "optimizer_step" above "step" turned AdamW's bias correction off.
state_edit() { python3 -c '
import json, sys
p = "step4/train_state.json"; d = json.load(open(p)); exec(sys.argv[1]); open(p, "w").write(json.dumps(d, indent=2))' "$1"; }
damaged state_step_back "state_edit 'd[\"step\"] = 2'"
resume_refused state_step_back 'step4/train_state.json: "step" is 2 but the directory is step4'
damaged state_step_ahead "state_edit 'd[\"step\"] = 999'"
resume_refused state_step_ahead '"step" is 999 but the directory is step4'
damaged state_opt_step "state_edit 'd[\"optimizer_step\"] = 10**15'"
resume_refused state_opt_step 'train_state.json: "optimizer_step" 1000000000000000 exceeds "step" 4'

# --- Tensor contents. A weight or moment of NaN, or a negative second moment, resumed and
# failed steps later as "the loss is nan ... lower optimizer.learning_rate"; a shape differing in
# its second dim was reported as "[64, ...], the model expects [64, ...]".
# st_set FILE NAME PYEXPR: tensor NAME of FILE (in step4/) gets the bytes PYEXPR (same length).
st_set() { python3 - "$@" <<'PYEOF'
import json, struct, sys
p, name, expr = "step4/" + sys.argv[1], sys.argv[2], sys.argv[3]
b = bytearray(open(p, "rb").read()); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
lo, hi = h[name]["data_offsets"]; new = eval(expr); assert len(new) == hi - lo
b[8 + n + lo:8 + n + hi] = new; open(p, "wb").write(b)
PYEOF
}
damaged nan_weight "st_set model.safetensors model.norm.weight 'struct.pack(\"<32f\", *[float(\"nan\")] * 32)'"
resume_refused nan_weight "model.safetensors: tensor model.norm.weight holds 32 NaN or Inf values"
damaged nan_moment "st_set train_state.safetensors exp_avg.model.norm.weight 'struct.pack(\"<32f\", *[float(\"inf\")] * 32)'"
resume_refused nan_moment "train_state.safetensors: tensor exp_avg.model.norm.weight holds 32 NaN or Inf values"
damaged negative_moment "st_set train_state.safetensors exp_avg_sq.model.norm.weight 'struct.pack(\"<32f\", *[-1.0] * 32)'"
resume_refused negative_moment "train_state.safetensors: tensor exp_avg_sq.model.norm.weight holds a negative value"
# st_narrow: step4/model.safetensors with model.embed_tokens.weight [64, 16] (its first half).
st_narrow() { python3 - <<'PYEOF'
import json, struct
p = "step4/model.safetensors"
b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); data = b[8 + n:]
out, blob = {}, b""
for k, v in h.items():
    if k == "__metadata__": out[k] = v; continue
    t = data[v["data_offsets"][0]:v["data_offsets"][1]]
    if k == "model.embed_tokens.weight": v["shape"], t = [64, 16], t[:len(t) // 2]
    out[k] = {"dtype": v["dtype"], "shape": v["shape"], "data_offsets": [len(blob), len(blob) + len(t)]}; blob += t
hj = json.dumps(out).encode(); hj += b" " * (-len(hj) % 8)
open(p, "wb").write(struct.pack("<Q", len(hj)) + hj + blob)
PYEOF
}
damaged narrow_embed st_narrow
resume_refused narrow_embed "tensor model.embed_tokens.weight is \[64, 16\], the model expects \[64, 32\]"

# --- --force-resume into other model dimensions: the message sent the user to the trainable
# experts (spes_config.peer_id), which had not changed.
damaged force_wider ':'
if "$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/force_wider" --resume --force-resume --model.d_model=48 \
  --max_duration=6 > "$tmp/force_wider2.log" 2>&1; then bad "force_wider: resumed into d_model 48"; fi
tail -1 "$tmp/force_wider2.log" | grep -q "the model's dimensions (the model: keys) differ" ||
  bad "force_wider: unclear error: $(tail -1 "$tmp/force_wider2.log")"

# --- Two runs on one save_folder: a --resume started while the first still trained (or a second
# peer given the same folder) resumed from its steps and then replaced and pruned them; the
# folder's lock refuses it before anything is read, and it is free again once the first ends.
damaged two_runs ':'
"$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/two_runs" --resume --max_duration=100000 \
  --save_interval_unsharded=1000000 > "$tmp/two_runs_first.log" 2>&1 &
first=$!
for _ in $(seq 100); do grep -q "resumed from" "$tmp/two_runs_first.log" && break; sleep 0.1; done
resume_refused two_runs "save_folder .*two_runs is in use by another spes train \(it holds the lock on .*train.lock\)"
kill -TERM "$first"; wait "$first" || true
"$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/two_runs" --resume --max_duration=3 \
  > "$tmp/two_runs_after.log" 2>&1 || bad "two_runs: the folder stayed locked after the first run ended: $(tail -1 "$tmp/two_runs_after.log")"

# --- Sharded Hugging Face directories whose index and shards disagree (spes eval, spes export,
# load_path read them through one function). A tensor held by two shards was taken from
# whichever shard came first (eval's loss changed, export wrote that copy, exit 0); an index
# entry naming a shard without the tensor, and duplicate index keys, passed unnoticed.
"$SPES_BIN" export --checkpoint "$tmp/base/step4" --out "$tmp/hf" --max_shard_size 20KB > "$tmp/export.log" 2>&1 ||
  { cat "$tmp/export.log"; exit 1; }
index_edit() { python3 -c '
import json, sys
p = sys.argv[1] + "/model.safetensors.index.json"; d = json.load(open(p)); w = d["weight_map"]; exec(sys.argv[2])
open(p, "w").write(json.dumps(d, indent=2))' "$@"; }
# st_add DIR SHARD NAME ROWS COLS VALUE: SHARD gains a tensor NAME [ROWS, COLS] of VALUE.
st_add() { python3 - "$@" <<'PYEOF'
import json, struct, sys
d, shard, name, rows, cols, value = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
p = f"{d}/{shard}"
b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); data = b[8 + n:]
h[name] = {"dtype": "F32", "shape": [rows, cols], "data_offsets": [len(data), len(data) + 4 * rows * cols]}
data += struct.pack(f"<{rows * cols}f", *([value] * (rows * cols)))
hj = json.dumps(h).encode(); hj += b" " * (-len(hj) % 8)
open(p, "wb").write(struct.pack("<Q", len(hj)) + hj + data)
PYEOF
}
hf_case() { rm -rf "${tmp:?}/$1"; cp -a "$tmp/hf" "$tmp/$1"; }
# model_refused NAME PATTERN: eval, export and load_path must each fail naming PATTERN.
model_refused() {
  local name=$1 pattern=$2 was=$fail out
  out=$("$SPES_BIN" eval --model "$tmp/$name" --tokens "$tmp/tokens.npy" --threads 1 --no_progress 2>&1) && bad "$name: eval succeeded: $(echo "$out" | tail -1)"
  echo "$out" | tail -1 | grep -Eq "$pattern" || bad "$name: eval: unclear error (want /$pattern/): $(echo "$out" | tail -1)"
  out=$("$SPES_BIN" export --checkpoint "$tmp/$name" --out "$tmp/$name.out" 2>&1) && bad "$name: export succeeded"
  echo "$out" | tail -1 | grep -Eq "$pattern" || bad "$name: export: unclear error: $(echo "$out" | tail -1)"
  out=$("$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/$name.run" --load_path="$tmp/$name" 2>&1) && bad "$name: load_path succeeded"
  echo "$out" | tail -1 | grep -Eq "$pattern" || bad "$name: load_path: unclear error: $(echo "$out" | tail -1)"
  [ "$fail" != "$was" ] || echo "ok $name: $(echo "$out" | tail -1)"
}
embed_shard=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["weight_map"]["model.embed_tokens.weight"])' "$tmp/hf/model.safetensors.index.json")
lm_shard=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["weight_map"]["lm_head.weight"])' "$tmp/hf/model.safetensors.index.json")
[ "$embed_shard" != "$lm_shard" ] || { echo "the export put embed_tokens and lm_head in one shard"; exit 1; }
hf_case hf_two_copies
st_add "$tmp/hf_two_copies" "$lm_shard" model.embed_tokens.weight 64 32 0.5   # lm_head's shard is read first
model_refused hf_two_copies "tensor model.embed_tokens.weight is in both .*model-.* and .*model-"
hf_case hf_wrong_shard
index_edit "$tmp/hf_wrong_shard" "w['model.norm.weight'] = '$embed_shard'"
model_refused hf_wrong_shard "weight_map puts tensor model.norm.weight in $embed_shard, but .*$embed_shard does not hold it"
hf_case hf_dup_key
sed -i "s/\"weight_map\": {/\"weight_map\": {\n    \"model.norm.weight\": \"$embed_shard\",/" "$tmp/hf_dup_key/model.safetensors.index.json"
model_refused hf_dup_key "model.safetensors.index.json: not valid JSON .*duplicate object key"

# --- Weights of a bigger model than the config describes: config.json with one layer fewer
# loaded the first layer and ignored the second with a warning (eval exited 0 with the
# one-layer model's loss), and so did load_path into a training config of one layer. A tensor
# that is of no layer or expert (a buffer) is still only warned about.
hf_case hf_fewer_layers
python3 -c 'import json, sys; p = sys.argv[1] + "/config.json"; d = json.load(open(p)); d["num_hidden_layers"] = 1
open(p, "w").write(json.dumps(d, indent=2))' "$tmp/hf_fewer_layers"
beyond="config describes 1 layers of .* experts, but the weights also hold .* model.layers.1."
out=$("$SPES_BIN" eval --model "$tmp/hf_fewer_layers" --tokens "$tmp/tokens.npy" --threads 1 --no_progress 2>&1) &&
  bad "hf_fewer_layers: eval succeeded: $(echo "$out" | tail -1)"
echo "$out" | tail -1 | grep -Eq "$beyond" || bad "hf_fewer_layers: eval: unclear error: $(echo "$out" | tail -1)"
out=$("$SPES_BIN" train "$tmp/tiny.yaml" --save_folder="$tmp/fewer.run" --load_path="$tmp/hf" --model.n_layers=1 2>&1) &&
  bad "hf_fewer_layers: load_path into one layer succeeded"
echo "$out" | tail -1 | grep -Eq "$beyond" || bad "hf_fewer_layers: load_path: unclear error: $(echo "$out" | tail -1)"
hf_case hf_extra_buffer
st_add "$tmp/hf_extra_buffer" "$lm_shard" model.layers.0.self_attn.rotary_emb.inv_freq 1 8 1.0
out=$("$SPES_BIN" eval --model "$tmp/hf_extra_buffer" --tokens "$tmp/tokens.npy" --threads 1 --no_progress 2>&1) ||
  bad "hf_extra_buffer: eval failed: $(echo "$out" | tail -1)"
echo "$out" | grep -q "ignoring tensor model.layers.0.self_attn.rotary_emb.inv_freq" ||
  bad "hf_extra_buffer: no warning naming the buffer"
[ "$fail" != 0 ] || echo "ok hf_fewer_layers, hf_extra_buffer"

# --- spes export --checkpoint SAVE_FOLDER finds the latest checkpoint as --resume does. Its own
# search read "step+99" as step 99 (strtol) and then failed on step99/, which does not exist.
damaged export_plus_name 'cp -a step4 step+99'
out=$("$SPES_BIN" export --checkpoint "$tmp/export_plus_name" --out "$tmp/export_plus_name.out" 2>&1) ||
  bad "export_plus_name: export failed: $(echo "$out" | tail -1)"
echo "$out" | grep -q "using the latest checkpoint $tmp/export_plus_name/step4" ||
  bad "export_plus_name: not step4: $(echo "$out" | grep -m1 'using' || echo "$out" | tail -1)"
damaged export_file_step 'echo x > step6'
out=$("$SPES_BIN" export --checkpoint "$tmp/export_file_step" --out "$tmp/export_file_step.out" 2>&1) &&
  bad "export_file_step: export succeeded"
echo "$out" | tail -1 | grep -q "step6 is not a checkpoint directory" ||
  bad "export_file_step: unclear error: $(echo "$out" | tail -1)"

[ "$fail" = 0 ] || exit 1
echo "checkpoint_hostile: all cases refused clearly, no checkpoint changed"
