// Token-file dataset: many token files cut into instances of exactly seq_len tokens, the way
// OLMo's MemMapDataset cuts them: file f holds floor(tokens_f / seq_len) instances (the
// remainder is dropped), and the global instance index runs over the files in order.
//
// Files are raw little-endian arrays of data.memmap_dtype (what SPES's tokenize_data.py
// writes, named .npy but without a header) or true .npy files (\x93NUMPY header: its dtype
// wins over memmap_dtype; see src/io/npy.h). A path ending in .txt is a manifest: one token-file path a
// line (blank lines and lines starting with # skipped). Relative paths, in the config and in
// manifests, resolve against the current directory (OLMo's behaviour).
//
// Opening maps every file read-only and checks: missing / empty / truncated (size not a
// multiple of the token size) files, non-regular files (a FIFO would block forever),
// malformed .npy headers, files shorter than one instance (an error naming the file: OLMo
// silently skips them, which hides mistakes), manifest lines that are not printable paths,
// an empty dataset, and every token id against vocab_size (token_ids_check.h: one vectorised
// pass over each file, ~4 ms per 100 MB from the page cache), so a bad id deep in the data
// stops the run at start, naming file, token and byte offset, not at the step that reaches it.
// token_dataset_get checks the ids it converts again (the files may change under the mapping).
#pragma once
#include <stdint.h>

#include "config/config.h"

typedef struct TokenDataset TokenDataset;

// paths may contain .txt manifests. vocab_size <= 0 disables the id check.
int token_dataset_open(char *const *paths, int n_paths, MemmapDtype dtype, int seq_len, int vocab_size,
                       TokenDataset **out);
void token_dataset_close(TokenDataset *ds);

int64_t token_dataset_len(const TokenDataset *ds);       // instances over all files
int token_dataset_seq_len(const TokenDataset *ds);
int token_dataset_num_files(const TokenDataset *ds);     // after manifest expansion
const char *token_dataset_file_path(const TokenDataset *ds, int file);
int64_t token_dataset_file_instances(const TokenDataset *ds, int file);

// Instance `index` (0 <= index < len) as int32 token ids into tokens[seq_len].
int token_dataset_get(const TokenDataset *ds, int64_t index, int32_t *tokens);
