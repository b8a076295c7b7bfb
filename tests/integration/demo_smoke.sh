#!/usr/bin/env bash
# `spes demo` in miniature: 2 peers x 4 experts, 6 steps, 2 sync rounds, plus the
# centralised baseline; the comparison table and the files it names must be there; and
# `spes demo --inputs_only` writes the same inputs without training.
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
echo "demo smoke: ok"
