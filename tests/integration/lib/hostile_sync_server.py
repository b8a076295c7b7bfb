#!/usr/bin/env python3
"""A hostile or broken parameter server for ONE real `spes train` peer (num_peers 1, so the
peer uploads every tensor and an honest aggregate is its own upload echoed back).
Usage: hostile_sync_server.py DESCRIPTOR_SET MODE   (prints "listening on PORT" once it serves)

It answers Hello / UploadChunk / WaitAggregate / DownloadChunk / Status; MODE breaks one thing:
  honest            the upload echoed back (F32 runs whole; int8 runs the delta against the base),
                    stating the step asked for (spes_step, as `spes server` does)
  other_step        the honest aggregate, stating another step (spes_step = the step asked + 10)
  nan | huge_value  one value of the first tensor NaN | 1e30
  wrong_shape | wrong_dtype | missing_tensor | extra_tensor    the aggregate's tensor list
  huge_total        WaitAggregate announces 2^40 bytes
  many_chunks       WaitAggregate announces 2^31-1 chunks (the right byte count)
  overrun | truncated   the chunks hold more | fewer bytes than announced
  int8_nan_scale | int8_huge_scale | int8_wrong_len | int8_wrong_base   the int8 delta served
  hello_fingerprint Hello answers another model's fingerprint
  hello_chunk_tiny  Hello answers chunk_size 1 (a peer that follows it sends 1-byte messages)
  silent            TCP accepted, never answered
  stall_upload      the upload stream is read and never answered
  stall_upload_read the upload's first message is read, then nothing more (the stream stalls)
  deadline_upload   the upload fails DEADLINE_EXCEEDED at once, as `spes server` ends a call whose
                    peer made no progress within its --idle_timeout_seconds
  stall_download    DownloadChunk never answers
  error_<call>      <call> (hello, upload, wait, download) fails INTERNAL
  unavailable_wait  WaitAggregate fails UNAVAILABLE (clients retry, then give up)
"""
import json
import math
import struct
import sys
import threading
import time

import grpc

from fake_server import messages, serve, silent

BIG = 1 << 40


def st_parse(b):
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]


def st_build(header, data):
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def tensor_names(header):
    return sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])


def rebuild(header, data, drop=(), add=None):
    """The safetensors image with tensors `drop` left out and (name, entry, bytes) `add` appended."""
    out_h, out_d = {}, b""
    if "__metadata__" in header:
        out_h["__metadata__"] = header["__metadata__"]
    for k in tensor_names(header):
        if k in drop:
            continue
        a, e = header[k]["data_offsets"]
        out_h[k] = dict(header[k], data_offsets=[len(out_d), len(out_d) + e - a])
        out_d += data[a:e]
    if add:
        name, entry, raw = add
        out_h[name] = dict(entry, data_offsets=[len(out_d), len(out_d) + len(raw)])
        out_d += raw
    return st_build(out_h, out_d)


def stamp(payload, step):
    """The payload with spes_step = step in its __metadata__ (what `spes server` writes)."""
    h, d = st_parse(payload)
    h["__metadata__"] = dict(h.get("__metadata__", {}), spes_step=str(step))
    return st_build(h, d)


def poke_f32(header, data, name, value):
    a = header[name]["data_offsets"][0]
    return data[:a] + struct.pack("<f", value) + data[a + 4:]


def corrupt(mode, payload):
    """The aggregate this mode serves for an upload `payload` (F32 tensors, or an int8 delta)."""
    h, d = st_parse(payload)
    names = tensor_names(h)
    first = next(k for k in names if not k.endswith(".scale"))
    if mode == "nan":
        return st_build(h, poke_f32(h, d, first, math.nan))
    if mode == "huge_value":
        return st_build(h, poke_f32(h, d, first, 1e30))
    if mode == "wrong_shape":   # the same bytes, the dimensions swapped
        shape = h[first]["shape"]
        h[first]["shape"] = list(reversed(shape)) if shape != list(reversed(shape)) else [1] + shape
        return st_build(h, d)
    if mode == "wrong_dtype":
        h[first]["dtype"] = "I32"
        return st_build(h, d)
    if mode == "missing_tensor":
        return rebuild(h, d, drop=(first,))
    if mode == "extra_tensor":
        return rebuild(h, d, add=("model.bogus.weight", {"dtype": "F32", "shape": [4]}, b"\0" * 16))
    if mode in ("int8_nan_scale", "int8_huge_scale"):   # the first block's scale, and its first code 127
        d = poke_f32(h, d, first + ".scale", math.nan if mode == "int8_nan_scale" else 1e29)
        a = h[first]["data_offsets"][0]
        return st_build(h, d[:a] + b"\x7f" + d[a + 1:])
    if mode == "int8_wrong_len":   # the codes of one tensor one value short (shape kept)
        a, e = h[first]["data_offsets"]
        return rebuild(h, d, drop=(first,), add=(first, dict(h[first], shape=[e - a - 1]), d[a:e - 1]))
    if mode == "int8_wrong_base":   # a delta against an aggregate the peer does not hold
        h["__metadata__"] = dict(h["__metadata__"], spes_base_step=str(int(h["__metadata__"]["spes_base_step"]) + 100))
        return st_build(h, d)
    return payload


