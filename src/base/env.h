// Numbers from the environment (launchers' variables: WORLD_SIZE, OMPI_COMM_WORLD_SIZE, ...).
#pragma once

// The non-negative decimal int in environment variable `name`: `unset` when it is unset or
// empty, `bad` when it is anything else (a sign, trailing text, beyond INT_MAX).
int env_int(const char *name, int unset, int bad);
