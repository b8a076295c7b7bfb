// Aggregation maths on crafted tensors: means, ownership, fedavg, alpha schedule, cosine
// neighbours, merge values, bf16 in and out, determinism across thread counts, expert rotation,
// expert replicas (several owners per expert).
#include <math.h>
#include <omp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/error.h"
#include "server/aggregate.h"

// Experts 0..E-1 of layer l, each gate and up [gate], down [down], in that order.
static void add_layer_experts(ModelSpec *spec, int l, int E, const int64_t *gate, const int64_t *down) {
    static const char *proj[3] = {"gate", "up", "down"};
    for (int e = 0; e < E; e++)
        for (int p = 0; p < 3; p++) {
            char name[128];
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s_proj.weight", l, e, proj[p]);
            assert_int_equal(model_spec_add(spec, name, DTYPE_F32, 2, p == 2 ? down : gate), SPES_OK);
        }
}

// out[t]: where tensor t lies in buf, the spec's tensors laid end to end at elem bytes a value.
static uint8_t **carve_outputs(const ModelSpec *spec, uint8_t *buf, size_t elem) {
    uint8_t **out = calloc((unsigned)spec->count, sizeof *out);
    size_t at = 0;
    for (int t = 0; t < spec->count; t++) {
        out[t] = buf + at;
        at += spec->tensors[t].numel * elem;
    }
    return out;
}

// A tiny MoE: embed [6,4]; per layer (2 layers) router [E,4] and E experts with
// gate [3,4], up [3,4], down [4,3]; lm_head [6,4].
static void build_spec(ModelSpec *spec, int E) {
    model_spec_init(spec);
    int64_t embed[2] = {6, 4}, router[2] = {E, 4}, gate[2] = {3, 4}, down[2] = {4, 3};
    assert_int_equal(model_spec_add(spec, "model.embed_tokens.weight", DTYPE_F32, 2, embed), SPES_OK);
    for (int l = 0; l < 2; l++) {
        char name[128];
        snprintf(name, sizeof name, "model.layers.%d.mlp.gate.weight", l);
        assert_int_equal(model_spec_add(spec, name, DTYPE_F32, 2, router), SPES_OK);
        add_layer_experts(spec, l, E, gate, down);
    }
    assert_int_equal(model_spec_add(spec, "lm_head.weight", DTYPE_F32, 2, embed), SPES_OK);
    assert_int_equal(model_spec_finish(spec), SPES_OK);
}

// P peers' uploads as F32 (or BF16) tensors; values from fill(peer, tensor, index).
typedef struct {
    int P, count;
    StTensor *tensors;          // [P][count]
    const StTensor **rows;      // [P][count], NULL where the peer does not send
    uint8_t **data;
} Uploads;

typedef float (*FillFn)(int peer, int t, size_t i);

__attribute__((noinline)) static void make_uploads(Uploads *u, const ModelSpec *spec, const AggregateConfig *cfg, DType dtype, FillFn fill) {
    u->P = cfg->num_peers;
    u->count = spec->count;
    size_t n = (size_t)u->P * spec->count;
    u->tensors = calloc(n, sizeof(StTensor));
    u->rows = calloc(n, sizeof(StTensor *));
    u->data = calloc(n, sizeof(uint8_t *));
    for (int p = 0; p < u->P; p++)
        for (int t = 0; t < spec->count; t++) {
            if (!model_spec_peer_sends(spec, cfg->mode, cfg->experts_per_node, p, t)) continue;
            const SpecTensor *st = &spec->tensors[t];
            size_t k = (size_t)p * spec->count + t;
            StTensor *x = &u->tensors[k];
            x->name = st->name;
            x->dtype = dtype;
            x->ndim = st->ndim;
            memcpy(x->shape, st->shape, sizeof x->shape);
            x->numel = st->numel;
            x->nbytes = st->numel * dtype_size(dtype);
            u->data[k] = malloc(x->nbytes + 1);
            for (size_t i = 0; i < st->numel; i++) {
                float v = fill(p, t, i);
                if (dtype == DTYPE_F32) memcpy(u->data[k] + 4 * i, &v, 4);
                else {
                    uint16_t b = f32_to_bf16(v);
                    memcpy(u->data[k] + 2 * i, &b, 2);
                }
            }
            x->data = u->data[k];
            u->rows[k] = x;
        }
}

static void free_uploads(Uploads *u) {
    for (int i = 0; i < u->P * u->count; i++) free(u->data[i]);
    free(u->data);
    free(u->rows);
    free(u->tensors);
}

