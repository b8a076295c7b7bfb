#!/usr/bin/env python3
"""A hostile parameter server for `spes status` (issue 29): answers /FederatedServer/Status with
values no server can hold, or (mode 'silent') accepts TCP connections and never answers.
Usage: hostile_status_server.py DESCRIPTOR_SET MODE   (MODE: huge_peers | negative_bytes | silent)
Prints "listening on PORT" once it serves."""
import socket
import sys
import time
from concurrent import futures

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory


def main():
    desc, mode = sys.argv[1], sys.argv[2]
    if mode == "silent":
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        print("listening on %d" % s.getsockname()[1], flush=True)
        held = []
        while True:
            conn, _ = s.accept()
            held.append(conn)   # accepted, never read from, never answered
    fds = descriptor_pb2.FileDescriptorSet()
    fds.ParseFromString(open(desc, "rb").read())
    pool = descriptor_pool.DescriptorPool()
    for f in fds.file:
        pool.Add(f)
    classes = message_factory.GetMessages(fds.file)
    Request, Response = classes["StatusRequest"], classes["StatusResponse"]

    def status(request, context):
        r = Response(rounds_completed=3, open_step=8, last_aggregate_step=6, total_peers=4, mode="spes",
                     fingerprint=1, last_round_peers=4)
        if mode == "huge_peers":
            r.total_peers = 2**31 - 1
        elif mode == "negative_bytes":
            r.bytes_sent = -2**63
            r.bytes_received = 10**6
        return r

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    handler = grpc.method_handlers_generic_handler("FederatedServer", {
        "Status": grpc.unary_unary_rpc_method_handler(status, request_deserializer=Request.FromString,
                                                      response_serializer=Response.SerializeToString)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print("listening on %d" % port, flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
