// A byte count for people: three significant digits in the decimal unit that fits
// ("8.57 GB", "529 kB", "12 B"), as `spes plan` and the disk-space warnings print them.
#pragma once
#include <stddef.h>

// Writes the text into out (cap >= 16) and returns out.
char *bytes_text(size_t bytes, char *out, size_t cap);