// Output buffers, one float array per tensor, laid end to end.
static float *run_aggregate(const ModelSpec *spec, const AggregateConfig *cfg, int step, const Uploads *u,
                            uint8_t ***outs) {
    float *all = calloc(spec->total_numel, sizeof(float));
    *outs = carve_outputs(spec, (uint8_t *)all, sizeof(float));
    assert_int_equal(aggregate_compute(spec, cfg, step, u->rows, *outs, DTYPE_F32), SPES_OK);
    return all;
}

static float upload_value(const Uploads *u, int p, int t, size_t i) {
    const StTensor *x = u->rows[(size_t)p * u->count + t];
    assert_non_null(x);
    if (x->dtype == DTYPE_F32) {
        float v;
        memcpy(&v, x->data + 4 * i, 4);
        return v;
    }
    uint16_t b;
    memcpy(&b, x->data + 2 * i, 2);
    return bf16_to_f32(b);
}

static float fill_distinct(int peer, int t, size_t i) { return (float)(peer * 1000 + t * 10) + 0.25f * (float)i; }

static AggregateConfig base_config(SyncMode mode, int P, int m) {
    AggregateConfig cfg = {.mode = mode, .num_peers = P, .experts_per_node = m, .merge_interval = 0,
                           .merge_alpha_start = 0.0f, .merge_decay_steps = 100, .merge_topk = 4};
    return cfg;
}

static void test_shared_mean_and_owner_experts(void **state) {
    (void)state;
    ModelSpec spec;
    build_spec(&spec, 4);
    AggregateConfig cfg = base_config(SYNC_MODE_SPES, 2, 2);
    Uploads u;
    make_uploads(&u, &spec, &cfg, DTYPE_F32, fill_distinct);
    uint8_t **outs;
    float *all = run_aggregate(&spec, &cfg, 10, &u, &outs);
    for (int t = 0; t < spec.count; t++) {
        const float *o = (const float *)outs[t];
        int e = spec.tensors[t].expert;
        for (size_t i = 0; i < spec.tensors[t].numel; i++) {
            float want =
                e < 0 ? (upload_value(&u, 0, t, i) + upload_value(&u, 1, t, i)) / 2.0f : upload_value(&u, e / 2, t, i);
            assert_true(o[i] == want);
        }
    }
    free(all);
    free(outs);
    free_uploads(&u);
    model_spec_free(&spec);
}

static void test_fedavg_averages_every_tensor(void **state) {
    (void)state;
    ModelSpec spec;
    build_spec(&spec, 4);
    AggregateConfig cfg = base_config(SYNC_MODE_FEDAVG, 3, 0);
    Uploads u;
    make_uploads(&u, &spec, &cfg, DTYPE_F32, fill_distinct);
    uint8_t **outs;
    float *all = run_aggregate(&spec, &cfg, 7, &u, &outs);
    for (int t = 0; t < spec.count; t++)
        for (size_t i = 0; i < spec.tensors[t].numel; i++) {
            float want = ((upload_value(&u, 0, t, i) + upload_value(&u, 1, t, i)) + upload_value(&u, 2, t, i)) / 3.0f;
            assert_true(((const float *)outs[t])[i] == want);
        }
    free(all);
    free(outs);
    free_uploads(&u);
    model_spec_free(&spec);
}

// A partial round: P = 3, m = 1 (E = 3); peer 1 missing. Shared tensors are the mean of peers
// 0 and 2 only; expert 1 keeps the previous aggregate's value; experts 0 and 2 their owners'.
// With everyone present the partial function equals aggregate_compute bit for bit; a missing
// owner without a previous value is refused.
static void test_partial_round(void **state) {
    (void)state;
    ModelSpec spec;
    build_spec(&spec, 3);
    AggregateConfig cfg = base_config(SYNC_MODE_SPES, 3, 1);
    Uploads u, prev;
    make_uploads(&u, &spec, &cfg, DTYPE_F32, fill_distinct);
    AggregateConfig one = base_config(SYNC_MODE_FEDAVG, 1, 0);   // a full-model tensor set as "previous"
    make_uploads(&prev, &spec, &one, DTYPE_F32, fill_distinct);
    for (int t = 0; t < spec.count; t++)   // previous values: -(peer 0's fill), distinct from every upload
        for (size_t i = 0; i < spec.tensors[t].numel; i++) {
            float v = -fill_distinct(0, t, i) - 1.0f;
            memcpy(prev.data[t] + 4 * i, &v, 4);
        }
    float *all = calloc(spec.total_numel, sizeof(float));
    uint8_t **outs = carve_outputs(&spec, (uint8_t *)all, sizeof(float));
    bool present[3] = {true, false, true};
    assert_int_equal(aggregate_compute_partial(&spec, &cfg, 10, u.rows, present, prev.rows, outs, DTYPE_F32), SPES_OK);
    for (int t = 0; t < spec.count; t++) {
        int e = spec.tensors[t].expert;
        for (size_t i = 0; i < spec.tensors[t].numel; i++) {
            float want = e < 0    ? (upload_value(&u, 0, t, i) + upload_value(&u, 2, t, i)) / 2.0f
                         : e == 1 ? upload_value(&prev, 0, t, i)
                                  : upload_value(&u, e, t, i);
            assert_true(((const float *)outs[t])[i] == want);
        }
    }
    // Everyone present: identical to the full aggregate.
    uint8_t **full;
    float *full_all = run_aggregate(&spec, &cfg, 10, &u, &full);
    bool everyone[3] = {true, true, true};
    assert_int_equal(aggregate_compute_partial(&spec, &cfg, 10, u.rows, everyone, NULL, outs, DTYPE_F32), SPES_OK);
    assert_memory_equal(all, full_all, spec.total_numel * sizeof(float));
    // A missing owner needs a previous value; nobody present is refused too.
    assert_int_equal(aggregate_compute_partial(&spec, &cfg, 10, u.rows, present, NULL, outs, DTYPE_F32), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "previous"));
    bool nobody[3] = {false, false, false};
    assert_int_equal(aggregate_compute_partial(&spec, &cfg, 10, u.rows, nobody, prev.rows, outs, DTYPE_F32), SPES_ERR);
    free(full_all);
    free(full);
    free(all);
    free(outs);
    free_uploads(&u);
    free_uploads(&prev);
    model_spec_free(&spec);
}

