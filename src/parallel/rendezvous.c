// torchrun-style ranks joined over an ompi-server and a local-socket rendezvous. See rendezvous.h.
#include "parallel/rendezvous.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/env.h"
#include "base/error.h"
#include "base/log.h"
#include "base/timer.h"

struct Rendezvous {
    int rank, size;
    int *fds;              // rank 0: [size] socket of rank k (fds[0] = -1); others: fds[0] to rank 0
    pid_t server;          // rank 0: the ompi-server child, else 0
    char uri_file[64];
    int wake[2];           // self-pipe that stops the watchdog
    pthread_t watchdog;
    bool watching;
    atomic_bool finishing;
    atomic_bool joined;        // steps 2-3 are done: the watchdog stops timing them
    double join_deadline;      // until when steps 2-3 may take (the watchdog ends the rank after it)
    atomic_int waiting_for;    // for the watchdog's message: the rank being joined in step 3, -1 while
                               // a rank waits for its turn, 0 in MPI_Init
};

// A connection to rank 0 has this long to say its RANK and WORLD_SIZE; several are read at
// once, so a silent one costs its own slot, not the whole rendezvous timeout.
#define HELLO_SECONDS 5.0
// Connections rank 0 reads hellos from at once; more wait in the listen backlog.
#define MAX_PENDING 64

// A non-negative int from the environment; -1 when unset, -2 when not a number.
static int env_num(const char *name) { return env_int(name, -1, -2); }

bool rdv_wanted(void) {
    if (getenv("OMPI_COMM_WORLD_SIZE")) return false;
    return env_num("WORLD_SIZE") > 1 && getenv("LOCAL_RANK") && getenv("MASTER_PORT") &&
           env_num("LOCAL_WORLD_SIZE") != 1;
}

static double timeout_seconds(void) {
    int t = env_num("SPES_RENDEZVOUS_TIMEOUT");
    return t > 0 ? t : 60;
}

// ---- sockets: whole writes and reads, reads bounded by a deadline ----
static int write_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return spes_fail("rendezvous: write failed: %s", k < 0 ? strerror(errno) : "closed");
        p += k, n -= (size_t)k;
    }
    return SPES_OK;
}

static int read_all(int fd, void *buf, size_t n, double deadline, const char *what) {
    char *p = buf;
    while (n > 0) {
        int ms = (int)((deadline - now_seconds()) * 1000);
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int ready = ms > 0 ? poll(&pfd, 1, ms) : 0;
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0)
            return spes_fail("rendezvous: no %s within %.0f s (SPES_RENDEZVOUS_TIMEOUT)", what, timeout_seconds());
        ssize_t k = read(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return spes_fail("rendezvous: connection closed while waiting for %s", what);
        p += k, n -= (size_t)k;
    }
    return SPES_OK;
}

// A string as a 4-byte length and its bytes (at most 4095 bytes: URIs and MPI port names).
static int send_str(int fd, const char *s) {
    uint32_t n = (uint32_t)strlen(s);
    SPES_TRY(write_all(fd, &n, sizeof n));
    return write_all(fd, s, n);
}

static int recv_str(int fd, char *out, size_t cap, double deadline, const char *what) {
    uint32_t n;
    SPES_TRY(read_all(fd, &n, sizeof n, deadline, what));
    if (n >= cap) return spes_fail("rendezvous: %s of %u bytes is longer than %zu", what, n, cap - 1);
    SPES_TRY(read_all(fd, out, n, deadline, what));
    out[n] = '\0';
    return SPES_OK;
}

