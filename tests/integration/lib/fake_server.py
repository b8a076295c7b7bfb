"""What the hostile parameter servers of the integration tests share (hostile_status_server.py,
hostile_sync_server.py): the message classes of federated.proto from a descriptor set, serving a
handler, and a server that accepts connections and never answers. Each prints "listening on
PORT" once it serves, which the test scripts wait for."""
import socket
import time
from concurrent import futures

import grpc
from google.protobuf import descriptor_pb2, message_factory


def messages(desc_path):
    """{message name: class} of the descriptor set at desc_path (protoc-c --descriptor_set_out)."""
    fds = descriptor_pb2.FileDescriptorSet()
    fds.ParseFromString(open(desc_path, "rb").read())
    return message_factory.GetMessages(fds.file)


def serve(handler, max_workers, options=()):
    """Serves handler on a free port of 127.0.0.1 for ever."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), options=list(options))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print("listening on %d" % port, flush=True)
    while True:
        time.sleep(3600)


def silent():
    """Accepts TCP connections for ever, never reads from them or answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    print("listening on %d" % s.getsockname()[1], flush=True)
    held = []
    while True:
        conn, _ = s.accept()
        held.append(conn)
