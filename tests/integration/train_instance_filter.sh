#!/usr/bin/env bash
# data.instance_filter in training (OLMo's repetition filter; the detector itself is checked
# against OLMo's code by data_instance_filter_ref.sh). The tiny MoE on 64 instances of 32 ids,
# every instance in every step (global batch 64), three of them planted with a 3-token pattern
# x9 and one with a token x7; repetition_max_count 8:
#   - metrics.jsonl says 3 masked instances at every step, the console "masked 3"; without the
#     key there is no such field and the losses differ (the masked instances count again);
#   - 2 ranks filter the rows they read and train what 1 rank trains (the same step-1 losses,
#     bit for bit, and the weights within fp32 reduction order).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tests/integration/lib/require.sh
require_spes
require_mpirun
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source tests/integration/lib/dist_tiny.sh
dist_tiny_setup "$tmp"
python3 - "$tmp/tokens.npy" <<'PY'
import struct, sys
path, T = sys.argv[1], 32
ids = list(struct.unpack("<%dH" % (64 * T), open(path, "rb").read()))
for inst in (5, 17, 40):                      # [2, 29): 61 62 63 x9 -> masked
    for t in range(27):
        ids[inst * T + 2 + t] = 61 + t % 3
for t in range(7):                            # a token x7 -> kept
    ids[22 * T + 10 + t] = 60
open(path, "wb").write(struct.pack("<%dH" % len(ids), *ids))
PY
filter=(--global_train_batch_size=64 --device_train_microbatch_size=8 --data.instance_filter.repetition_max_count=8)
dist_train plain 1 --global_train_batch_size=64 --device_train_microbatch_size=8
dist_train one 1 "${filter[@]}"
dist_train two 2 "${filter[@]}"

python3 - "$tmp" <<'PY'
import json, sys
def steps(name):
    return [json.loads(l) for l in open(f"{sys.argv[1]}/{name}/metrics.jsonl") if '"loss"' in l]
one, plain = steps("one"), steps("plain")
assert len(one) == 5, len(one)
assert all(s["masked_instances"] == 3 for s in one), [s.get("masked_instances") for s in one]
assert all("masked_instances" not in s for s in plain)
assert one[0]["ce"] != plain[0]["ce"], "the filter changed nothing"
print("masked_instances 3 at every step; step-1 ce %.6f with the filter, %.6f without" % (one[0]["ce"], plain[0]["ce"]))
PY
grep -q "| masked 3 |" "$tmp/one.log" || { echo "FAIL: no 'masked 3' on the console"; tail -5 "$tmp/one.log"; exit 1; }
dist_check one two 5 --tol 1e-5 --exact-steps 1
python3 -c "
import json,sys
s=[json.loads(l) for l in open('$tmp/two/metrics.jsonl') if '\"loss\"' in l]
assert all(x['masked_instances'] == 3 for x in s), s"
echo "PASS"
