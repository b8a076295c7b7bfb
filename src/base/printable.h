// Outside bytes quoted in a message (a manifest line, a file name) go through here first, so a
// control sequence in the data cannot reach the terminal: control characters, DEL and bytes
// that are not valid UTF-8 become \xNN (also \n \t \r \\), and long input is cut with "...".
#pragma once
#include <stdbool.h>
#include <stddef.h>

// Writes the escaped form of s[0..len) into out (always NUL-terminated; cap >= 8); returns out.
char *escape_printable(const char *s, size_t len, char *out, size_t cap);
// True when s[0..len) would be written unchanged (printable ASCII, valid UTF-8 without C1 controls).
bool is_printable(const char *s, size_t len);
