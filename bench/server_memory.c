// Parameter-server memory against the number of peers: a real `spes server` (sync_server_start
// in a forked child, so its peak is its own) and P client threads in this process that each
// upload, wait for and download the aggregate, for ROUNDS rounds, in spes mode on a model of
// ~64 MB F32 (E=16 experts in 2 layers, m = 16/P per peer).
//
// Figure: each round's (VmHWM - VmRSS before the first call) / model size, the server's peak
// above idle in models, VmHWM reset between rounds (the peers meet at a barrier after each
// round); reported: the median over rounds 2..R (round 1 is a warm-up) and the highest. The bound ('peer' column): 2 + keep_steps models (the kept aggregates, the one being
// formed, one upload being read back; see docs/operating.md), whatever P.
//
// usage: server_memory [--rounds R] [--keep-steps K]
// Last line: server-memory: p2=<x> p4=<x> p8=<x> p16=<x> bound=<2+K> max_ratio=<highest round/bound>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/error.h"
#include "sync/client.h"
#include "server/server.h"

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
    pthread_barrier_t *round_done, *next_round;   // with the main thread: one round at a time
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
    for (int r = 1; r <= p->rounds; r++) {   // a failed peer still meets the others at the barriers
        uint8_t *bytes;
        size_t len;
        if (rc == SPES_OK) rc = sync_client_upload(c, 10 * r, w, n);
        if (rc == SPES_OK) rc = sync_client_wait_and_download(c, 10 * r, &bytes, &len);
        if (rc == SPES_OK) free(bytes);
        pthread_barrier_wait(p->round_done);   // the main thread reads this round's peak
        pthread_barrier_wait(p->next_round);
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

// SPES_BENCH_MALLINFO=1: the server child prints malloc's view at its highest anonymous RSS
// (in use in arenas, free in arenas, mmapped blocks): what the peak is made of.
static volatile int watch_stop;
static void *watch_malloc(void *arg) {
    (void)arg;
    long best = 0;
    struct mallinfo2 at = {0};
    while (!watch_stop) {
        long anon = status_kb(getpid(), "RssAnon");
        if (anon > best) {
            best = anon;
            at = mallinfo2();
        }
        usleep(2000);
    }
    fprintf(stderr, "mallinfo at max RssAnon %.1f MB: arena(sbrk)=%.1f MB in_use=%.1f MB free_in_arenas=%.1f MB mmapped=%.1f MB\n",
            best / 1024.0, at.arena / 1048576.0, at.uordblks / 1048576.0, at.fordblks / 1048576.0, at.hblkhd / 1048576.0);
    return NULL;
}

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
    pthread_t watcher;
    bool watching = getenv("SPES_BENCH_MALLINFO") && pthread_create(&watcher, NULL, watch_malloc, NULL) == 0;
    SyncServer *srv;
    int port = sync_server_start(&cfg, &srv) == SPES_OK ? sync_server_port(srv) : -1;
    if (write(ready, &port, sizeof port) != sizeof port) _exit(1);
    int sig;
    sigwait(&stop, &sig);
    if (watching) {
        watch_stop = 1;
        pthread_join(watcher, NULL);
    }
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

// Samples the server's RSS (anonymous and file-backed) every 2 ms while the peers run: VmHWM
// says how high the server went, these say what it was made of.
typedef struct {
    pid_t pid;
    volatile int stop;
    long max_anon_kb, max_file_kb;
} Sampler;

static void *sample(void *arg) {
    Sampler *s = arg;
    while (!s->stop) {
        long anon = status_kb(s->pid, "RssAnon"), file = status_kb(s->pid, "RssFile");
        if (anon > s->max_anon_kb) s->max_anon_kb = anon;
        if (file > s->max_file_kb) s->max_file_kb = file;
        usleep(2000);
    }
    return NULL;
}

// One run with P peers; returns the server's peak above idle in models (< 0 on failure).
static double run(ServerChild server, int P, int rounds, int keep_steps, double *highest_out) {
    pid_t child = server.pid;
    int port = -1;
    if (write(server.go, &P, sizeof P) != sizeof P || read(server.ready, &port, sizeof port) != sizeof port ||
        port <= 0)
        return -1;
    long idle_kb = status_kb(child, "VmRSS");
    Sampler sampler = {.pid = child};
    long idle_anon_kb = status_kb(child, "RssAnon"), idle_file_kb = status_kb(child, "RssFile");
    pthread_t sampler_thread;
    pthread_create(&sampler_thread, NULL, sample, &sampler);
    ModelSpec spec;
    if (build_spec(&spec) != SPES_OK) return -1;
    Peer *peers = calloc((size_t)P, sizeof *peers);
    pthread_t *threads = calloc((size_t)P, sizeof *threads);
    pthread_barrier_t round_done, next_round;
    pthread_barrier_init(&round_done, NULL, (unsigned)P + 1);
    pthread_barrier_init(&next_round, NULL, (unsigned)P + 1);
    for (int p = 0; p < P; p++) {
        peers[p] = (Peer){.port = port, .peer = p, .P = P, .rounds = rounds, .spec = &spec,
                          .round_done = &round_done, .next_round = &next_round};
        pthread_create(&threads[p], NULL, run_peer, &peers[p]);
    }
    // Each round's peak: VmHWM when every peer has its aggregate, then reset (clear_refs 5).
    // Round 1 is a warm-up (no aggregate kept yet); the figure is the median of rounds 2..R,
    // and the highest of them is printed next to it.
    double *round_mb = calloc((size_t)rounds, sizeof *round_mb);
    long peak_kb = 0;
    for (int r = 0; r < rounds; r++) {
        pthread_barrier_wait(&round_done);
        long hwm = status_kb(child, "VmHWM");
        round_mb[r] = (double)(hwm - idle_kb) / 1024.0;
        if (hwm > peak_kb) peak_kb = hwm;
        char path[64];
        snprintf(path, sizeof path, "/proc/%d/clear_refs", (int)child);
        FILE *f = fopen(path, "w");
        if (f) fputs("5", f);
        if (f) fclose(f);
        pthread_barrier_wait(&next_round);
    }
    int ok = 1;
    for (int p = 0; p < P; p++) {
        pthread_join(threads[p], NULL);
        ok &= peers[p].ok;
    }
    pthread_barrier_destroy(&round_done);
    pthread_barrier_destroy(&next_round);
    sampler.stop = 1;
    pthread_join(sampler_thread, NULL);
    kill(child, SIGTERM);
    waitpid(child, NULL, 0);
    int counted = rounds > 1 ? rounds - 1 : 1;
    double *later = round_mb + (rounds > 1), highest = 0;
    for (int i = 1; i < counted; i++)   // insertion sort of the counted rounds
        for (int j = i; j > 0 && later[j - 1] > later[j]; j--) {
            double x = later[j];
            later[j] = later[j - 1];
            later[j - 1] = x;
        }
    for (int i = 0; i < counted; i++) highest = later[i] > highest ? later[i] : highest;
    double median_mb = counted % 2 ? later[counted / 2] : 0.5 * (later[counted / 2 - 1] + later[counted / 2]);
    double model_mb = (double)spec.total_numel * 4 / 1048576.0;
    double over = (double)(peak_kb - idle_kb) / 1024.0;
    printf("P=%-2d model_mb=%.1f idle_mb=%.1f peak_over_model: median=%.2f max=%.2f (rounds 2..%d) whole_run=%.2f bound=%d "
           "sampled_max_anon=%.2f sampled_max_file=%.2f\n",
           P, model_mb, idle_kb / 1024.0, median_mb / model_mb, highest / model_mb, rounds, over / model_mb,
           2 + keep_steps, (sampler.max_anon_kb - idle_anon_kb) / 1024.0 / model_mb,
           (sampler.max_file_kb - idle_file_kb) / 1024.0 / model_mb);
    fflush(stdout);
    model_spec_free(&spec);
    free(peers);
    free(threads);
    free(round_mb);
    *highest_out = highest / model_mb;
    return ok && idle_kb > 0 && peak_kb > 0 ? median_mb / model_mb : -1;
}

int main(int argc, char **argv) {
    int rounds = 6, keep_steps = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--keep-steps")) keep_steps = atoi(argv[i + 1]);
    }
    static const int Ps[] = {2, 4, 8, 16};
    ServerChild servers[4];
    for (int i = 0; i < 4; i++) servers[i] = fork_server(keep_steps);
    double x[4], hi[4], worst = 0;
    for (int i = 0; i < 4; i++) {
        x[i] = run(servers[i], Ps[i], rounds, keep_steps, &hi[i]);
        if (x[i] < 0) {
            fprintf(stderr, "server-memory: the run with %d peers failed\n", Ps[i]);
            return 1;
        }
        if (hi[i] / (2 + keep_steps) > worst) worst = hi[i] / (2 + keep_steps);
    }
    printf("server-memory: p2=%.2f p4=%.2f p8=%.2f p16=%.2f bound=%d max_ratio=%.2f (median of rounds 2..%d; "
           "max_ratio: the highest round / bound)\n",
           x[0], x[1], x[2], x[3], 2 + keep_steps, worst, rounds);
    return 0;
}