// ---- rank 0: ompi-server and the listening socket ----
static int start_server(Rendezvous *r, char *uri, size_t cap, double deadline) {
    snprintf(r->uri_file, sizeof r->uri_file, "/tmp/spes-ompi-server-%d.uri", (int)getpid());
    unlink(r->uri_file);
    pid_t pid = fork();
    if (pid < 0) return spes_fail("rendezvous: fork for ompi-server failed: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGTERM);   // it ends with rank 0, however rank 0 ends
        execlp("ompi-server", "ompi-server", "--no-daemonize", "-r", r->uri_file, (char *)NULL);
        _exit(127);
    }
    r->server = pid;
    while (now_seconds() < deadline) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            r->server = 0;
            return spes_fail("rendezvous: ompi-server exited (status %d) before writing its URI; is OpenMPI's "
                             "ompi-server installed (openmpi-bin)?",
                             WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        }
        FILE *f = fopen(r->uri_file, "r");
        if (f) {
            bool got = fgets(uri, (int)cap, f) != NULL;
            fclose(f);
            size_t n = got ? strlen(uri) : 0;
            if (n > 0 && uri[n - 1] == '\n') {   // the whole line is written
                uri[n - 1] = '\0';
                unlink(r->uri_file);   // read once: nothing is left behind, however rank 0 ends
                return SPES_OK;
            }
        }
        usleep(20000);
    }
    return spes_fail("rendezvous: ompi-server wrote no URI to %s within %.0f s", r->uri_file, timeout_seconds());
}

// The rendezvous socket: an abstract Unix socket named after MASTER_ADDR and MASTER_PORT. The
// ranks are one node's, and MASTER_PORT itself is taken under torchrun (its agent's store
// listens there), so the name only borrows the job's unique (address, port) pair.
static socklen_t rendezvous_address(const char *host, int port, struct sockaddr_un *a) {
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    // sun_path[0] = '\0': the abstract namespace (no file; gone when the socket closes).
    int n = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "spes-rendezvous-%s-%d", host, port);
    if (n < 0 || (size_t)n >= sizeof a->sun_path - 1) n = (int)sizeof a->sun_path - 2;
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static int listen_on(const char *host, int port, int *out) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return spes_fail("rendezvous: socket: %s", strerror(errno));
    struct sockaddr_un a;
    socklen_t len = rendezvous_address(host, port, &a);
    if (bind(fd, (struct sockaddr *)&a, len) != 0 || listen(fd, 64) != 0) {
        int err = errno;
        close(fd);
        return spes_fail("rendezvous: rank 0 cannot listen on @%s: %s (another job with the same MASTER_ADDR and "
                         "MASTER_PORT on this node?)",
                         a.sun_path + 1, strerror(err));
    }
    *out = fd;
    return SPES_OK;
}

// The user a connected Unix socket's other end runs as (SO_PEERCRED: its credentials when it
// connected or listened, which it cannot forge) and its pid.
static int peer_of(int fd, uid_t *uid, pid_t *pid) {
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
        return spes_fail("rendezvous: cannot tell who is on the other end of a socket (SO_PEERCRED): %s", strerror(errno));
    *uid = cred.uid, *pid = cred.pid;
    return SPES_OK;
}

// A connection whose hello (RANK, WORLD_SIZE: two int32) is not complete yet.
typedef struct {
    int fd;
    pid_t pid;
    double until;
    int32_t hello[2];
    size_t got;   // bytes of hello read
} Pending;

static void drop_pending(Pending *p, int *n, int i) {
    close(p[i].fd);
    p[i] = p[--*n];
}

