#!/usr/bin/env python3
"""A hostile parameter server for `spes status` (issue 29): answers /FederatedServer/Status with
values no server can hold, or (mode 'silent') accepts TCP connections and never answers.
Usage: hostile_status_server.py DESCRIPTOR_SET MODE   (MODE: huge_peers | negative_bytes | silent)
Prints "listening on PORT" once it serves."""
import sys

import grpc

from fake_server import messages, serve, silent


def main():
    desc, mode = sys.argv[1], sys.argv[2]
    if mode == "silent":
        silent()
    classes = messages(desc)
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

    handler = grpc.method_handlers_generic_handler("FederatedServer", {
        "Status": grpc.unary_unary_rpc_method_handler(status, request_deserializer=Request.FromString,
                                                      response_serializer=Response.SerializeToString)})
    serve(handler, 4)


if __name__ == "__main__":
    main()