static void test_alpha_schedule(void **state) {
    (void)state;
    AggregateConfig cfg = base_config(SYNC_MODE_SPES, 4, 2);
    cfg.merge_interval = 10;
    cfg.merge_alpha_start = 0.5f;
    cfg.merge_decay_steps = 100;
    assert_float_equal(aggregate_merge_alpha(&cfg, 0), 0.5f, 1e-7);
    assert_float_equal(aggregate_merge_alpha(&cfg, 10), 0.45f, 1e-7);
    assert_float_equal(aggregate_merge_alpha(&cfg, 50), 0.25f, 1e-7);
    assert_float_equal(aggregate_merge_alpha(&cfg, 5), 0.0f, 0);      // not a merge step
    assert_float_equal(aggregate_merge_alpha(&cfg, 100), 0.0f, 0);    // fully decayed
    assert_float_equal(aggregate_merge_alpha(&cfg, 300), 0.0f, 0);
    cfg.merge_decay_steps = 0;                                        // no decay
    assert_float_equal(aggregate_merge_alpha(&cfg, 300), 0.5f, 1e-7);
    cfg.merge_interval = 0;                                           // merging off
    assert_float_equal(aggregate_merge_alpha(&cfg, 300), 0.0f, 0);
}

static void test_neighbours_order_and_ties(void **state) {
    (void)state;
    // cos row 0: [1, .9, .5, .9, -1] -> N_0 = 1, 3 (tie, lower first), 2, 4.
    double cos[25] = {0};
    double row0[5] = {1, 0.9, 0.5, 0.9, -1};
    for (int j = 0; j < 5; j++) cos[j] = cos[j * 5] = row0[j];
    for (int i = 1; i < 5; i++) cos[i * 5 + i] = 1;
    int nbr[5 * 4];
    aggregate_expert_neighbours(cos, 5, 4, nbr);
    assert_int_equal(nbr[0], 1);
    assert_int_equal(nbr[1], 3);
    assert_int_equal(nbr[2], 2);
    assert_int_equal(nbr[3], 4);
    // Row 2: cos to 0 is 0.5, to everyone else 0 -> 0 first, then 1, 3, 4 by index.
    assert_int_equal(nbr[8], 0);
    assert_int_equal(nbr[9], 1);
    assert_int_equal(nbr[10], 3);
    assert_int_equal(nbr[11], 4);
    // k = 2 keeps only the top two.
    int top2[5 * 2];
    aggregate_expert_neighbours(cos, 5, 2, top2);
    assert_int_equal(top2[0], 1);
    assert_int_equal(top2[1], 3);
}

// Gate vectors (12 values) with known cosines: e0 = x, e1 = x + y (cos 1/sqrt2 to e0),
// e2 = z, e3 = -x. The up/down values are arbitrary per expert.
static float fill_merge(int peer, int t, size_t i) {
    (void)peer;
    // Tensor layout of build_spec with E = 4: embed 0, then per layer 1 router + 12 expert tensors.
    int rel = (t - 1) % 13 - 1;                // -1 router, else expert*3 + proj
    if (t == 0 || t == 27 || rel < 0) return 0.1f * (float)i;
    int e = rel / 3, proj = rel % 3;
    if (proj != EXPERT_PROJ_GATE) return (float)(e + 1) * 0.5f + 0.01f * (float)i + (float)proj;
    float x = i == 0 ? 1.0f : 0.0f, y = i == 1 ? 1.0f : 0.0f, z = i == 2 ? 1.0f : 0.0f;
    switch (e) {
    case 0: return x;
    case 1: return x + y;
    case 2: return z;
    default: return -x;
    }
}

