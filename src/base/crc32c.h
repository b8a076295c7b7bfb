// CRC-32C (Castagnoli), the standard one: crc32c("123456789", 9) = 0xe3069283. The checksum of
// TensorBoard's record framing (train/tfevents.c) and of the server's state dir (server/server_state.c).
#pragma once
#include <stddef.h>
#include <stdint.h>

uint32_t crc32c(const void *data, size_t len);