// Every other rank connects and says its RANK and WORLD_SIZE: fds[k] is rank k's socket.
// The abstract socket has no file permissions, so anyone on the node can connect: a
// connection from another user is refused at once (the job's user is the trust boundary: it
// can ptrace the ranks anyway), and each connection gets HELLO_SECONDS to say who it is,
// read concurrently, so a silent or slow one delays nobody.
static int gather_ranks(Rendezvous *r, int lfd, double deadline) {
    Pending pend[MAX_PENDING];
    struct pollfd pfd[MAX_PENDING + 1];
    int n_pend = 0, rc = SPES_OK;
    uid_t me = geteuid();
    for (int joined = 0; rc == SPES_OK && joined < r->size - 1;) {
        double now = now_seconds(), wake = deadline;
        for (int i = 0; i < n_pend;) {
            if (pend[i].until <= now) {
                log_warn("rendezvous: a connection to rank 0 (pid %d) said nothing within %.0f s: dropped (not a spes "
                         "rank?)",
                         (int)pend[i].pid, HELLO_SECONDS);
                drop_pending(pend, &n_pend, i);
                continue;
            }
            if (pend[i].until < wake) wake = pend[i].until;
            i++;
        }
        if (now >= deadline) {
            char missing[256] = "";
            for (int k = 1, at = 0; k < r->size && at < (int)sizeof missing - 12; k++)
                if (r->fds[k] < 0) at += snprintf(missing + at, sizeof missing - (size_t)at, " %d", k);
            rc = spes_fail("rendezvous: %d of %d ranks connected to rank 0 within %.0f s; missing:%s "
                           "(SPES_RENDEZVOUS_TIMEOUT)",
                           joined + 1, r->size, timeout_seconds(), missing);
            break;
        }
        int n = 0;
        bool listening = n_pend < MAX_PENDING;   // else new connections wait in the backlog
        for (int i = 0; i < n_pend; i++) pfd[n++] = (struct pollfd){.fd = pend[i].fd, .events = POLLIN};
        if (listening) pfd[n++] = (struct pollfd){.fd = lfd, .events = POLLIN};
        int ms = (int)((wake - now) * 1000) + 1;
        int ready = poll(pfd, (nfds_t)n, ms);
        if (ready < 0 && errno == EINTR) continue;
        if (ready < 0) {
            rc = spes_fail("rendezvous: poll: %s", strerror(errno));
            break;
        }
        // Hellos first (pfd[i] is pend[i]; walked backwards because drop_pending moves the last one).
        for (int i = n_pend - 1; i >= 0 && rc == SPES_OK; i--) {
            if (!pfd[i].revents) continue;
            Pending *p = &pend[i];
            ssize_t k = recv(p->fd, (char *)p->hello + p->got, sizeof p->hello - p->got, MSG_DONTWAIT);
            if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
            if (k <= 0) {   // closed before saying who it is: not one of ours
                drop_pending(pend, &n_pend, i);
                continue;
            }
            if ((p->got += (size_t)k) < sizeof p->hello) continue;
            int32_t rank = p->hello[0], size = p->hello[1];
            if (rank < 1 || rank >= r->size) {
                log_warn("rendezvous: a connection to rank 0 (pid %d) says RANK=%d, not one of 1..%d: dropped",
                         (int)p->pid, (int)rank, r->size - 1);
                drop_pending(pend, &n_pend, i);
            } else if (size != r->size) {
                rc = spes_fail("rendezvous: rank %d (pid %d) says WORLD_SIZE=%d, rank 0 has WORLD_SIZE=%d; every rank "
                               "needs the same WORLD_SIZE",
                               (int)rank, (int)p->pid, (int)size, r->size);
            } else if (r->fds[rank] >= 0) {
                rc = spes_fail("rendezvous: two processes say RANK=%d (the second is pid %d); each rank needs its own "
                               "RANK",
                               (int)rank, (int)p->pid);
            } else {
                r->fds[rank] = p->fd;
                p->fd = -1;
                pend[i] = pend[--n_pend];
                joined++;
            }
        }
        if (rc != SPES_OK || !listening || !(pfd[n - 1].revents & POLLIN)) continue;
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        uid_t uid = 0;
        pid_t pid = 0;
        if (peer_of(fd, &uid, &pid) != SPES_OK) {
            close(fd);
            rc = SPES_ERR;
        } else if (uid != me) {
            log_warn("rendezvous: refused a connection from uid %d (pid %d): ranks run as this job's user (uid %d)",
                     (int)uid, (int)pid, (int)me);
            close(fd);
        } else {
            pend[n_pend++] = (Pending){.fd = fd, .pid = pid, .until = now_seconds() + HELLO_SECONDS};
        }
    }
    for (int i = 0; i < n_pend; i++) close(pend[i].fd);
    return rc;
}