static void test_cosines_of_crafted_gates(void **state) {
    (void)state;
    ModelSpec spec;
    build_spec(&spec, 4);
    AggregateConfig cfg = base_config(SYNC_MODE_SPES, 4, 1);
    Uploads u;
    make_uploads(&u, &spec, &cfg, DTYPE_F32, fill_merge);
    double cos[16];
    assert_int_equal(aggregate_expert_cosines(&spec, &cfg, u.rows, 1, cos), SPES_OK);
    assert_float_equal(cos[0 * 4 + 1], 1.0 / sqrt(2.0), 1e-12);
    assert_float_equal(cos[0 * 4 + 2], 0.0, 1e-12);
    assert_float_equal(cos[0 * 4 + 3], -1.0, 1e-12);
    assert_float_equal(cos[1 * 4 + 3], -1.0 / sqrt(2.0), 1e-12);
    assert_float_equal(cos[3 * 4 + 1], -1.0 / sqrt(2.0), 1e-12);
    free_uploads(&u);
    model_spec_free(&spec);
}

static void test_merge_uses_known_neighbours(void **state) {
    (void)state;
    ModelSpec spec;
    build_spec(&spec, 4);
    AggregateConfig cfg = base_config(SYNC_MODE_SPES, 4, 1);
    cfg.merge_interval = 10;
    cfg.merge_alpha_start = 0.5f;
    cfg.merge_decay_steps = 100;
    cfg.merge_topk = 2;
    Uploads u;
    make_uploads(&u, &spec, &cfg, DTYPE_F32, fill_merge);
    uint8_t **outs;
    float *all = run_aggregate(&spec, &cfg, 20, &u, &outs);
    float alpha = 0.5f * (1.0f - 0.2f);
    // By hand from the cosines above (top 2, ties to the lower index):
    // N_0 = {1, 2} (.707, 0), N_1 = {0, 2} (.707, 0), N_2 = {0, 1} (0, 0 tie), N_3 = {2, 1} (0, -.707).
    const int N[4][2] = {{1, 2}, {0, 2}, {0, 1}, {2, 1}};
    for (int l = 0; l < 2; l++)
        for (int e = 0; e < 4; e++)
            for (int p = 0; p < 3; p++) {
                int t = 1 + l * 13 + 1 + e * 3 + p;
                assert_int_equal(spec.tensors[t].expert, e);
                for (size_t i = 0; i < spec.tensors[t].numel; i++) {
                    float self = upload_value(&u, e, t, i);
                    float a = upload_value(&u, N[e][0], t + 3 * (N[e][0] - e), i);
                    float b = upload_value(&u, N[e][1], t + 3 * (N[e][1] - e), i);
                    float want = self + alpha * (((a - self) + (b - self)) / 2.0f);
                    assert_float_equal(((const float *)outs[t])[i], want, 1e-6);
                }
            }
    // Shared tensors are still means, untouched by the merge.
    for (size_t i = 0; i < spec.tensors[0].numel; i++)
        assert_float_equal(((const float *)outs[0])[i], 0.1f * (float)i, 1e-6);
    // A non-merge step copies the owners' experts unchanged.
    free(all);
    free(outs);
    all = run_aggregate(&spec, &cfg, 25, &u, &outs);
    int t = 1 + 13 + 1 + 2 * 3;   // layer 1, expert 2, gate
    for (size_t i = 0; i < spec.tensors[t].numel; i++)
        assert_true(((const float *)outs[t])[i] == upload_value(&u, 2, t, i));
    free(all);
    free(outs);
    free_uploads(&u);
    model_spec_free(&spec);
}

static float fill_halves(int peer, int t, size_t i) {
    return (float)(peer + 1) * 1.5f + (float)((t + (int)i) % 7) * 0.25f;
}

