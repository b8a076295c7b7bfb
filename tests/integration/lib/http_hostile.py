#!/usr/bin/env python3
"""Hostile HTTP requests against a status server (spes server --status_port, or the fixture
server `test_status_http serve`); each must be answered with the expected refusal or closed,
and the server must still serve /status.json afterwards (and during the slow clients).

    http_hostile.py HOST PORT [--token T] [--timeout_s S] [--connections N]

--timeout_s: the server's per-connection timeout (a half-sent request must be closed within
it, plus slack). Exit 0 when every check passed, 1 with a line per failure. Standard library
only."""
import argparse
import json
import random
import socket
import sys
import threading
import time

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures.append(what)


def exchange(host, port, raw, wait_s=10):
    """Sends raw bytes, reads until the server closes; returns (status code or 0, answer bytes)."""
    with socket.create_connection((host, port), timeout=wait_s) as s:
        try:
            s.sendall(raw)
        except OSError:
            pass  # the server may refuse before reading everything
        data = b""
        try:
            while chunk := s.recv(65536):
                data += chunk
        except OSError:
            pass
    try:
        return int(data.split(b" ", 2)[1]), data
    except (IndexError, ValueError):
        return 0, data


def request(method, path, headers=b"", body=b""):
    return (method.encode() + b" " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" +
            headers + b"\r\n" + body)


def status_json(host, port, auth):
    code, data = exchange(host, port, request("GET", "/status.json", auth))
    if code != 200:
        return None
    try:
        return json.loads(data.split(b"\r\n\r\n", 1)[1])
    except ValueError:
        return None


def still_serves(host, port, auth, after):
    doc = status_json(host, port, auth)
    check(doc is not None and "peers" in doc, f"serves /status.json after {after}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("--token")
    ap.add_argument("--timeout_s", type=float, default=10)
    ap.add_argument("--connections", type=int, default=200)
    a = ap.parse_args()
    h, p = a.host, a.port
    auth = f"Authorization: Bearer {a.token}\r\n".encode() if a.token else b""

    still_serves(h, p, auth, "nothing (baseline)")
    for m in ["POST", "PUT", "DELETE", "OPTIONS", "TRACE", "CONNECT", "PATCH", "XYZZY"]:
        code, _ = exchange(h, p, request(m, "/status.json", auth))
        check(code in (405, 400), f"{m} refused ({code})")
    code, _ = exchange(h, p, request("POST", "/status.json", auth + b"Content-Length: 11\r\n", b"hello world"))
    check(code in (405, 413), f"POST with a body refused ({code})")
    code, _ = exchange(h, p, request("GET", "/", auth + b"Content-Length: 5\r\n", b"hello"))
    check(code == 413, f"GET with a body refused ({code})")
    code, _ = exchange(h, p, request("GET", "/", auth + b"Transfer-Encoding: chunked\r\n", b"5\r\nhello\r\n0\r\n\r\n"))
    check(code == 413, f"GET with a chunked body refused ({code})")
    code, _ = exchange(h, p, request("GET", "/status.json?x=" + "a" * 8192, auth))
    check(code == 414, f"8 KiB URL refused ({code})")
    code, _ = exchange(h, p, request("GET", "/" + "a" * 100000, auth))
    check(code in (414, 431, 400, 0), f"100 KB URL refused or closed ({code})")
    code, _ = exchange(h, p, request("GET", "/", auth + b"X-Big: " + b"b" * 100000 + b"\r\n"))
    check(code in (431, 414, 400, 0), f"100 KB header refused or closed ({code})")
    code, _ = exchange(h, p, request("GET", "/etc/passwd", auth))
    check(code == 404, f"unknown path 404 ({code})")
    code, _ = exchange(h, p, request("GET", "/../status.json", auth))
    check(code in (404, 400), f"dot-dot path not served ({code})")
    rng = random.Random(15)
    for i in range(5):
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4096)))
        code, _ = exchange(h, p, junk, wait_s=a.timeout_s + 5)
        check(code in (400, 0, 505, 414, 431, 405), f"garbage bytes #{i} refused or closed ({code})")
    still_serves(h, p, auth, "the malformed requests")

    # Slowloris: half-sent requests must not stop others from being served, and each is closed
    # within the connection timeout.
    slow = []
    for _ in range(5):
        s = socket.create_connection((h, p), timeout=a.timeout_s + 10)
        s.sendall(b"GET / HTTP/1.1\r\nHost:")
        slow.append(s)
    start = time.monotonic()
    still_serves(h, p, auth, "5 half-sent requests (while they hang)")
    closed = 0
    for s in slow:
        try:
            closed += s.recv(1) == b""
        except OSError:
            closed += 1
        s.close()
    took = time.monotonic() - start
    check(closed == 5 and took <= a.timeout_s + 8, f"half-sent requests closed by the server ({closed}/5 in {took:.1f} s)")

    # Many connections at once, each sending a request: answered (200) or refused (closed).
    n = a.connections
    codes = [None] * n
    socks = []
    for i in range(n):
        try:
            socks.append(socket.create_connection((h, p), timeout=30))
        except OSError:
            socks.append(None)

    def one(i):
        s = socks[i]
        if s is None:
            codes[i] = "refused"
            return
        try:
            s.sendall(request("GET", "/status.json", auth))
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            codes[i] = int(data.split(b" ", 2)[1]) if data else "closed"
        except (OSError, IndexError, ValueError):
            codes[i] = "closed"
        finally:
            s.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    answered = sum(c == 200 for c in codes)
    other = sorted({str(c) for c in codes if c not in (200, "closed", "refused", 503)})
    check(answered > 0 and not other and all(c is not None for c in codes),
          f"{n} connections at once: {answered} answered 200, the rest refused or closed {other or ''}")
    still_serves(h, p, auth, f"{n} connections at once")

    if failures:
        print(f"{len(failures)} hostile-request check(s) failed")
        return 1
    print("every hostile request answered or refused; the server still serves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
