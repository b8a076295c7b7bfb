// Causal attention of n new query positions against a key/value cache (GQA): the one kernel
// the incremental (KV-cache) forward needs beyond src/ops/ops.h, whose attention op takes
// queries and keys of the same length. Same maths as op_attention_forward: scores scaled by
// 1/sqrt(hd), softmax in fp32 with the running max subtracted.
#pragma once
#include <stddef.h>

// q[n, nh, hd]: queries at absolute positions past..past+n-1.
// k, v[past+n, nkv, hd]: the cache, already holding the n new positions.
// out[n, nh, hd]. Query head h reads kv head h / (nh / nkv); position i sees keys 0..past+i.
// scratch: kv_attention_scratch_floats(past + n) floats (one scores row per thread).
void kv_attention_forward(float *out, const float *q, const float *k, const float *v, int n, int past, int nh,
                          int nkv, int hd, float *scratch);
size_t kv_attention_scratch_floats(int max_positions);