static void test_bf16_uploads_and_bf16_output(void **state) {
    (void)state;
    ModelSpec spec;
    build_spec(&spec, 4);
    AggregateConfig cfg = base_config(SYNC_MODE_SPES, 2, 2);
    Uploads u;
    make_uploads(&u, &spec, &cfg, DTYPE_BF16, fill_halves);   // all values exact in bf16
    uint8_t **outs;
    float *all = run_aggregate(&spec, &cfg, 3, &u, &outs);
    for (int t = 0; t < spec.count; t++) {
        int e = spec.tensors[t].expert;
        for (size_t i = 0; i < spec.tensors[t].numel; i++) {
            float want = e < 0 ? (fill_halves(0, t, i) + fill_halves(1, t, i)) / 2.0f : fill_halves(e / 2, t, i);
            assert_true(((const float *)outs[t])[i] == want);
        }
    }
    // The same aggregate written as BF16 equals the rounded F32 one.
    uint16_t *half = calloc(spec.total_numel, 2);
    uint8_t **houts = carve_outputs(&spec, (uint8_t *)half, 2);
    assert_int_equal(aggregate_compute(&spec, &cfg, 3, u.rows, houts, DTYPE_BF16), SPES_OK);
    for (size_t i = 0; i < spec.total_numel; i++) assert_int_equal(half[i], f32_to_bf16(all[i]));
    free(half);
    free(houts);
    free(all);
    free(outs);
    free_uploads(&u);
    model_spec_free(&spec);
}

static float fill_random(int peer, int t, size_t i) {
    uint64_t x = (uint64_t)peer * 0x9e3779b97f4a7c15ull ^ (uint64_t)t * 0xbf58476d1ce4e5b9ull ^
                 (uint64_t)i * 0x94d049bb133111ebull;
    x ^= x >> 31;
    x *= 0xd6e8feb96a9e3b5dull;
    x ^= x >> 29;
    return (float)((double)(x >> 11) / 9007199254740992.0) - 0.5f;
}

static void test_deterministic_across_thread_counts(void **state) {
    (void)state;
    // Bigger experts so the chunked loops and cosine blocks really split.
    ModelSpec spec;
    model_spec_init(&spec);
    int64_t shared[2] = {300, 77}, gate[2] = {129, 101}, down[2] = {101, 129};
    assert_int_equal(model_spec_add(&spec, "model.embed_tokens.weight", DTYPE_F32, 2, shared), SPES_OK);
    add_layer_experts(&spec, 0, 8, gate, down);
    assert_int_equal(model_spec_finish(&spec), SPES_OK);
    AggregateConfig cfg = base_config(SYNC_MODE_SPES, 4, 2);
    cfg.merge_interval = 1;
    cfg.merge_alpha_start = 0.3f;
    Uploads u;
    make_uploads(&u, &spec, &cfg, DTYPE_F32, fill_random);
    uint8_t **o1, **o2;
    omp_set_num_threads(1);
    float *a1 = run_aggregate(&spec, &cfg, 4, &u, &o1);
    omp_set_num_threads(2);
    float *a2 = run_aggregate(&spec, &cfg, 4, &u, &o2);
    assert_memory_equal(a1, a2, spec.total_numel * sizeof(float));
    free(a1);
    free(a2);
    free(o1);
    free(o2);
    free_uploads(&u);
    model_spec_free(&spec);
}

// One configuration through both forms: aggregate_compute_partial with every upload at hand,
// and the incremental accumulator fed one peer at a time. The bytes must be identical.
static void check_incremental(const ModelSpec *spec, const AggregateConfig *cfg, int step, DType in_dtype,
                              DType out_dtype, const bool *present) {
    Uploads u;
    make_uploads(&u, spec, cfg, in_dtype, fill_random);
    size_t elem = dtype_size(out_dtype), total = spec->total_numel * elem + 4;
    // Previous aggregate for missing owners: peer 0's values rearranged as a full model.
    Uploads prev_u;
    AggregateConfig fed = *cfg;
    fed.mode = SYNC_MODE_FEDAVG;
    make_uploads(&prev_u, spec, &fed, DTYPE_F32, fill_random);
    uint8_t *whole = calloc(total, 1), *steps = calloc(total, 1);
    uint8_t **o1 = carve_outputs(spec, whole, elem), **o2 = carve_outputs(spec, steps, elem);
    assert_int_equal(aggregate_compute_partial(spec, cfg, step, u.rows, present, prev_u.rows, o1, out_dtype), SPES_OK);
    AggregateAcc *acc;
    assert_int_equal(aggregate_acc_begin(spec, cfg, step, present, o2, out_dtype, &acc), SPES_OK);
    for (int p = 0; p < cfg->num_peers; p++)
        if (!present || present[p]) assert_int_equal(aggregate_acc_add(acc, p, u.rows + (size_t)p * spec->count), SPES_OK);
    assert_int_equal(aggregate_acc_finish(acc, prev_u.rows), SPES_OK);
    aggregate_acc_free(acc);
    assert_memory_equal(whole, steps, total);
    free(whole);
    free(steps);
    free(o1);
    free(o2);
    free_uploads(&u);
    free_uploads(&prev_u);
}

