#!/usr/bin/env bash
# `spes demo --outer_lr X --outer_momentum Y` in miniature: the settings go into demo.yaml
# (spes_config.outer_lr / outer_momentum), the demo's server takes them from that file
# (`spes server --config`), and the peers, which state them in Hello, are accepted and finish.
set -euo pipefail
SPES=${SPES_BIN:-build/spes}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$SPES" demo --peers 2 --experts_per_peer 4 --steps 6 --sync_steps 3 --batch 2 --train_docs 300 --no_baseline \
  --outer_lr 0.7 --outer_momentum 0.9 --out "$out/demo" >"$out/demo.txt" 2>&1 || { tail -30 "$out/demo.txt"; exit 1; }
# The shortest text that reads back as the same float (src/demo/demo_config.c exact_number).
grep -q "^  outer_lr: 0.7$" "$out/demo/demo.yaml" || { echo "demo.yaml lacks outer_lr:"; grep -A30 spes_config "$out/demo/demo.yaml"; exit 1; }
grep -q "^  outer_momentum: 0.9$" "$out/demo/demo.yaml" || { echo "demo.yaml lacks outer_momentum"; exit 1; }
grep -q "outer optimizer lr 0.7, momentum 0.9 (from $out/demo/demo.yaml)" "$out/demo/server.log" ||
  { echo "the demo's server did not run the config's outer settings:"; head -5 "$out/demo/server.log"; exit 1; }
for p in 0 1; do grep -q "sync step 6" "$out/demo/peer$p.log" || { echo "peer $p did not finish its rounds"; exit 1; }; done
cmp "$out/demo/peer0/step6/model.safetensors" "$out/demo/peer1/step6/model.safetensors"
echo "demo with the outer optimizer: demo.yaml holds it, the server runs it, both peers accepted and synced"
