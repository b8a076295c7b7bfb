// Thread count for our OpenMP kernels and OpenBLAS (the OpenMP build, so both share one
// pool and never oversubscribe). Default: SPES_NUM_THREADS, else OMP_NUM_THREADS, else all cores.
#pragma once

void threads_set(int n);     // n <= 0: the default above
int threads_get(void);