// A spec for the two aggregate forms: shared tensors of sizes that are not multiples of CHUNK
// (one of 3 values) and 2 layers of 8 experts of 129 x 101.
static void build_wide_spec(ModelSpec *spec) {
    model_spec_init(spec);
    int64_t shared[2] = {300, 77}, gate[2] = {129, 101}, down[2] = {101, 129}, odd[1] = {3};
    assert_int_equal(model_spec_add(spec, "model.embed_tokens.weight", DTYPE_F32, 2, shared), SPES_OK);
    assert_int_equal(model_spec_add(spec, "model.norm.weight", DTYPE_F32, 1, odd), SPES_OK);
    for (int l = 0; l < 2; l++) add_layer_experts(spec, l, 8, gate, down);
    assert_int_equal(model_spec_finish(spec), SPES_OK);
}

// cfg with merging on every step at alpha 0.3 (merge) or off.
static AggregateConfig with_merge(AggregateConfig cfg, int merge) {
    cfg.merge_interval = merge ? 1 : 0;
    cfg.merge_alpha_start = merge ? 0.3f : 0.0f;
    return cfg;
}

static void test_incremental_is_bit_identical(void **state) {
    (void)state;
    ModelSpec spec;
    build_wide_spec(&spec);
    bool some[4] = {false, true, true, false};
    for (int merge = 0; merge < 2; merge++) {
        AggregateConfig cfg = with_merge(base_config(SYNC_MODE_SPES, 4, 2), merge);
        check_incremental(&spec, &cfg, 4, DTYPE_F32, DTYPE_F32, NULL);
        check_incremental(&spec, &cfg, 4, DTYPE_BF16, DTYPE_F32, NULL);
        check_incremental(&spec, &cfg, 4, DTYPE_F32, DTYPE_BF16, NULL);
        check_incremental(&spec, &cfg, 4, DTYPE_BF16, DTYPE_BF16, NULL);
        check_incremental(&spec, &cfg, 4, DTYPE_F32, DTYPE_F32, some);   // partial: owners 0, 3 missing
        check_incremental(&spec, &cfg, 4, DTYPE_BF16, DTYPE_BF16, some);
        AggregateConfig fed = with_merge(base_config(SYNC_MODE_FEDAVG, 3, 0), merge);
        check_incremental(&spec, &fed, 4, DTYPE_F32, DTYPE_F32, NULL);
        check_incremental(&spec, &fed, 4, DTYPE_F32, DTYPE_BF16, NULL);
    }
    model_spec_free(&spec);
}

static void test_config_errors_name_the_problem(void **state) {
    (void)state;
    ModelSpec spec;
    build_spec(&spec, 4);
    AggregateConfig cfg = base_config(SYNC_MODE_SPES, 3, 2);   // 3*2 != 4 experts
    assert_int_equal(aggregate_config_check(&cfg, &spec), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "4 experts"));
    cfg = base_config(SYNC_MODE_SPES, 2, 2);
    cfg.merge_topk = 0;
    assert_int_equal(aggregate_config_check(&cfg, &spec), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "merge_topk"));
    // A missing upload is an error, not a crash.
    Uploads u;
    make_uploads(&u, &spec, &cfg, DTYPE_F32, fill_distinct);
    cfg.merge_topk = 4;
    u.rows[1 * spec.count + 0] = NULL;
    uint8_t **outs = calloc((unsigned)spec.count, sizeof(uint8_t *));
    assert_int_equal(aggregate_compute(&spec, &cfg, 1, u.rows, outs, DTYPE_F32), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "peer 1"));
    free(outs);
    free_uploads(&u);
    model_spec_free(&spec);
}

