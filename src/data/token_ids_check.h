// Whole-file token id check, done once when a token file is opened for training: an id
// >= vocab_size deep in the data would otherwise stop a run at the step that reaches it (and a
// resume would hit it again). A blocked max scan that the compiler vectorises: about memory
// bandwidth, the first offending position is located only inside a block that has one.
#pragma once
#include <stdint.h>

#include "io/npy.h"

// SPES_ERR naming `path`, the token offset (and byte offset) and the id of the first token
// >= vocab_size (or negative, for signed .npy dtypes). vocab_size <= 0 checks nothing.
int token_ids_check(const TokenFile *tf, const char *path, int64_t vocab_size);