// ---- the other ranks: connect to rank 0, retrying until it listens ----
static int connect_to(const char *host, int port, double deadline, int *out) {
    struct sockaddr_un a;
    socklen_t len = rendezvous_address(host, port, &a);
    int err = 0;
    while (now_seconds() < deadline) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0 && connect(fd, (struct sockaddr *)&a, len) == 0) {
            // Whoever listens there gets this rank's trust (it hands out the ompi-server and
            // the MPI port): it must be this job's user, as rank 0 checks the other way round.
            uid_t uid = 0;
            pid_t pid = 0;
            if (peer_of(fd, &uid, &pid) != SPES_OK) return close(fd), SPES_ERR;
            if (uid != geteuid()) {
                close(fd);
                return spes_fail("rendezvous: @%s is held by a process of another user (uid %d, pid %d), not by rank 0 "
                                 "of this job (uid %d); use another MASTER_PORT",
                                 a.sun_path + 1, (int)uid, (int)pid, (int)geteuid());
            }
            *out = fd;
            return SPES_OK;
        }
        err = errno;
        if (fd >= 0) close(fd);
        usleep(100000);
    }
    return spes_fail("rendezvous: cannot reach rank 0 at @%s within %.0f s: %s (is RANK=0 running on this node, "
                     "with the same MASTER_ADDR/MASTER_PORT?)",
                     a.sun_path + 1, timeout_seconds(), strerror(err));
}

// ---- the watchdog ----
// From the end of step 1 to comm_finalize. It never reads (the join still sends port names
// over these sockets): POLLRDHUP says the other end closed. Until the join is done it also
// bounds steps 2-3, which MPI cannot: MPI_Init and MPI_Comm_accept have no timeout, and a
// process that said RANK=k but never connects to the MPI port would hold every rank forever.
static void *watch(void *arg) {
    Rendezvous *r = arg;
    int n = r->rank == 0 ? r->size - 1 : 1;
    struct pollfd *p = calloc((size_t)n + 1, sizeof *p);
    if (!p) {
        fprintf(stderr, "spes: rank %d of %d: out of memory starting the rendezvous watchdog\n", r->rank, r->size);
        _exit(1);   // without it a dead rank or a stuck join would hang this one
    }
    for (int i = 0; i < n; i++)
        p[i] = (struct pollfd){.fd = r->rank == 0 ? r->fds[i + 1] : r->fds[0], .events = POLLRDHUP};
    p[n] = (struct pollfd){.fd = r->wake[0], .events = POLLIN};
    for (;;) {
        int ms = -1;
        if (!atomic_load(&r->joined)) {
            double left = r->join_deadline - now_seconds();
            if (left <= 0) {
                int k = atomic_load(&r->waiting_for);
                if (k > 0)
                    fprintf(stderr, "spes: rank %d of %d: rendezvous: rank %d did not join the MPI communicator within "
                                    "%.0f s (SPES_RENDEZVOUS_TIMEOUT): the process that said RANK=%d is not a working "
                                    "spes rank of this job\n",
                            r->rank, r->size, k, timeout_seconds(), k);
                else if (k < 0)
                    fprintf(stderr, "spes: rank %d of %d: rendezvous: rank 0 did not hand over the MPI port within %.0f "
                                    "s (SPES_RENDEZVOUS_TIMEOUT): a lower rank did not join\n",
                            r->rank, r->size, timeout_seconds());
                else
                    fprintf(stderr, "spes: rank %d of %d: rendezvous: MPI_Init did not finish within %.0f s "
                                    "(SPES_RENDEZVOUS_TIMEOUT)\n",
                            r->rank, r->size, timeout_seconds());
                _exit(1);   // this thread cannot interrupt MPI: ending the process is the bound
            }
            ms = (int)(left * 1000) + 1;
        }
        int ready = poll(p, (nfds_t)n + 1, ms);
        if (ready < 0 && errno != EINTR) break;
        if (atomic_load(&r->finishing) || p[n].revents) break;
        for (int i = 0; ready > 0 && i < n; i++) {
            if (!(p[i].revents & (POLLRDHUP | POLLHUP | POLLERR))) continue;
            if (atomic_load(&r->finishing)) break;
            int gone = r->rank == 0 ? i + 1 : 0;
            fprintf(stderr, "spes: rank %d of %d: rank %d is gone (its rendezvous socket closed: it exited or was "
                            "killed); ending this rank too\n",
                    r->rank, r->size, gone);
            _exit(1);   // no launcher ends the job for us: this is that launcher's job
        }
    }
    free(p);
    return NULL;
}

static int mpi_call(int code, const char *what) {
    if (code == MPI_SUCCESS) return SPES_OK;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(code, msg, &len);
    return spes_fail("rendezvous: %s failed: %s", what, msg);
}

