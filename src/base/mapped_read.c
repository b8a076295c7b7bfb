#include "base/mapped_read.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stddef.h>

#include "base/error.h"

// The thread's jump back into mapped_read while its read runs (SIGBUS for a bad page is
// delivered to the thread that touched it).
static _Thread_local sigjmp_buf *read_in_progress;
static struct sigaction before;   // the handler ours replaced (MPI's, or the default)

static void on_sigbus(int sig, siginfo_t *info, void *uctx) {
    (void)info, (void)uctx;
    if (read_in_progress) siglongjmp(*read_in_progress, 1);
    // Not a guarded read: the handler before ours takes it when the faulting access runs again.
    sigaction(sig, &before, NULL);
}

// Checked at every read, not once: a library may install its own handler after ours (MPI at
// its start, a test framework around each test), and ours goes back in front of it.
static void ensure_handler(void) {
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    struct sigaction now;
    if (sigaction(SIGBUS, NULL, &now) == 0 && now.sa_sigaction != on_sigbus) {
        struct sigaction sa = {0};
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGBUS, &sa, &before);
    }
    pthread_mutex_unlock(&mu);
}

int mapped_read(int (*read)(void *ctx), void *ctx, bool *truncated) {
    ensure_handler();
    *truncated = false;
    sigjmp_buf jump;
    // savemask 1: the jump out of the handler also unblocks SIGBUS for the next read.
    if (sigsetjmp(jump, 1)) {
        read_in_progress = NULL;
        *truncated = true;
        return SPES_ERR;
    }
    read_in_progress = &jump;
    int rc = read(ctx);
    read_in_progress = NULL;
    return rc;
}
