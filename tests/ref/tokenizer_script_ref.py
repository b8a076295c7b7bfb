"""`spes tokenize` against SPES's tokenize_data.py logic, run here with transformers' AutoTokenizer.

Builds inputs of every format (.jsonl with malformed / empty / null / non-string records, .json
array, .jsonl.gz, .jsonl.zst, .parquet), a tokenizer directory (gpt-neox-olmo tokenizer.json +
tokenizer_config.json naming the EOS), runs `spes tokenize` with 2 processes and a small shard
limit, and compares with the script's per-process token streams: files = sorted(glob), split by
chunk_list, each document .strip()ped (empty ones dropped), "<extra_id_1>" removed, encoded with
add_special_tokens=False, EOS appended. Differences from the script that are on purpose: no
random batch shuffle (so streams are comparable) and shards cut at document boundaries without
exceeding --max_shard_bytes (checked here: every shard ends with EOS and is within the limit
unless it holds one document). Plain .jsonl files are read line by line (the script's
first-character heuristic would json.load() a .jsonl starting with '{' and yield nothing).

usage: tokenizer_script_ref.py SPES_BIN DATA_DIR WORK_DIR
"""
import glob
import gzip
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from transformers import AutoTokenizer

MAX_SHARD_BYTES = 4000
DTYPE = "uint16"


def records(k):
    out = [{"text": f"  Document {k}.{i}: It's a test — naïve café, 数字 {i * 7919}  \n"} for i in range(40)]
    out += [{"text": "<extra_id_1>"}, {"text": " \u3000 "}, {"text": None}, {"text": 5}, {"other": "x"},
            {"text": "a<extra_id_1>b<|endoftext|>c\u2028"}, {"text": "e\u0301 combining, emoji 👍🏽 " * 30}]
    return out


def write_inputs(d):
    os.makedirs(d)
    with open(os.path.join(d, "a.jsonl"), "w", encoding="utf-8") as f:
        for r in records(0):
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
        f.write("this line is not json\n")
        f.write('{"text": "after the bad line"}\n')
    with open(os.path.join(d, "b.json"), "w", encoding="utf-8") as f:
        json.dump(records(1), f, ensure_ascii=False)
    with gzip.open(os.path.join(d, "c.jsonl.gz"), "wt", encoding="utf-8") as f:
        for r in records(2):
            f.write(json.dumps(r) + "\n")
    with pa.CompressedOutputStream(os.path.join(d, "d.jsonl.zst"), "zstd") as f:
        for r in records(3):
            f.write((json.dumps(r) + "\n").encode("utf-8"))
    texts = [r.get("text") if isinstance(r.get("text"), str) else None for r in records(4)]
    pq.write_table(pa.table({"text": pa.array(texts, pa.string())}), os.path.join(d, "e.parquet"))


def read_lines(path):
    """The script's read_lines, with the .jsonl heuristic fixed (see the module comment)."""
    def from_lines(lines):
        for line in lines:
            try:
                obj = json.loads(line)
                text = (obj.get("text") or "").strip()
                if text:
                    yield text
            except Exception:
                continue
    if path.endswith(".parquet"):
        for val in pq.read_table(path, columns=["text"])["text"].to_pylist():
            if isinstance(val, str) and val.strip():
                yield val.strip()
    elif path.endswith(".jsonl.zst"):
        with pa.CompressedInputStream(path, "zstd") as f:
            yield from from_lines(f.read().decode("utf-8").splitlines())
    elif path.endswith(".jsonl.gz"):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            yield from from_lines(f)
    elif path.endswith(".json"):
        for obj in json.load(open(path, encoding="utf-8")):
            if isinstance(obj, dict):
                try:
                    text = (obj.get("text") or "").strip()
                except AttributeError:
                    continue
                if text:
                    yield text
    else:
        with open(path, encoding="utf-8") as f:
            yield from from_lines(f)


def chunk_list(lst, n):
    k, m = divmod(len(lst), n)
    return [lst[i * k + min(i, m):(i + 1) * k + min(i + 1, m)] for i in range(n)]


def main():
    spes, data, work = sys.argv[1], sys.argv[2], sys.argv[3]
    tok_dir = os.path.join(work, "tok")
    os.makedirs(tok_dir)
    shutil.copy(os.path.join(data, "tokenizers", "gpt-neox-olmo.json"), os.path.join(tok_dir, "tokenizer.json"))
    json.dump({"eos_token": "<|endoftext|>", "bos_token": None, "tokenizer_class": "PreTrainedTokenizerFast"},
              open(os.path.join(tok_dir, "tokenizer_config.json"), "w"))
    in_dir = os.path.join(work, "in")
    write_inputs(in_dir)
    prefix = os.path.join(work, "out", "tok_")
    r = subprocess.run([spes, "tokenize", "--file_glob", os.path.join(in_dir, "*"), "--tokenizer_name_or_path", tok_dir,
                        "--output_prefix", prefix, "--processes", "2", "--max_shard_bytes", str(MAX_SHARD_BYTES),
                        "--dtype", DTYPE], capture_output=True, text=True)
    print(r.stderr)
    if r.returncode != 0:
        print("FAIL: spes tokenize exited", r.returncode)
        return 1
    ok = True
    if "a.jsonl:48: skipped" not in r.stderr:
        print("FAIL: the malformed line a.jsonl:48 was not reported")
        ok = False

    tok = AutoTokenizer.from_pretrained(tok_dir)
    eos = tok.eos_token_id
    files = sorted(glob.glob(os.path.join(in_dir, "*")))
    for proc, chunk in enumerate(chunk_list(files, 2)):
        want = []
        for path in chunk:
            for text in read_lines(path):
                want += tok.encode(text.replace("<extra_id_1>", ""), add_special_tokens=False) + [eos]
        shards = sorted(glob.glob(f"{prefix}{proc:03d}_*.npy"))
        names = [os.path.basename(s) for s in shards]
        if names != [f"tok_{proc:03d}_{i + 1:06d}.npy" for i in range(len(shards))]:
            print(f"FAIL: process {proc}: shard names {names}")
            ok = False
        got = []
        for s in shards:
            a = np.fromfile(s, dtype="<u2").tolist()
            if a[-1] != eos or (len(a) * 2 > MAX_SHARD_BYTES and a.count(eos) > 1):
                print(f"FAIL: {s}: {len(a)} tokens; ends with {a[-1]} (EOS {eos}); a document split or limit exceeded")
                ok = False
            got += a
        if got != want:
            i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), min(len(got), len(want)))
            print(f"FAIL: process {proc}: token streams differ at {i} (ours {len(got)}, script {len(want)})")
            ok = False
        else:
            print(f"ok   process {proc}: {len(chunk)} files, {len(shards)} shards, {len(got)} tokens identical to the script's")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
