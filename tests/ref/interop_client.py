"""Interop: a client built only from the seeds' ORIGINAL federated.proto (no extensions), the
way the SPES reference's Python stubs talk, uploading safetensors bytes to our server and
downloading the aggregate. Runs on Debian's python3-grpcio + python3-protobuf.

The message classes and method paths come from a descriptor set compiled from the original
proto at test time (protoc-c --descriptor_set_out), exactly what grpc_tools would generate
into federated_pb2 / federated_pb2_grpc (stream_unary UploadChunk, unary_unary DownloadChunk).
Usage: interop_client.py DESCRIPTOR_SET PORT
"""
import json
import struct
import sys
import time

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

# A tiny MoE with 2 experts: peer p (of 2, one expert each) uploads the shared tensors + expert p.
SHAPES = {
    "model.embed_tokens.weight": [4, 3],
    "model.layers.0.mlp.gate.weight": [2, 3],
    "model.layers.0.mlp.experts.0.gate_proj.weight": [2, 3],
    "model.layers.0.mlp.experts.0.up_proj.weight": [2, 3],
    "model.layers.0.mlp.experts.0.down_proj.weight": [3, 2],
    "model.layers.0.mlp.experts.1.gate_proj.weight": [2, 3],
    "model.layers.0.mlp.experts.1.up_proj.weight": [2, 3],
    "model.layers.0.mlp.experts.1.down_proj.weight": [3, 2],
    "lm_head.weight": [4, 3],
}


def owner(name):
    parts = name.split(".")
    return int(parts[5]) if ".experts." in name else None


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def values(peer, step, name):
    base = sum(map(ord, name)) % 13
    return [f32((peer + 1) * 0.37 + step * 0.011 + (base + i) * 0.0625) for i in range(numel(SHAPES[name]))]


def safetensors_bytes(tensors):
    """tensors: {name: (shape, [floats])} -> safetensors bytes (F32), header padded to 8."""
    header, data, at = {}, b"", 0
    for name, (shape, vals) in tensors.items():
        blob = struct.pack("<%df" % len(vals), *vals)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [at, at + len(blob)]}
        data += blob
        at += len(blob)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def parse_safetensors(buf):
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8 : 8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", info
        a, b = info["data_offsets"]
        out[name] = (info["shape"], list(struct.unpack("<%df" % ((b - a) // 4), buf[8 + n + a : 8 + n + b])))
    return out


def main():
    desc_path, port = sys.argv[1], int(sys.argv[2])
    fds = descriptor_pb2.FileDescriptorSet.FromString(open(desc_path, "rb").read())
    pool = descriptor_pool.DescriptorPool()
    for f in fds.file:
        pool.Add(f)
    service = pool.FindServiceByName("FederatedServer")
    assert set(service.methods_by_name) == {"UploadChunk", "DownloadChunk"}, "not the original proto"
    factory = message_factory.MessageFactory(pool)
    msg = {n: factory.GetPrototype(pool.FindMessageTypeByName(n)) for n in
           ("UploadChunkRequest", "UploadChunkResponse", "DownloadChunkRequest", "DownloadChunkResponse")}
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    grpc.channel_ready_future(channel).result(timeout=30)
    upload = channel.stream_unary(f"/{service.full_name}/UploadChunk",
                                  request_serializer=msg["UploadChunkRequest"].SerializeToString,
                                  response_deserializer=msg["UploadChunkResponse"].FromString)
    download = channel.unary_unary(f"/{service.full_name}/DownloadChunk",
                                   request_serializer=msg["DownloadChunkRequest"].SerializeToString,
                                   response_deserializer=msg["DownloadChunkResponse"].FromString)

    def send(peer, step, payload, chunk=500):
        chunks = [payload[i : i + chunk] for i in range(0, len(payload), chunk)]
        reqs = (msg["UploadChunkRequest"](peer_id=peer, step=step, chunk_id=i, total_chunks=len(chunks), chunk_data=c)
                for i, c in enumerate(chunks))
        return upload(reqs, timeout=30)

    def fetch(peer, step):
        parts, i = [], 0
        while True:
            r = download(msg["DownloadChunkRequest"](peer_id=peer, step=step, chunk_id=i), timeout=30)
            if not r.ready:
                return None
            parts.append(r.chunk_data)
            if r.last_chunk:
                return b"".join(parts)
            i += 1

    def upload_of(peer, step):
        return {n: (s, values(peer, step, n)) for n, s in SHAPES.items() if owner(n) in (None, peer)}

    for step in (1, 2):
        ups = {p: upload_of(p, step) for p in (0, 1)}
        assert send(0, step, safetensors_bytes(ups[0])).success
        assert fetch(0, step) is None, "aggregate ready before every peer uploaded"
        if step == 1:  # a NaN upload is refused and does not poison the round
            bad = upload_of(1, step)
            bad["lm_head.weight"][1][2] = float("nan")
            try:
                send(1, step, safetensors_bytes(bad))
                raise AssertionError("NaN upload accepted")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
                print("NaN upload refused:", e.details())
        assert send(1, step, safetensors_bytes(ups[1])).success
        aggs = [fetch(p, step) for p in (0, 1)]
        assert aggs[0] is not None and aggs[0] == aggs[1], "peers got different aggregates"
        agg = parse_safetensors(aggs[0])
        assert set(agg) == set(SHAPES), sorted(agg)
        for name, (shape, vals) in agg.items():
            assert shape == SHAPES[name], (name, shape)
            o = owner(name)
            want = ups[o][name][1] if o is not None else [f32((a + b) / 2) for a, b in zip(ups[0][name][1], ups[1][name][1])]
            assert vals == want, f"step {step}: {name}: {vals[:4]} != {want[:4]}"
        print(f"step {step}: aggregate of {len(aggs[0])} bytes ok")
    print("interop: seeds-proto client uploaded and downloaded through spes server")


if __name__ == "__main__":
    main()
