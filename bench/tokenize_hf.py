"""HF tokenizers throughput on the same documents as bench/tokenize.c: FILE split on blank lines
("\\n\\n"), encode_batch without special tokens, in chunks of 1000 documents (results dropped, so
memory stays flat). Threads: RAYON_NUM_THREADS from the environment (1 = the per-core figure).

usage: tokenize_hf.py TOKENIZER FILE
"""
import os
import sys
import time

from tokenizers import Tokenizer


def main():
    tok = Tokenizer.from_file(sys.argv[1])
    text = open(sys.argv[2], encoding="utf-8", newline="").read()
    docs = [d for d in text.split("\n\n") if d]
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    tokens = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(0, len(docs), 1000):
        tokens += sum(len(e.ids) for e in tok.encode_batch(docs[i:i + 1000], add_special_tokens=False))
    secs, cpu = time.perf_counter() - t0, time.process_time() - c0   # CPU: all threads of the process
    threads = os.environ.get("RAYON_NUM_THREADS", "all")
    print(f"hf: {nbytes / 1e6:.1f} MB in {len(docs)} docs, {tokens} tokens, {threads} thread(s), {secs:.2f}s ({cpu:.2f} CPU s): "
          f"mb_s={nbytes / 1e6 / secs:.2f} mb_cpu_s={nbytes / 1e6 / cpu:.2f} tokens={tokens}")


if __name__ == "__main__":
    main()
