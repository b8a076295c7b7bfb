// libFuzzer harness: the Parquet string-column reader on arbitrary bytes (column "text").
#include <stdint.h>

#include "documents/parquet_reader.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ParquetStringReader *r;
    if (parquet_string_reader_open_memory(data, size, "fuzz.parquet", "text", &r) != 0) return 0;
    const uint8_t *value;
    size_t len;
    volatile uint8_t sink = 0;
    while (parquet_string_reader_next(r, &value, &len) == 1)
        if (len) sink ^= value[0] ^ value[len - 1];   // every value must be readable
    parquet_string_reader_close(r);
    return 0;
}
