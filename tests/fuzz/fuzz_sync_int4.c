// libFuzzer harness: hostile int4 delta payloads on both sides (the body: sync_delta_fuzz.h).
#define FUZZ_CODEC DELTA_INT4
#include "sync_delta_fuzz.h"
