#!/usr/bin/env bash
# `spes server` flags: --help, required flags, bad values named, a bind failure explained, a
# second server on the same port or state dir refused, SIGUSR1 answered, a clean stop on SIGTERM with the
# summary line, bad status page flags refused before "listening on", and a status page that
# needs a token when only --peer_tokens are given.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x "${SPES_BIN:-}" ] || { echo "spes binary not built: ${SPES_BIN:-<unset>}"; exit 1; }
fail() { echo "FAIL: $*"; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

"$SPES_BIN" server --help >"$out/help" 2>&1 || fail "--help exits non-zero"
grep -q -- "--merge_topk" "$out/help" || fail "--help does not list --merge_topk"
# Which flags a --state_dir fixes (a restart with others is refused) was said nowhere in --help.
tr -s ' \n' ' ' <"$out/help" | grep -q -- "Fixed for a DIR (a restart with others is refused): --total_peers, .*--merge_\*, --expert_rotation_steps, --outer_lr/--outer_momentum and the peers' payload dtype; the other flags may change at a restart" ||
  fail "--help does not say which flags a --state_dir fixes"
"$SPES_BIN" server >"$out/none" 2>&1; [ $? -eq 2 ] || fail "no flags: exit code not 2"
grep -q -- "--total_peers is required" "$out/none" || fail "no flags: message does not name --total_peers"
"$SPES_BIN" server --total_peers 4 >"$out/nom" 2>&1; [ $? -eq 2 ] || fail "spes mode without M: exit code not 2"
grep -q -- "--num_train_experts_per_node is required" "$out/nom" || fail "missing M not named"
"$SPES_BIN" server --total_peers 4 --num_train_experts_per_node 2 --merge_alpha_start 2 >"$out/alpha" 2>&1
[ $? -eq 1 ] || fail "alpha 2: exit code not 1"
grep -q -- "--merge_alpha_start: '2' is not a number in \[0, 1\]" "$out/alpha" || fail "bad alpha not named: $(cat "$out/alpha")"
"$SPES_BIN" server --total_peers 4 --num_train_experts_per_node 2 --mode dilico >"$out/mode" 2>&1
[ $? -eq 1 ] || fail "bad mode: exit code not 1"
grep -q "sync mode 'dilico' is not one of spes, fedavg" "$out/mode" || fail "bad mode not named"
# A receive quota below two of the largest requests would reset every Hello or upload chunk.
"$SPES_BIN" server --total_peers 4 --num_train_experts_per_node 2 --port 0 --max_receive_buffer 1000 >"$out/quota" 2>&1
[ $? -eq 1 ] || fail "small --max_receive_buffer: exit code not 1"
grep -q -- "--max_receive_buffer 1000 is below two of the largest requests (2 x 16777216 bytes" "$out/quota" ||
  fail "small --max_receive_buffer not named: $(cat "$out/quota")"
grep -q "listening on" "$out/quota" && fail "small --max_receive_buffer: said 'listening on' before exiting"
"$SPES_BIN" server --total_peers 4 --num_train_experts_per_node 2 --host 256.1.1.1 >"$out/bind" 2>&1
[ $? -eq 1 ] || fail "unbindable host: exit code not 1"
grep -q "cannot listen on 256.1.1.1:50051" "$out/bind" || fail "bind failure not explained"

"$SPES_BIN" server --total_peers 2 --mode fedavg --host 127.0.0.1 --port 0 --state_dir "$out/state" >"$out/run" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "listening on" "$out/run" && break; sleep 0.1; done
grep -q "listening on 127.0.0.1:[0-9]* (2 peers, mode fedavg" "$out/run" || { kill $pid; fail "no listening line"; }
# One server per port and per state dir: a second one is refused with a clear message.
port=$(sed -n 's/.*listening on 127.0.0.1:\([0-9]*\) .*/\1/p' "$out/run" | head -1)
"$SPES_BIN" server --total_peers 2 --mode fedavg --host 127.0.0.1 --port "$port" >"$out/second" 2>&1
[ $? -eq 1 ] || { kill $pid; fail "a second server on port $port started: $(cat "$out/second")"; }
grep -q "cannot listen on 127.0.0.1:$port: the port is in use" "$out/second" || { kill $pid; fail "port clash not explained: $(cat "$out/second")"; }
"$SPES_BIN" server --total_peers 2 --mode fedavg --host 127.0.0.1 --port 0 --state_dir "$out/state" >"$out/second" 2>&1
[ $? -eq 1 ] || { kill $pid; fail "a second server on the same state dir started: $(cat "$out/second")"; }
grep -q -- "--state_dir $out/state is in use by another spes server" "$out/second" || { kill $pid; fail "state dir clash not explained: $(cat "$out/second")"; }
# SIGUSR1 (a job-wide "save now") is answered and the server serves on (its default action ended it).
kill -USR1 $pid
for _ in $(seq 50); do grep -q "SIGUSR1: nothing to save now" "$out/run" && break; sleep 0.1; done
grep -q "SIGUSR1: nothing to save now (the state dir is written" "$out/run" || { kill $pid; fail "SIGUSR1 not answered: $(tail -2 "$out/run")"; }
kill -0 $pid 2>/dev/null || fail "SIGUSR1 ended the server"
kill -TERM $pid
wait $pid || fail "SIGTERM: server exited non-zero"
# Its console's reader gone (`spes server 2>&1 | head -1`): the next log line (SIGUSR1's) used to
# end the server by SIGPIPE; it serves on and still stops cleanly.
mkfifo "$out/pipe"
"$SPES_BIN" server --total_peers 2 --mode fedavg --host 127.0.0.1 --port 0 >"$out/pipe" 2>&1 &
pid=$!
head -1 "$out/pipe" >/dev/null   # the reader reads one line and goes
sleep 0.2
kill -USR1 $pid
sleep 0.5
kill -0 $pid 2>/dev/null || fail "a log line to a closed pipe ended the server"
kill -TERM $pid
wait $pid || fail "SIGTERM after a closed console: server exited non-zero"
grep -q "stopped after 0 rounds" "$out/run" || fail "no summary line on stop"
# The status page's flags (issue 29): a bad --status_bind or an empty --status_token_file exits 1
# without ever saying "listening on" (launchers take that line as the server being up).
"$SPES_BIN" server --total_peers 2 --mode fedavg --host 127.0.0.1 --port 0 --status_port 0 --status_bind 300.1.1.1 \
  >"$out/sbind" 2>&1
[ $? -eq 1 ] || fail "bad --status_bind: exit code not 1"
grep -q "bind address '300.1.1.1' is not a numeric" "$out/sbind" || fail "bad --status_bind not named: $(cat "$out/sbind")"
grep -q "listening on" "$out/sbind" && fail "bad --status_bind: said 'listening on' before exiting"
: >"$out/empty_token"
"$SPES_BIN" server --total_peers 2 --mode fedavg --host 127.0.0.1 --port 0 --status_port 0 \
  --status_token_file "$out/empty_token" >"$out/stoken" 2>&1
[ $? -eq 1 ] || fail "empty --status_token_file: exit code not 1"
grep -q -- "--status_token_file" "$out/stoken" || fail "empty --status_token_file not named: $(cat "$out/stoken")"
grep -q "listening on" "$out/stoken" && fail "empty --status_token_file: said 'listening on' before exiting"

# With only --peer_tokens the page needs a token as the gRPC Status does: any peer's lets it in.
if command -v curl >/dev/null; then
  printf '0 peer-zero-%s\n1 peer-one-%s\n' "$RANDOM" "$RANDOM" >"$out/peer_tokens"
  one=$(sed -n 's/^1 //p' "$out/peer_tokens")
  "$SPES_BIN" server --total_peers 2 --mode fedavg --host 127.0.0.1 --port 0 --status_port 0 \
    --peer_tokens "$out/peer_tokens" >"$out/ptok" 2>&1 &
  pid=$!
  for _ in $(seq 100); do grep -q "listening on" "$out/ptok" && break; sleep 0.1; done
  sport=$(sed -n 's|.*status page on http://127.0.0.1:\([0-9]*\)/.*|\1|p' "$out/ptok" | head -1)
  [ -n "$sport" ] || { kill $pid; fail "no status page line: $(cat "$out/ptok")"; }
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$sport/status.json")
  [ "$code" = 401 ] || { kill $pid; fail "--peer_tokens only: /status.json without a token answered $code, not 401"; }
  code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $one" "http://127.0.0.1:$sport/status.json")
  [ "$code" = 200 ] || { kill $pid; fail "--peer_tokens only: /status.json with peer 1's token answered $code"; }
  kill -TERM $pid
  wait $pid || fail "SIGTERM: server with --peer_tokens exited non-zero"
fi
echo "spes server CLI: ok"
