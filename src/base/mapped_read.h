// Reading a file mapping that may shrink under us. A mapped file cut shorter by someone else
// (`cp` or a re-tokenize over a data file, `truncate`) makes every read of a page past its new
// end raise SIGBUS, which kills the process (np.memmap in the reference dies the same way) and
// loses what was trained since the last checkpoint. mapped_read runs a read of mapped memory with
// SIGBUS caught for the calling thread, so it becomes an error the caller can name.
#pragma once
#include <stdbool.h>

// Runs read(ctx) and returns what it returns; if it touches a page that is no longer backed by
// the file, it is stopped there, *truncated is set and SPES_ERR returned (no message: the
// caller knows which file). SIGBUS outside mapped_read keeps its default action.
int mapped_read(int (*read)(void *ctx), void *ctx, bool *truncated);
