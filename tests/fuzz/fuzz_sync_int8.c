// libFuzzer harness: hostile int8 delta payloads on both sides (the body: sync_delta_fuzz.h).
#define FUZZ_CODEC DELTA_INT8
#include "sync_delta_fuzz.h"