def main():
    desc, mode = sys.argv[1], sys.argv[2]
    if mode == "silent":
        silent()
    M = messages(desc)
    lock = threading.Lock()
    state = {"chunk": 1 << 16, "uploads": {}, "agg": {}, "last": -1, "int8": False}

    def fail(context, call):
        if mode == "error_" + call:
            context.abort(grpc.StatusCode.INTERNAL, "hostile server: %s broken on purpose" % call)

    def hello(req, context):
        fail(context, "hello")
        state["int8"] = req.payload_dtype == "I8"
        r = M["HelloResponse"](fingerprint=req.fingerprint, chunk_size=state["chunk"], max_message_size=64 << 20,
                               last_completed_step=state["last"])
        if state["int8"]:
            r.encodings.append("int8-delta")
        if mode == "hello_fingerprint":
            r.fingerprint = req.fingerprint ^ 0x5A5A
        if mode == "hello_chunk_tiny":
            r.chunk_size = 1
        return r

    def upload(it, context):
        if mode == "stall_upload_read":
            next(it)
            time.sleep(3600)
        if mode == "deadline_upload":
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "no progress within the idle timeout")
        parts, step = [], None
        for m in it:
            step = m.step
            parts.append(m.chunk_data)
        if mode == "stall_upload":
            time.sleep(3600)
        fail(context, "upload")
        payload = b"".join(parts)
        h, _ = st_parse(payload)
        delta = h.get("__metadata__", {}).get("spes_encoding") is not None
        with lock:
            # The whole aggregate (kept as the base) is the F32 upload; a delta upload is the
            # int8 view against the peer's base, and the whole one stays the last F32 image.
            # int8 modes break the delta view, the others the whole aggregate.
            broken = corrupt(mode, payload) if delta == mode.startswith("int8") else payload
            state["agg"][step] = {"whole": state["agg"][state["last"]]["whole"] if delta else broken,
                                  "delta": broken if delta else None}
            state["last"] = max(state["last"], step)
        return M["UploadChunkResponse"](success=True)

    def view_of(req):
        a = state["agg"].get(req.step)
        if a is None:
            return None, ""
        data, view = (a["delta"], "int8-delta") if req.has_delta_base and a["delta"] is not None else (a["whole"], "")
        if mode in ("honest", "other_step"):
            data = stamp(data, req.step + (10 if mode == "other_step" else 0))
        return data, view

    def wait(req, context):
        fail(context, "wait")
        if mode == "unavailable_wait":
            context.abort(grpc.StatusCode.UNAVAILABLE, "hostile server: not now")
        with lock:
            data, view = view_of(req)
        r = M["WaitAggregateResponse"](last_completed_step=state["last"])
        if data is None:
            time.sleep(min(req.timeout_ms / 1000.0, 1.0))
            return r
        r.ready, r.view = True, view
        r.total_bytes = len(data)
        r.total_chunks = max(1, -(-len(data) // state["chunk"]))
        if mode == "huge_total":
            r.total_bytes = BIG
            r.total_chunks = BIG // state["chunk"]
        if mode == "many_chunks":
            r.total_chunks = 2**31 - 1
        if mode == "truncated":
            r.total_bytes = len(data) + 1000
        return r

    def download(req, context):
        fail(context, "download")
        if mode == "stall_download":
            time.sleep(3600)
        with lock:
            data, _ = view_of(req)
        if data is None:
            return M["DownloadChunkResponse"](ready=False)
        c = state["chunk"]
        n = max(1, -(-len(data) // c))
        chunk = data[req.chunk_id * c:(req.chunk_id + 1) * c]
        if mode == "overrun" and req.chunk_id == n - 1:
            chunk += b"\0" * 5000
        if mode == "many_chunks":   # empty chunks up to the 2^31-1 announced
            n = 2**31 - 1
        return M["DownloadChunkResponse"](chunk_data=chunk, ready=True, last_chunk=req.chunk_id >= n - 1)

    def status(req, context):
        return M["StatusResponse"](rounds_completed=len(state["agg"]), open_step=-1, last_aggregate_step=state["last"],
                                   total_peers=1, mode="spes", last_round_peers=1)

    def unary(fn, req, resp):
        return grpc.unary_unary_rpc_method_handler(fn, request_deserializer=M[req].FromString,
                                                   response_serializer=M[resp].SerializeToString)

    handler = grpc.method_handlers_generic_handler("FederatedServer", {
        "Hello": unary(hello, "HelloRequest", "HelloResponse"),
        "WaitAggregate": unary(wait, "WaitAggregateRequest", "WaitAggregateResponse"),
        "DownloadChunk": unary(download, "DownloadChunkRequest", "DownloadChunkResponse"),
        "Status": unary(status, "StatusRequest", "StatusResponse"),
        "UploadChunk": grpc.stream_unary_rpc_method_handler(
            upload, request_deserializer=M["UploadChunkRequest"].FromString,
            response_serializer=M["UploadChunkResponse"].SerializeToString),
    })
    options = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
    if mode == "stall_upload_read":   # a stream window that stays small: what is not read is not taken
        options += [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1)]
    serve(handler, 16, options)


if __name__ == "__main__":
    main()