// `*comm` (ranks 0..k-1) accepts one more rank on the port: afterwards it holds 0..k, the new
// one last (MPI_Intercomm_merge puts the `high` side after the other).
static int accept_next(MPI_Comm *comm, const char *port) {
    MPI_Comm inter, merged;
    SPES_TRY(mpi_call(MPI_Comm_accept(port, MPI_INFO_NULL, 0, *comm, &inter), "MPI_Comm_accept"));
    SPES_TRY(mpi_call(MPI_Intercomm_merge(inter, 0, &merged), "MPI_Intercomm_merge"));
    MPI_Comm_free(&inter);
    if (*comm != MPI_COMM_SELF) MPI_Comm_free(comm);
    *comm = merged;
    return SPES_OK;
}

// Step 3 of rendezvous.h: rank k connects when rank 0 sends it the port name, which it does
// when ranks 0..k-1 are about to accept; then rank k takes part in accepting k+1, ...
static int join_in_rank_order(Rendezvous *r, MPI_Comm *comm) {
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);   // failures become messages
    char port[MPI_MAX_PORT_NAME];
    *comm = MPI_COMM_SELF;
    if (r->rank == 0) {
        SPES_TRY(mpi_call(MPI_Open_port(MPI_INFO_NULL, port), "MPI_Open_port"));
    } else {
        MPI_Comm inter;
        atomic_store(&r->waiting_for, -1);
        SPES_TRY(recv_str(r->fds[0], port, sizeof port, r->join_deadline, "the MPI port name from rank 0"));
        SPES_TRY(mpi_call(MPI_Comm_connect(port, MPI_INFO_NULL, 0, MPI_COMM_SELF, &inter), "MPI_Comm_connect"));
        SPES_TRY(mpi_call(MPI_Intercomm_merge(inter, 1, comm), "MPI_Intercomm_merge"));
        MPI_Comm_free(&inter);
    }
    for (int k = r->rank + 1; k < r->size; k++) {
        atomic_store(&r->waiting_for, k);
        if (r->rank == 0) SPES_TRY(send_str(r->fds[k], port));
        SPES_TRY(accept_next(comm, port));
    }
    if (r->rank == 0) MPI_Close_port(port);
    int got_rank = -1, got_size = -1;
    MPI_Comm_rank(*comm, &got_rank);
    MPI_Comm_size(*comm, &got_size);
    if (got_rank != r->rank || got_size != r->size)
        return spes_fail("rendezvous: joined as rank %d of %d, expected RANK=%d of WORLD_SIZE=%d", got_rank, got_size,
                         r->rank, r->size);
    return SPES_OK;
}

