// Wall-clock time for throughput and ETA figures.
#pragma once
double now_seconds(void);   // monotonic, seconds
