#!/usr/bin/env bash
# Interop: a Python client generated from the seeds' ORIGINAL federated.proto (Debian's
# python3-grpcio + python3-protobuf) uploads safetensors bytes to `spes server` and downloads
# the aggregate, without any of our extensions (no Hello: the server infers the model spec).
set -euo pipefail
cd "$(dirname "$0")/../.."
REF=${SPES_REFERENCE:-../shared/reference}
[ -f "$REF/federated.proto" ] || { echo "SKIPPED: no seeds proto at $REF/federated.proto"; exit 77; }
/usr/bin/python3 -c "import grpc, google.protobuf" 2>/dev/null || { echo "SKIPPED: python3-grpcio / python3-protobuf missing (scripts/install-deps.sh)"; exit 77; }
tmp=$(mktemp -d)
server_pid=""
cleanup() { [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
protoc-c --proto_path="$REF" --descriptor_set_out="$tmp/federated.desc" "$REF/federated.proto"
"$SPES_BIN" server --host 127.0.0.1 --port 0 --total_peers 2 --num_train_experts_per_node 1 --chunk_size 1000 >"$tmp/server.out" 2>"$tmp/server.err" &
server_pid=$!
port=""
for _ in $(seq 100); do
  port=$(sed -n 's/.*listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$tmp/server.out" 2>/dev/null || true)
  [ -n "$port" ] && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$tmp/server.err"; echo "server died"; exit 1; }
  sleep 0.1
done
[ -n "$port" ] || { echo "server did not report its port"; exit 1; }
timeout 60 /usr/bin/python3 tests/ref/interop_client.py "$tmp/federated.desc" "$port"
kill -TERM "$server_pid"
wait "$server_pid"
server_pid=""
cat "$tmp/server.out"
grep -q "stopped after 2 rounds" "$tmp/server.out"
