#!/usr/bin/env bash
# `spes demo` in miniature: 2 peers x 4 experts, 6 steps, 2 sync rounds, plus the
# centralised baseline; the comparison table and the files it names must be there;
# `spes demo --inputs_only` writes the same inputs without training; and a demo with expert
# replicas (2 peers x 2 of 2 experts: both own both) runs and ends with the peers in agreement.
set -euo pipefail
SPES=${SPES_BIN:-build/spes}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$SPES" demo --peers 2 --experts_per_peer 4 --steps 6 --sync_steps 3 --batch 2 --train_docs 300 --out "$out/demo" \
  >"$out/demo.txt" 2>&1 || { tail -30 "$out/demo.txt"; exit 1; }
cat "$out/demo.txt" | tail -20
grep -Eq "^validation loss \(nats/byte\) +[0-9.]+ +[0-9.]+$" "$out/demo.txt"
grep -Eq "^recall questions \(acc\) +[0-9.]+% +[0-9.]+%$" "$out/demo.txt"
grep -Eq "^held-out sums \(acc\) +[0-9.]+% +[0-9.]+%$" "$out/demo.txt"
# The sync traffic from the peers' logs: 2 rounds (steps 3 and 6), a positive size.
grep -Eq "^sync rounds +2$" "$out/demo.txt"
grep -Eq "^sync traffic per peer +[1-9][0-9]* MB$" "$out/demo.txt"
# Both peers ended on a sync step: they hold the same model.
cmp "$out/demo/peer0/step6/model.safetensors" "$out/demo/peer1/step6/model.safetensors"
[ -f "$out/demo/central/step6/model.safetensors" ]
grep -q "sync step 6" "$out/demo/peer1.log"
# --inputs_only (bench/quality's corpus) writes the same inputs, byte for byte, and trains nothing.
"$SPES" demo --inputs_only --peers 2 --experts_per_peer 4 --steps 6 --sync_steps 3 --batch 2 --train_docs 300 \
  --out "$out/inputs" >"$out/inputs.txt" 2>&1 || { tail -30 "$out/inputs.txt"; exit 1; }
for f in train.bin val.bin recall.jsonl arithmetic.jsonl; do cmp "$out/demo/$f" "$out/inputs/$f"; done
sed "s|$out/inputs|$out/demo|g" "$out/inputs/demo.yaml" | cmp - "$out/demo/demo.yaml"
[ "$(ls "$out/inputs" | sort | tr '\n' ' ')" = "arithmetic.jsonl demo.yaml recall.jsonl train.bin val.bin " ]
"$SPES" demo --peers 2 --experts_per_peer 2 --experts 2 --steps 4 --sync_steps 2 --batch 2 --train_docs 300 \
  --no_baseline --out "$out/replicas" >"$out/replicas.txt" 2>&1 || { tail -30 "$out/replicas.txt"; exit 1; }
grep -q "^SPES demo: 2 peers x 2 experts of 2 (2 owners each)" "$out/replicas.txt"
grep -q "moe_num_experts: 2$" "$out/replicas/demo.yaml"
cmp "$out/replicas/peer0/step4/model.safetensors" "$out/replicas/peer1/step4/model.safetensors"
"$SPES" demo --peers 3 --experts_per_peer 2 --experts 4 --out "$out/bad" >"$out/bad.txt" 2>&1 && exit 1
grep -q "every expert needs the same number of owners" "$out/bad.txt"
echo "demo smoke: ok"
