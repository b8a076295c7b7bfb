// Parameter-server memory against the number of peers: a real `spes server` (sync_server_start
// in a forked child, so its peak is its own) and P client threads in this process that each
// upload, wait for and download the aggregate, for ROUNDS rounds, in spes mode on a model of
// ~64 MB F32 (E=16 experts in 2 layers, m = 16/P per peer).
//
// Figure: (VmHWM - VmRSS before the first call) / model size, the server's peak above idle in
// models. The bound ('peer' column): 2 + keep_steps models (the kept aggregates, the one being
// formed, one upload being read back; see docs/operating.md), whatever P.
//
// usage: server_memory [--rounds R] [--keep-steps K]
// Last line: server-memory: p2=<x> p4=<x> p8=<x> p16=<x> bound=<2+K> max_ratio=<max x/bound>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/error.h"
#include "sync/client.h"
#include "sync/server.h"

enum { EXPERTS = 16, LAYERS = 2, HIDDEN = 512, EXPERT_HIDDEN = 256, VOCAB = 4096 };

static int build_spec(ModelSpec *spec) {
    model_spec_init(spec);
    int64_t embed[2] = {VOCAB, HIDDEN}, router[2] = {EXPERTS, HIDDEN}, gate[2] = {EXPERT_HIDDEN, HIDDEN},
            down[2] = {HIDDEN, EXPERT_HIDDEN}, norm[1] = {HIDDEN};
    static const char *proj[3] = {"gate", "up", "down"};
    char name[128];
    SPES_TRY(model_spec_add(spec, "model.embed_tokens.weight", DTYPE_F32, 2, embed));
    for (int l = 0; l < LAYERS; l++) {
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        SPES_TRY(model_spec_add(spec, name, DTYPE_F32, 1, norm));
        snprintf(name, sizeof name, "model.layers.%d.mlp.gate.weight", l);
        SPES_TRY(model_spec_add(spec, name, DTYPE_F32, 2, router));
        for (int e = 0; e < EXPERTS; e++)
            for (int p = 0; p < 3; p++) {
                snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s_proj.weight", l, e, proj[p]);
                SPES_TRY(model_spec_add(spec, name, DTYPE_F32, 2, p == 2 ? down : gate));
            }
    }
    SPES_TRY(model_spec_add(spec, "lm_head.weight", DTYPE_F32, 2, embed));
    return model_spec_finish(spec);
}

static long status_kb(pid_t pid, const char *key) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    long kb = -1;
    size_t n = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ':') kb = atol(line + n + 1);
    if (f) fclose(f);
    return kb;
}

typedef struct {
    int port, peer, P, rounds;
    const ModelSpec *spec;
    int ok;
} Peer;

static void *run_peer(void *arg) {
    Peer *p = arg;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", p->port);
    SyncClientConfig cfg;
    sync_client_config_defaults(&cfg);
    cfg.server_addr = addr;
    cfg.peer_id = p->peer;
    cfg.num_peers = p->P;
    cfg.experts_per_node = EXPERTS / p->P;
    SyncClient *c;
    if (sync_client_create(&cfg, &c) != SPES_OK) return NULL;
    int m = EXPERTS / p->P, n = 0;
    StWriteTensor *w = calloc((size_t)p->spec->count, sizeof *w);
    for (int t = 0; t < p->spec->count; t++) {
        if (!model_spec_peer_sends(p->spec, SYNC_MODE_SPES, m, p->peer, t)) continue;
        const SpecTensor *st = &p->spec->tensors[t];
        float *data = malloc(st->numel * sizeof(float));
        for (size_t i = 0; i < st->numel; i++) data[i] = 0.001f * (float)((i * 7 + (size_t)t + (size_t)p->peer) % 1000);
        w[n] = (StWriteTensor){.name = st->name, .dtype = DTYPE_F32, .ndim = st->ndim, .data = data};
        memcpy(w[n].shape, st->shape, sizeof w[n].shape);
        n++;
    }
    int rc = sync_client_hello(c, p->spec);
    for (int r = 1; rc == SPES_OK && r <= p->rounds; r++) {
        uint8_t *bytes;
        size_t len;
        rc = sync_client_upload(c, 10 * r, w, n);
        if (rc == SPES_OK) rc = sync_client_wait_and_download(c, 10 * r, &bytes, &len);
        if (rc == SPES_OK) free(bytes);
    }
    if (rc != SPES_OK) fprintf(stderr, "peer %d: %s\n", p->peer, spes_last_error());
    p->ok = rc == SPES_OK;
    for (int i = 0; i < n; i++) free((void *)w[i].data);
    free(w);
    sync_client_destroy(c);
    return NULL;
}

