// Sharded token files exactly as SPES's tokenize_data.py writes them: raw little-endian uint16
// or uint32 arrays without any header, named {prefix}{proc:03d}_{shard:06d}.npy, shards
// numbered from 1. A document is never split across shards: a new shard starts when the next
// document would take the current one past max_shard_bytes (a document bigger than that gets a
// shard of its own). Each shard is written atomically (temp file + fsync + rename).
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct TokenWriter TokenWriter;

// dtype_bytes: 2 (uint16) or 4 (uint32). The prefix's directory is created if needed.
int token_writer_open(const char *prefix, int proc, uint64_t max_shard_bytes, int dtype_bytes, TokenWriter **out);
// ids of one document (EOS included by the caller). Ids must fit the dtype.
int token_writer_add(TokenWriter *w, const uint32_t *ids, size_t n);
// Commits the last shard (if it holds anything), reports the shard count (may be NULL) and
// frees the writer.
int token_writer_close(TokenWriter *w, uint64_t *shards);
// Removes the uncommitted shard and frees the writer (after an error).
void token_writer_abort(TokenWriter *w);
uint64_t token_writer_shards(const TokenWriter *w);   // committed so far
uint64_t token_writer_tokens(const TokenWriter *w);   // written so far
