// The run config `spes demo` writes (demo.yaml): a small byte-level MoE whose SPES topology
// and budget come from the demo's options. Every key is one row of a (key, value) table in
// demo_config.c, so a value sits next to its key; tests/unit/test_demo_config.c loads the
// written file back with config_load and checks every value.
#pragma once

typedef struct {
    int peers;              // spes_config.num_peers
    int experts_per_peer;   // spes_config.num_train_experts_per_node
    int experts;            // model.moe_num_experts (0: peers * experts_per_peer; fewer: replicas, docs/sync.md)
    int steps;              // max_duration, save and eval interval; scheduler.t_warmup = max(steps/10, 1)
    int sync_steps;         // spes_config.sync_steps
    int batch;              // sequences per step on one peer (global = micro-batch)
    int threads_per_peer;   // threads
    float outer_lr;         // spes_config.outer_lr, the server's outer optimizer (0: the default 1)
    float outer_momentum;   // spes_config.outer_momentum (default 0)
    int sync_warmup_steps;  // spes_config.sync_warmup_steps (0: no synchronous warm-up)
    int sync_warmup_every;  // spes_config.sync_warmup_every (0: the default 1)
    double lr_scale;        // spes_config.lr_scale, the peers' learning rate against the centralised run's (0: 1)
    double peer_beta1;      // spes_config.beta1, the peers' AdamW beta1 (0: null, optimizer.betas' 0.9; the demo: 0.8)
    const char *payload;    // spes_config.payload_dtype: f32, bf16, int8 or int4 (NULL: f32)
} DemoRunShape;

// The model's experts per layer for this shape.
static inline int demo_experts(const DemoRunShape *s) { return s->experts ? s->experts : s->peers * s->experts_per_peer; }

// Writes the config to `path` (atomically) for a run whose files live in `dir`: train.bin and
// val.bin there, each peer's checkpoints under dir/peer${spes_config.peer_id}.
int demo_config_write(const DemoRunShape *shape, const char *dir, const char *path);