// The server of one run, forked before this process starts gRPC (gRPC does not survive a
// fork); it starts serving when its go pipe says the number of peers.
typedef struct {
    pid_t pid;
    int go, ready;
} ServerChild;

static void serve(int go, int ready, int keep_steps) {
    int P;
    if (read(go, &P, sizeof P) != sizeof P) _exit(1);
    SyncServerConfig cfg;
    sync_server_config_defaults(&cfg);
    cfg.host = "127.0.0.1";
    cfg.port = 0;
    cfg.rounds.keep_steps = keep_steps;
    cfg.rounds.agg = (AggregateConfig){.mode = SYNC_MODE_SPES, .num_peers = P, .experts_per_node = EXPERTS / P,
                                       .merge_topk = 4};
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    SyncServer *srv;
    int port = sync_server_start(&cfg, &srv) == SPES_OK ? sync_server_port(srv) : -1;
    if (write(ready, &port, sizeof port) != sizeof port) _exit(1);
    int sig;
    sigwait(&stop, &sig);
    sync_server_stop(srv);   // removes its spool dir
    _exit(0);
}

static ServerChild fork_server(int keep_steps) {
    int go[2], ready[2];
    ServerChild s = {-1, -1, -1};
    if (pipe(go) != 0 || pipe(ready) != 0) return s;
    s.pid = fork();
    if (s.pid == 0) {
        close(go[1]);
        close(ready[0]);
        serve(go[0], ready[1], keep_steps);
    }
    close(go[0]);
    close(ready[1]);
    s.go = go[1];
    s.ready = ready[0];
    return s;
}

// One run with P peers; returns the server's peak above idle in models (< 0 on failure).
static double run(ServerChild server, int P, int rounds, int keep_steps) {
    pid_t child = server.pid;
    int port = -1;
    if (write(server.go, &P, sizeof P) != sizeof P || read(server.ready, &port, sizeof port) != sizeof port ||
        port <= 0)
        return -1;
    long idle_kb = status_kb(child, "VmRSS");
    ModelSpec spec;
    if (build_spec(&spec) != SPES_OK) return -1;
    Peer *peers = calloc((size_t)P, sizeof *peers);
    pthread_t *threads = calloc((size_t)P, sizeof *threads);
    for (int p = 0; p < P; p++) {
        peers[p] = (Peer){.port = port, .peer = p, .P = P, .rounds = rounds, .spec = &spec};
        pthread_create(&threads[p], NULL, run_peer, &peers[p]);
    }
    int ok = 1;
    for (int p = 0; p < P; p++) {
        pthread_join(threads[p], NULL);
        ok &= peers[p].ok;
    }
    long peak_kb = status_kb(child, "VmHWM");
    kill(child, SIGTERM);
    waitpid(child, NULL, 0);
    double model_mb = (double)spec.total_numel * 4 / 1048576.0;
    double over = (double)(peak_kb - idle_kb) / 1024.0;
    printf("P=%-2d model_mb=%.1f idle_mb=%.1f peak_mb=%.1f peak_over_idle_mb=%.1f peak_over_model=%.2f bound=%d\n", P,
           model_mb, idle_kb / 1024.0, peak_kb / 1024.0, over, over / model_mb, 2 + keep_steps);
    fflush(stdout);
    model_spec_free(&spec);
    free(peers);
    free(threads);
    return ok && idle_kb > 0 && peak_kb > 0 ? over / model_mb : -1;
}

int main(int argc, char **argv) {
    int rounds = 4, keep_steps = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--keep-steps")) keep_steps = atoi(argv[i + 1]);
    }
    static const int Ps[] = {2, 4, 8, 16};
    ServerChild servers[4];
    for (int i = 0; i < 4; i++) servers[i] = fork_server(keep_steps);
    double x[4], worst = 0;
    for (int i = 0; i < 4; i++) {
        x[i] = run(servers[i], Ps[i], rounds, keep_steps);
        if (x[i] < 0) {
            fprintf(stderr, "server-memory: the run with %d peers failed\n", Ps[i]);
            return 1;
        }
        if (x[i] / (2 + keep_steps) > worst) worst = x[i] / (2 + keep_steps);
    }
    printf("server-memory: p2=%.2f p4=%.2f p8=%.2f p16=%.2f bound=%d max_ratio=%.2f\n", x[0], x[1], x[2], x[3],
           2 + keep_steps, worst);
    return 0;
}
