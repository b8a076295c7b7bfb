#!/usr/bin/env python3
"""A process that is not a spes rank, at a torchrun-style rendezvous (src/parallel/rendezvous.c).

    rdv_impostor.py ADDR PORT silent          connect and say nothing
    rdv_impostor.py ADDR PORT claim RANK WS   say RANK and WORLD_SIZE as a rank does, read what rank 0
                                              sends (the ompi-server URI, the MPI port name), never
                                              join MPI, stay connected

Prints one line per event (stdout, flushed), then waits until killed. Stdlib only, so it also
runs as another user (/usr/bin/python3)."""
import socket
import struct
import sys
import time


def recv_exact(s, n):
    data = b""
    while len(data) < n:
        try:
            chunk = s.recv(n - len(data))
        except ConnectionError:
            return None
        if not chunk:
            return None
        data += chunk
    return data


def recv_str(s):
    head = recv_exact(s, 4)
    if head is None:
        return None
    (n,) = struct.unpack("<I", head)
    body = recv_exact(s, n)
    return None if body is None else body.decode(errors="replace")


def main():
    addr, port, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    name = "\0spes-rendezvous-%s-%d" % (addr, port)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    deadline = time.time() + 30
    while True:
        try:
            s.connect(name)
            break
        except OSError:
            if time.time() > deadline:
                print("impostor: no rendezvous to connect to", flush=True)
                return 1
            time.sleep(0.05)
    print("impostor: connected", flush=True)
    if mode == "claim":
        s.sendall(struct.pack("<ii", int(sys.argv[4]), int(sys.argv[5])))
        for what in ("uri", "port"):
            got = recv_str(s)
            print("impostor: %s %s" % (what, "closed" if got is None else "received"), flush=True)
            if got is None:
                break
    while True:
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
