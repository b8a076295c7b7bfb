#include "base/threads.h"

#include <omp.h>
#include <stdlib.h>

void openblas_set_num_threads(int num_threads);

static int current_threads = 0;

void threads_set(int n) {
    if (n <= 0) {
        const char *env = getenv("SPES_NUM_THREADS");
        if (!env) env = getenv("OMP_NUM_THREADS");
        n = env ? atoi(env) : 0;
        if (n <= 0) n = omp_get_num_procs();
    }
    current_threads = n;
    omp_set_num_threads(n);
    openblas_set_num_threads(n);
}

int threads_get(void) {
    if (current_threads == 0) threads_set(0);
    return current_threads;
}
