// Time: a monotonic clock for throughput, ETA figures and durations, and the wall clock for
// times shown to people (the status page, `spes status`).
#pragma once
double now_seconds(void);    // monotonic, seconds
double unix_seconds(void);   // wall clock, seconds since the Unix epoch
