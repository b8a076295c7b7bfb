#!/usr/bin/env bash
# int8 delta payloads end to end (spes_config.payload_dtype: int8, docs/communication.md): a
# parameter server with a state dir and 4 `spes train` peers, 5 sync rounds (steps 2..10,
# expert merging on step 4 and 8). Checked:
#  - after every sync all peers hold byte-identical weights, equal to the aggregate they
#    reconstructed, and equal to the server's own aggregate (its state dir): the server
#    reconstructs exactly what the peers reconstruct;
#  - the first round goes whole (no base yet); later rounds go down as int8 deltas, without
#    the peer's own experts except on merge steps, and come up as int8 deltas;
#  - the server's aggregate of a round is the mean / ownership of the peers' uploads as
#    reconstructed from their int8 deltas (numpy, from the audit logs).
# SYNC_DELTA=int4 runs the same with spes_config.payload_dtype: int4 (sync_int4_e2e.sh): 4-bit
# codes packed two per byte, bf16 scales; the numpy recomputation decodes and re-encodes them.
# SYNC_INT8_SERVER_FLAGS adds server flags (sync_int8_outer_e2e.sh: the outer optimizer, whose
# aggregate is not the plain mean: the numpy recomputation is then left out, the rest holds).
set -euo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/lib/reliability.sh
reliability_begin --venv
DELTA=${SYNC_DELTA:-int8}

reliability_data

reliability_server --state_dir "$dir/state" --keep_steps 10 --merge_interval 4 --merge_alpha_start 0.5 \
  --merge_decay_steps 100 --merge_topk 2 ${SYNC_INT8_SERVER_FLAGS:-}

reliability_run_peers "$dir" 10 2 --spes_config.payload_dtype=$DELTA

peers_match_aggregate "$dir" 4 2 4 6 8 10
server_matches_peers "$dir" 2 4 6 8 10

view() { peer_view "$dir" "$@"; }
for peer in 0 1 2 3; do
  [ "$(view 2 $peer)" = "" ] || { echo "peer $peer step 2: expected the whole aggregate, got '$(view 2 $peer)'"; exit 1; }
  for step in 4 8; do
    [ "$(view $step $peer)" = "$DELTA-delta" ] || { echo "peer $peer step $step (merge): got '$(view $step $peer)'"; exit 1; }
  done
  for step in 6 10; do
    [ "$(view $step $peer)" = "$DELTA-delta+omit-own-experts" ] ||
      { echo "peer $peer step $step: got '$(view $step $peer)'"; exit 1; }
  done
done
grep "sync step" "$dir/peer0.log" | sed 's/^.*sync step/  sync step/'
if [ -n "${SYNC_INT8_SERVER_FLAGS:-}" ]; then
  ls "$dir"/state/outer_s*.bin >/dev/null || { echo "no outer optimizer state in the server's state dir"; exit 1; }
  echo "with server flags '$SYNC_INT8_SERVER_FLAGS': server and peers agree at every step"
  exit 0
fi

"$SPES_VENV_PY" - "$dir" "$DELTA" <<'PY'
# The aggregate of a round without merging, recomputed from the peers' delta uploads: upload of
# peer p = previous aggregate + q * scale (float32), shared tensors the fp32 mean in peer order,
# experts their owner's; the server then sends (and everyone holds) previous + the codec's
# encoding of the change (int8: fp32 scale max/127; int4: bf16 scale max/7, codes packed two a
# byte in one zstd frame per tensor, decompressed here with the system libzstd through ctypes).
import ctypes, ctypes.util, json, re, struct, sys, numpy as np
from safetensors.numpy import load_file
d, delta = sys.argv[1], sys.argv[2]
qmax = 127 if delta == "int8" else 7

def read(path):
    """A safetensors file by hand (numpy has no bfloat16): {name: array}, metadata."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for k, t in header.items():
        b = raw[8 + n + t["data_offsets"][0]: 8 + n + t["data_offsets"][1]]
        if t["dtype"] == "BF16":
            out[k] = (np.frombuffer(b, np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            out[k] = np.frombuffer(b, {"F32": np.float32, "I8": np.int8, "U8": np.uint8}[t["dtype"]])
    return out, meta

zstd = ctypes.CDLL(ctypes.util.find_library("zstd"))
zstd.ZSTD_getFrameContentSize.restype = ctypes.c_ulonglong
zstd.ZSTD_decompress.restype = ctypes.c_size_t

def unzstd(frame, size):
    src = bytes(frame)
    assert zstd.ZSTD_getFrameContentSize(src, ctypes.c_size_t(len(src))) == size
    dst = ctypes.create_string_buffer(size)
    assert zstd.ZSTD_decompress(dst, ctypes.c_size_t(size), src, ctypes.c_size_t(len(src))) == size
    return np.frombuffer(dst.raw, np.uint8)

def codes(x, n):
    if delta == "int8": return x.astype(np.float32)
    x = unzstd(x, (n + 1) // 2)
    nib = np.stack([x & 0x0f, x >> 4], axis=1).ravel()[:n].astype(np.int16)   # low nibble first
    return np.where(nib >= 8, nib - 16, nib).astype(np.float32)

def wire_scale(s):
    if delta == "int8": return s
    u = s.view(np.uint32).astype(np.uint64)
    return ((u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000).astype(np.uint32).view(np.float32)   # bf16, nearest even

for step, prev in ((6, 4), (10, 8)):
    base = load_file(f"{d}/sync/down_s{prev}_p0.safetensors")
    agg = load_file(f"{d}/sync/down_s{step}_p0.safetensors")
    ups = []
    for p in range(4):
        f, meta = read(f"{d}/sync/up_s{step}_p{p}.safetensors")
        assert meta["spes_encoding"] == f"{delta}-delta" and meta["spes_base_step"] == str(prev), meta
        u = {}
        for k in f:
            if k.endswith(".scale"): continue
            q = codes(f[k], base[k].size)
            s = np.repeat(f[k + ".scale"], 256)[: q.size]
            u[k] = (base[k].ravel() + q * s).astype(np.float32).reshape(base[k].shape)
        ups.append(u)
    for k in agg:
        m = re.match(r"model\.layers\.\d+\.mlp\.experts\.(\d+)\.", k)
        a = ups[int(m.group(1))][k] if m else ((ups[0][k] + ups[1][k]) + ups[2][k] + ups[3][k]) / np.float32(4)
        change = (a - base[k]).ravel()
        blocks = np.pad(change, (0, -change.size % 256)).reshape(-1, 256)
        scale = wire_scale((np.abs(blocks).max(axis=1) / np.float32(qmax)).astype(np.float32))
        q = np.clip(np.rint(np.divide(blocks, scale[:, None], out=np.zeros_like(blocks), where=scale[:, None] > 0)), -qmax, qmax)
        want = (base[k].ravel() + (q * scale[:, None]).ravel()[: change.size]).astype(np.float32)
        assert np.array_equal(want, agg[k].ravel()), f"step {step}: {k} is not prev + {delta}(mean of uploads - prev)"
    print(f"step {step}: {len(agg)} tensors = previous + {delta} change of the aggregate of the {delta} uploads")
PY
echo "sync $DELTA e2e: all checks passed"