int rdv_join(Rendezvous **out, MPI_Comm *world, int *rank, int *size, int *local_rank) {
    *out = NULL;
    int rk = env_num("RANK"), ws = env_num("WORLD_SIZE"), lr = env_num("LOCAL_RANK"), lws = env_num("LOCAL_WORLD_SIZE");
    int port = env_num("MASTER_PORT");
    const char *host = getenv("MASTER_ADDR");
    if (!host || !*host) host = "127.0.0.1";
    if (rk < 0 || rk >= ws)
        return spes_fail("torchrun-style ranks: RANK=%s must be a number in [0, WORLD_SIZE=%d)",
                         getenv("RANK") ? getenv("RANK") : "(unset)", ws);
    if (lr < 0) return spes_fail("torchrun-style ranks: LOCAL_RANK=%s is not a number", getenv("LOCAL_RANK"));
    if (port < 1 || port > 65535)
        return spes_fail("torchrun-style ranks: MASTER_PORT=%s is not a port", getenv("MASTER_PORT"));
    if (lws > 0 && lws != ws)
        return spes_fail("torchrun-style ranks: WORLD_SIZE=%d spans several nodes (LOCAL_WORLD_SIZE=%d): spes ranks "
                         "are one node's, and nodes sync through the SPES parameter server; start one job per node "
                         "(torchrun --nnodes 1, or scripts/run_cluster.sh)",
                         ws, lws);
    Rendezvous *r = spes_calloc(1, sizeof *r);
    if (!r) return SPES_ERR;
    r->rank = rk;
    r->size = ws;
    r->wake[0] = r->wake[1] = -1;
    int rc = SPES_OK, lfd = -1;
    if (!(r->fds = spes_calloc((size_t)ws, sizeof *r->fds))) rc = SPES_ERR;
    for (int k = 0; rc == SPES_OK && k < ws; k++) r->fds[k] = -1;
    signal(SIGPIPE, SIG_IGN);   // a peer that went away must be an error, not a silent death
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
    double deadline = now_seconds() + timeout_seconds();
    char uri[1024];
    // Step 1: the server's URI reaches every rank.
    if (rc == SPES_OK && rk == 0) {
        rc = listen_on(host, port, &lfd);
        if (rc == SPES_OK) rc = start_server(r, uri, sizeof uri, deadline);
        if (rc == SPES_OK) rc = gather_ranks(r, lfd, deadline);
        for (int k = 1; rc == SPES_OK && k < ws; k++) rc = send_str(r->fds[k], uri);
        if (lfd >= 0) close(lfd);
    } else if (rc == SPES_OK) {
        int32_t hello[2] = {rk, ws};
        rc = connect_to(host, port, deadline, &r->fds[0]);
        if (rc == SPES_OK) rc = write_all(r->fds[0], hello, sizeof hello);
        if (rc == SPES_OK) rc = recv_str(r->fds[0], uri, sizeof uri, deadline, "the ompi-server URI from rank 0");
    }
    // From here on the watchdog bounds steps 2-3 and notices a rank that dies.
    r->join_deadline = now_seconds() + timeout_seconds();
    if (rc == SPES_OK && pipe2(r->wake, O_CLOEXEC) != 0) rc = spes_fail("rendezvous: pipe: %s", strerror(errno));
    if (rc == SPES_OK && pthread_create(&r->watchdog, NULL, watch, r) != 0)
        rc = spes_fail("rendezvous: cannot start the watchdog thread");
    if (rc == SPES_OK) r->watching = true;
    // Step 2: singletons that know the server.
    if (rc == SPES_OK) {
        setenv("OMPI_MCA_pmix_server_uri", uri, 1);
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            rc = spes_fail("rendezvous: MPI_Init failed (rank %d of %d, ompi-server %s)", rk, ws, uri);
    }
    if (rc != SPES_OK) {
        rdv_close(r);
        return SPES_ERR;
    }
    // Step 3: one communicator of every rank, in RANK order.
    MPI_Comm comm = MPI_COMM_SELF;
    rc = join_in_rank_order(r, &comm);
    if (rc != SPES_OK) {
        MPI_Finalize();
        rdv_close(r);
        return SPES_ERR;
    }
    atomic_store(&r->joined, true);
    r->watching = true;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_ARE_FATAL);
    *world = comm;
    *rank = rk;
    *size = ws;
    *local_rank = lr;
    *out = r;
    return SPES_OK;
}

int rdv_finish(Rendezvous *r, MPI_Comm world) {
    if (!r) return SPES_OK;
    // Two barriers: after the first every rank is done; after the second every rank's
    // watchdog is stopped, so closing a socket is no longer read as a death.
    MPI_Barrier(world);
    atomic_store(&r->finishing, true);
    if (r->watching) {
        char byte = 1;
        if (write(r->wake[1], &byte, 1) < 0) {}   // the flag alone stops it at its next wake-up
        pthread_join(r->watchdog, NULL);
        r->watching = false;
    }
    MPI_Barrier(world);
    return SPES_OK;
}

void rdv_close(Rendezvous *r) {
    if (!r) return;
    if (r->watching) {   // an error path: stop the watchdog before its sockets close
        atomic_store(&r->finishing, true);
        char byte = 1;
        if (write(r->wake[1], &byte, 1) < 0) {}
        pthread_join(r->watchdog, NULL);
    }
    for (int k = 0; r->fds && k < r->size; k++)
        if (r->fds[k] >= 0) close(r->fds[k]);
    if (r->wake[0] >= 0) close(r->wake[0]), close(r->wake[1]);
    if (r->server > 0) {
        kill(r->server, SIGTERM);
        waitpid(r->server, NULL, 0);
        unlink(r->uri_file);   // when it never got read
    }
    free(r->fds);
    free(r);
}
