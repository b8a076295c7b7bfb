#!/usr/bin/env python3
"""Slowloris against the status server (issue 29): N connections each send a request line and
then one header line every --trickle_s seconds (never idle long enough for the server's idle
timeout, never finishing the request), while a client with the token asks for /status.json
--requests times. The server must keep serving that client: exits 1 if fewer than --want of its
requests get a 200 within --client_timeout_s each."""
import argparse
import socket
import sys
import threading
import time


def slow_client(host, port, stop, trickle_s):
    while not stop.is_set():
        try:
            s = socket.create_connection((host, port), timeout=5)
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
            n = 0
            while not stop.is_set():
                s.sendall(b"X-Slow-%d: y\r\n" % n)
                n += 1
                stop.wait(trickle_s)
        except OSError:
            stop.wait(0.2)   # closed by the server: come back, as an attacker would
        finally:
            try:
                s.close()
            except Exception:
                pass


def fetch(host, port, token, timeout_s):
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            s.sendall(b"GET /status.json HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n"
                      % token.encode())
            data = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
            return data.startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("host")
    ap.add_argument("port", type=int)
    ap.add_argument("--token", required=True)
    ap.add_argument("--connections", type=int, default=70)
    ap.add_argument("--trickle_s", type=float, default=1.0)
    ap.add_argument("--requests", type=int, default=13)
    ap.add_argument("--want", type=int, default=12)
    ap.add_argument("--client_timeout_s", type=float, default=3.0)
    a = ap.parse_args()
    stop = threading.Event()
    threads = [threading.Thread(target=slow_client, args=(a.host, a.port, stop, a.trickle_s), daemon=True)
               for _ in range(a.connections)]
    for t in threads:
        t.start()
    time.sleep(2.0)   # every slow connection open and trickling
    served = 0
    for _ in range(a.requests):
        served += fetch(a.host, a.port, a.token, a.client_timeout_s)
        time.sleep(0.5)
    stop.set()
    print(f"slowloris: {a.connections} trickling connections; the token holder got {served} of {a.requests} requests")
    sys.exit(0 if served >= a.want else 1)


if __name__ == "__main__":
    main()