// Expert rotation: at a rotation step the aggregate is the unrotated one (merging included) with
// each layer's expert e and router row e at position (e + m) mod E; other steps are untouched;
// the incremental form gives the same bytes. E = 6, m = 2 (two cycles of 3), E = 4, m = 1 (one of 4)
// and E = 4, m = 2 with 4 peers (replicas: each position moves one group of owners on).
static void check_rotation(int P, int m, int E, DType out_dtype) {
    ModelSpec spec;
    build_spec(&spec, E);
    int step = 20;
    AggregateConfig plain = base_config(SYNC_MODE_SPES, P, m);
    plain.merge_interval = 10;   // merging at the same step: the rotation moves merged values
    plain.merge_alpha_start = 0.3f;
    AggregateConfig rot = plain;
    rot.rotation_steps = 10;
    Uploads u;
    make_uploads(&u, &spec, &plain, DTYPE_F32, fill_random);
    size_t elem = dtype_size(out_dtype), total = spec.total_numel * elem;
    uint8_t *a = calloc(total, 1), *b = calloc(total, 1), *c = calloc(total, 1);
    uint8_t **oa = carve_outputs(&spec, a, elem), **ob = carve_outputs(&spec, b, elem),
            **oc = carve_outputs(&spec, c, elem);
    assert_int_equal(aggregate_compute(&spec, &plain, step, u.rows, oa, out_dtype), SPES_OK);
    assert_int_equal(aggregate_compute(&spec, &rot, step, u.rows, ob, out_dtype), SPES_OK);
    AggregateAcc *acc;
    assert_int_equal(aggregate_acc_begin(&spec, &rot, step, NULL, oc, out_dtype, &acc), SPES_OK);
    for (int p = 0; p < P; p++) assert_int_equal(aggregate_acc_add(acc, p, u.rows + (size_t)p * spec.count), SPES_OK);
    assert_int_equal(aggregate_acc_finish(acc, NULL), SPES_OK);
    aggregate_acc_free(acc);
    assert_memory_equal(b, c, total);
    int moved = 0;
    for (int t = 0; t < spec.count; t++) {
        const SpecTensor *st = &spec.tensors[t];
        size_t bytes = st->numel * elem;
        if (st->expert >= 0) {
            int slot = 0;
            while (spec.moe_layers[slot] != st->layer) slot++;
            int to = model_spec_expert_tensor(&spec, slot, (st->expert + m) % E, st->proj);
            assert_memory_equal(ob[to], oa[t], bytes);
            moved++;
        } else if (strstr(st->name, "mlp.gate.weight")) {
            size_t row = bytes / (size_t)E;
            for (int e = 0; e < E; e++) assert_memory_equal(ob[t] + (size_t)((e + m) % E) * row, oa[t] + (size_t)e * row, row);
            assert_memory_not_equal(ob[t], oa[t], bytes);
        } else {
            assert_memory_equal(ob[t], oa[t], bytes);
        }
    }
    assert_int_equal(moved, 2 * E * 3);
    // A step that is not a multiple of rotation_steps: the plain aggregate.
    assert_int_equal(aggregate_compute(&spec, &plain, step + 5, u.rows, oa, out_dtype), SPES_OK);
    assert_int_equal(aggregate_compute(&spec, &rot, step + 5, u.rows, ob, out_dtype), SPES_OK);
    assert_memory_equal(a, b, total);
    free(a), free(b), free(c), free(oa), free(ob), free(oc);
    free_uploads(&u);
    model_spec_free(&spec);
}

static void test_rotation_moves_experts_one_peer_on(void **state) {
    (void)state;
    check_rotation(3, 2, 6, DTYPE_F32);
    check_rotation(3, 2, 6, DTYPE_BF16);
    check_rotation(4, 1, 4, DTYPE_F32);
    check_rotation(4, 2, 4, DTYPE_F32);
}

static void test_rotation_config_errors(void **state) {
    (void)state;
    ModelSpec spec;
    build_spec(&spec, 4);
    AggregateConfig cfg = base_config(SYNC_MODE_FEDAVG, 2, 2);
    cfg.rotation_steps = 10;
    assert_int_equal(aggregate_config_check(&cfg, &spec), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "fedavg mode"));
    cfg = base_config(SYNC_MODE_SPES, 2, 2);
    cfg.rotation_steps = -1;
    assert_int_equal(aggregate_config_check(&cfg, &spec), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "expert_rotation_steps"));
    model_spec_free(&spec);
    // A model whose MoE layers have no router to rotate with the experts.
    model_spec_init(&spec);
    int64_t gate[2] = {3, 4}, down[2] = {4, 3};
    add_layer_experts(&spec, 0, 2, gate, down);
    assert_int_equal(model_spec_finish(&spec), SPES_OK);
    cfg = base_config(SYNC_MODE_SPES, 2, 1);
    cfg.rotation_steps = 10;
    assert_int_equal(aggregate_config_check(&cfg, &spec), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "model.layers.0.mlp.gate.weight"));
    model_spec_free(&spec);
}

