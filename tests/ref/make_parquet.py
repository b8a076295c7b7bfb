"""Writes Parquet test files with pyarrow for the C reader (tests/unit/test_documents_parquet_pyarrow.c).

usage: make_parquet.py OUTDIR

Every codec (none, snappy, gzip, zstd) x data page version (1.0, 2.0) x dictionary on/off,
plus special layouts (required column, DELTA encodings, nested column before the text,
dictionary fallback to PLAIN, all-null row group). Each file has nulls, unicode, empty
strings, several row groups and pages, and extra non-text columns; also other Arrow string
types and writer options (page index, checksums, huge values). OUTDIR/expected.json holds
"files": each file name -> its text column's non-null values in order (what the reader must
yield), and "errors": file name -> part of the error the reader must give (unsupported codecs).
"""
import json
import os
import random
import sys

import pyarrow as pa
import pyarrow.parquet as pq


def sample_texts(rng, n):
    pieces = ["hello", "world", "Grüße", "日本語のテキスト", "emoji 🎉🚀", "العربية", "ελληνικά", "tab\there",
              "new\nline", "quote \" and \\ backslash", "  padded  ", "x" * 300, "NUL\0inside"]
    texts = []
    for i in range(n):
        r = rng.random()
        if r < 0.1:
            texts.append(None)
        elif r < 0.15:
            texts.append("")
        elif r < 0.2:
            texts.append(pieces[rng.randrange(len(pieces))])   # repeats: dictionary hits
        else:
            k = rng.randrange(1, 6)
            texts.append(f"doc {i}: " + " ".join(rng.choice(pieces) for _ in range(k)))
    return texts


def table_for(texts, nullable=True):
    n = len(texts)
    fields = [pa.field("id", pa.int64()), pa.field("source", pa.string()),
              pa.field("text", pa.string(), nullable=nullable), pa.field("score", pa.float64())]
    return pa.table([pa.array(range(n), pa.int64()), pa.array([f"src{i % 3}" for i in range(n)], pa.string()),
                     pa.array(texts, pa.string()), pa.array([i * 0.5 for i in range(n)], pa.float64())],
                    schema=pa.schema(fields))


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = random.Random(1234)
    expected = {}

    def write(name, table, texts, **kw):
        pq.write_table(table, os.path.join(out, name), **kw)
        expected[name] = [t for t in texts if t is not None]

    for codec in ["none", "snappy", "gzip", "zstd"]:
        for version in ["1.0", "2.0"]:
            for dictionary in [True, False]:
                texts = sample_texts(rng, 700)
                name = f"{codec}_v{version[0]}_{'dict' if dictionary else 'plain'}.parquet"
                write(name, table_for(texts), texts, compression=codec, data_page_version=version,
                      use_dictionary=dictionary, row_group_size=250, data_page_size=2048)

    texts = [t if t is not None else "was null" for t in sample_texts(rng, 300)]
    for version in ["1.0", "2.0"]:
        write(f"required_column_v{version[0]}.parquet", table_for(texts, nullable=False), texts, compression="snappy",
              data_page_version=version, row_group_size=100)

    for enc in ["DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY"]:
        for version in ["1.0", "2.0"]:
            texts = sample_texts(rng, 500)
            write(f"{enc.lower()}_v{version[0]}.parquet", table_for(texts), texts, compression="zstd",
                  data_page_version=version, use_dictionary=False, column_encoding={"text": enc},
                  row_group_size=200, data_page_size=1024)

    # Dictionary grows past its limit mid-chunk: pages switch from RLE_DICTIONARY to PLAIN.
    texts = [f"unique text number {i} " + "y" * (i % 50) for i in range(2000)]
    write("dict_fallback.parquet", table_for(texts), texts, compression="snappy", dictionary_pagesize_limit=4096,
          row_group_size=2000)

    # A nested column before the text: the text column's leaf index is not its field index.
    texts = sample_texts(rng, 200)
    nested = pa.array([{"a": i, "b": f"n{i}"} for i in range(200)], pa.struct([("a", pa.int32()), ("b", pa.string())]))
    table = pa.table({"meta": nested, "tags": pa.array([[f"t{i}", "u"] for i in range(200)]),
                      "text": pa.array(texts, pa.string())})
    write("nested_before.parquet", table, texts, compression="gzip", row_group_size=64)

    # A row group whose text is all null, and an empty table.
    texts = [None] * 50 + ["after the nulls", "", "end"]
    for codec in ["none", "snappy", "gzip", "zstd"]:
        for version in ["1.0", "2.0"]:
            write(f"all_null_group_{codec}_v{version[0]}.parquet", table_for(texts), texts, compression=codec,
                  data_page_version=version, row_group_size=50)
    write("empty.parquet", table_for([]), [], compression="snappy")

    # Other writer options and Arrow types that land on the same physical BYTE_ARRAY column.
    texts = sample_texts(rng, 400)
    for name, arrow_type in [("large_string", pa.large_string()), ("string_view", pa.string_view()),
                             ("binary", pa.binary())]:
        values = [t.encode() if (t is not None and arrow_type == pa.binary()) else t for t in texts]
        write(f"type_{name}.parquet", pa.table({"text": pa.array(values, arrow_type)}), texts, compression="zstd",
              row_group_size=150)
    write("type_dictionary.parquet", pa.table({"text": pa.array(texts).dictionary_encode()}), texts,
          compression="snappy", row_group_size=150)
    write("page_index_crc_bloom.parquet", table_for(texts), texts, compression="snappy", write_page_index=True,
          write_page_checksum=True, row_group_size=150, data_page_size=1024)
    big = ["h" * (3 << 20), None, "after the big one", "é" * (1 << 20)]   # pages far beyond data_page_size
    write("huge_values.parquet", table_for(big), big, compression="zstd", data_page_version="2.0")

    # Files the reader must refuse with a clear message (substring of the error).
    errors = {}
    for codec, message in [("lz4", "LZ4_RAW is not supported"), ("brotli", "BROTLI is not supported")]:
        try:
            pq.write_table(table_for(texts), os.path.join(out, f"codec_{codec}.parquet"), compression=codec)
            errors[f"codec_{codec}.parquet"] = message
        except Exception:   # codec not built into this pyarrow: nothing to test
            pass

    with open(os.path.join(out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump({"files": expected, "errors": errors}, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
