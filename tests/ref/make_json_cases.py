"""Random and corrupted JSON lines with the outcome Python's json module gives each.

usage: make_json_cases.py OUTDIR [N]

Writes OUTDIR/cases.jsonl (N lines of bytes) and OUTDIR/expected.json: a list with, for
each non-blank line, the "text" field's string, or null when the line is malformed
(invalid UTF-8, json.loads raises, not an object, field missing or not a string, or a lone
surrogate that cannot be UTF-8 encoded). NaN/Infinity literals are malformed here too
(see src/documents/json_field.h). The C test reads cases.jsonl through doc_reader and compares.
"""
import json
import os
import random
import sys

PIECES = ["plain", "ü", "日本", "🎉", "\u2028", "\x00", "\x1f", "\"", "\\", "/", "\t", "\n", "\ud83d", "\ude00",
          "\ud83d\ude00", "e\u0301", " ", "{", "}", "[", "]", ",", ":"]


def rand_string(rng):
    return "".join(rng.choice(PIECES) if rng.random() < 0.3 else chr(rng.randrange(32, 127)) for _ in range(rng.randrange(0, 12)))


def rand_value(rng, depth=0):
    r = rng.random()
    if depth > 3 or r < 0.3:
        return rand_string(rng)
    if r < 0.4:
        return rng.choice([0, -1, 1.5, 1e300, -2.5e-7, 10**30, True, False, None])
    if r < 0.7:
        return [rand_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))]
    return {rand_string(rng): rand_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))}


def encode(obj, rng):
    """json.dumps with random spacing and ASCII/UTF-8 choice, as bytes (surrogates escaped)."""
    text = json.dumps(obj, ensure_ascii=rng.random() < 0.5, separators=rng.choice([(",", ":"), (", ", ": ")]))
    return text.encode("utf-8", "surrogatepass") if rng.random() < 0.1 else text.encode("utf-8", "backslashreplace")


def mutate(b, rng):
    b = bytearray(b)
    for _ in range(rng.randrange(1, 3)):
        kind = rng.randrange(4)
        at = rng.randrange(len(b) + 1)
        if kind == 0 and b:
            del b[min(at, len(b) - 1)]
        elif kind == 1:
            b[at:at] = bytes([rng.choice(b'{}[]",:\\u0aZ \x01\x7f\x80\xc3\xe2\xf0\xed\xa0\xff')])
        elif kind == 2:
            b = b[:at]
        else:
            b[at:at] = rng.choice([b"\\u00e9", b"\\ud800", b"\\udc00x", b"\\u12", b"NaN", b"1e5", b"-", b"01", b"\xc3\xa9"])
    return bytes(b).replace(b"\n", b"").replace(b"\r", b"")


def expected(line):
    def reject_constant(name):
        raise ValueError(name)
    try:
        obj = json.loads(line.decode("utf-8"), parse_constant=reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("text", 0), str):
        return None
    try:
        obj["text"].encode("utf-8")
    except UnicodeEncodeError:
        return None
    return obj["text"]


def main():
    out = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    rng = random.Random(7)
    os.makedirs(out, exist_ok=True)
    lines = []
    for i in range(n):
        obj = {rand_string(rng): rand_value(rng) for _ in range(rng.randrange(0, 3))}
        obj["text"] = rand_string(rng) if rng.random() < 0.85 else rand_value(rng)
        if rng.random() < 0.1:
            obj = {"other": 1, **obj}
        b = encode(obj, rng)
        if rng.random() < 0.05:
            b = b.replace(b'"text"', b'"te\\u0078t"')   # an escaped key still names the field
        if rng.random() < 0.05:
            b = b[:-1] + b', "text": "dup"}'            # a repeated key: the last wins
        if rng.random() < 0.4:
            b = mutate(b, rng)
        lines.append(b)
    lines += [b"", b"[1, 2]", b'"text"', b'{"text": "a"} x', b'{"text": "\\u0000"}', b" " * 3 + b'{"text":"ws"}' + b" \t",
              b'{"a": ' * 600 + b"1" + b"}" * 600, b'{"text": "x", "deep": ' + b"[" * 400 + b"]" * 400 + b"}"]
    with open(os.path.join(out, "cases.jsonl"), "wb") as f:
        f.write(b"\n".join(lines) + b"\n")
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump([expected(b) for b in lines if b.strip(b" \t")], f)


if __name__ == "__main__":
    main()