// Expert replicas: E = 4, m = 2, P = 4, so 2 groups and 2 owners per expert (group g: peers g and
// g + 2). An expert is the mean of its present owners (one present: its upload, bit for bit; none:
// the previous aggregate), the shared tensors the mean of every present peer; the incremental form
// gives the same bytes; a topology that leaves experts with unequal owners is refused.
static void test_replicas_average_their_owners(void **state) {
    (void)state;
    ModelSpec spec;
    build_spec(&spec, 4);
    AggregateConfig cfg = base_config(SYNC_MODE_SPES, 4, 2);
    assert_int_equal(aggregate_config_check(&cfg, &spec), SPES_OK);
    Uploads u, prev;
    make_uploads(&u, &spec, &cfg, DTYPE_F32, fill_distinct);
    AggregateConfig one = base_config(SYNC_MODE_FEDAVG, 1, 0);
    make_uploads(&prev, &spec, &one, DTYPE_F32, fill_distinct);
    for (int t = 0; t < spec.count; t++)
        for (size_t i = 0; i < spec.tensors[t].numel; i++) {
            float v = -fill_distinct(0, t, i) - 1.0f;
            memcpy(prev.data[t] + 4 * i, &v, 4);
        }
    // Peer 2 sends experts 0 and 1 (group 0) like peer 0; peer 3 experts 2 and 3 like peer 1.
    for (int t = 0; t < spec.count; t++) {
        int e = spec.tensors[t].expert;
        for (int p = 0; p < 4; p++)
            assert_int_equal(model_spec_peer_sends(&spec, cfg.mode, 2, p, t), e < 0 || e / 2 == p % 2);
    }
    float *all = calloc(spec.total_numel, sizeof(float));
    uint8_t **outs = carve_outputs(&spec, (uint8_t *)all, sizeof(float));
    const bool cases[3][4] = {{true, true, true, true}, {true, true, false, true}, {false, true, false, true}};
    for (int c = 0; c < 3; c++) {
        const bool *present = cases[c];
        assert_int_equal(aggregate_compute_partial(&spec, &cfg, 10, u.rows, present, prev.rows, outs, DTYPE_F32),
                         SPES_OK);
        for (int t = 0; t < spec.count; t++) {
            int e = spec.tensors[t].expert, first = e < 0 ? 0 : e / 2, stride = e < 0 ? 1 : 2, n = 0;
            for (size_t i = 0; i < spec.tensors[t].numel; i++) {
                float want = 0.0f;
                n = 0;
                for (int p = first; p < 4; p += stride)
                    if (present[p]) want = n++ ? want + upload_value(&u, p, t, i) : upload_value(&u, p, t, i);
                if (n > 1) want /= (float)n;
                if (n == 0) want = upload_value(&prev, 0, t, i);
                assert_true(((const float *)outs[t])[i] == want);
            }
            if (c == 2 && e >= 0) assert_int_equal(n, e / 2 == 0 ? 0 : 2);   // group 0 wholly absent
        }
    }
    free(all);
    free(outs);
    free_uploads(&u);
    free_uploads(&prev);
    model_spec_free(&spec);
    // Both forms, merging on and off, F32 and BF16, all present and partial (8 experts, m = 4: two
    // owners per expert, peers {0, 2} and {1, 3}).
    build_wide_spec(&spec);
    bool some[4] = {true, true, false, true}, no_group0[4] = {false, true, false, true};
    for (int merge = 0; merge < 2; merge++) {
        AggregateConfig rep = with_merge(base_config(SYNC_MODE_SPES, 4, 4), merge);
        check_incremental(&spec, &rep, 4, DTYPE_F32, DTYPE_F32, NULL);
        check_incremental(&spec, &rep, 4, DTYPE_BF16, DTYPE_BF16, NULL);
        check_incremental(&spec, &rep, 4, DTYPE_F32, DTYPE_F32, some);
        check_incremental(&spec, &rep, 4, DTYPE_F32, DTYPE_BF16, no_group0);
    }
    // 8 experts, m = 4, 3 peers: group 0 would have two owners and group 1 one.
    AggregateConfig uneven = base_config(SYNC_MODE_SPES, 3, 4);
    assert_int_equal(aggregate_config_check(&uneven, &spec), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "same number of owners"));
    uneven = base_config(SYNC_MODE_SPES, 4, 3);   // 3 does not divide 8
    assert_int_equal(aggregate_config_check(&uneven, &spec), SPES_ERR);
    model_spec_free(&spec);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shared_mean_and_owner_experts),
        cmocka_unit_test(test_fedavg_averages_every_tensor),
        cmocka_unit_test(test_partial_round),
        cmocka_unit_test(test_alpha_schedule),
        cmocka_unit_test(test_neighbours_order_and_ties),
        cmocka_unit_test(test_cosines_of_crafted_gates),
        cmocka_unit_test(test_merge_uses_known_neighbours),
        cmocka_unit_test(test_bf16_uploads_and_bf16_output),
        cmocka_unit_test(test_deterministic_across_thread_counts),
        cmocka_unit_test(test_incremental_is_bit_identical),
        cmocka_unit_test(test_config_errors_name_the_problem),
        cmocka_unit_test(test_rotation_moves_experts_one_peer_on),
        cmocka_unit_test(test_rotation_config_errors),
        cmocka_unit_test(test_replicas_average_their_owners),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
