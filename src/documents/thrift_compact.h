// A small, bounds-checked decoder for the Thrift COMPACT protocol, enough to read Parquet
// metadata (FileMetaData, PageHeader). Spec:
// https://github.com/apache/thrift/blob/master/doc/specs/thrift-compact-protocol.md
// Every read checks the remaining bytes; failures set an error naming the byte offset.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef enum {
    THRIFT_STOP = 0,
    THRIFT_BOOL_TRUE = 1,    // in a field header the type carries a bool's value
    THRIFT_BOOL_FALSE = 2,
    THRIFT_I8 = 3,
    THRIFT_I16 = 4,
    THRIFT_I32 = 5,
    THRIFT_I64 = 6,
    THRIFT_DOUBLE = 7,
    THRIFT_BINARY = 8,
    THRIFT_LIST = 9,
    THRIFT_SET = 10,
    THRIFT_MAP = 11,
    THRIFT_STRUCT = 12,
} ThriftType;

#define THRIFT_MAX_DEPTH 32

typedef struct {
    const uint8_t *start, *p, *end;
    int depth;               // nesting of structs/containers being skipped
} ThriftReader;

typedef struct {
    int16_t id;
    ThriftType type;         // THRIFT_STOP at the end of a struct
} ThriftField;

void thrift_reader_init(ThriftReader *r, const uint8_t *data, size_t len);
size_t thrift_offset(const ThriftReader *r);

int thrift_read_varint(ThriftReader *r, uint64_t *out);
int thrift_read_i32(ThriftReader *r, int32_t *out);     // zigzag varint, range-checked
int thrift_read_i64(ThriftReader *r, int64_t *out);
int thrift_read_binary(ThriftReader *r, const uint8_t **data, size_t *len);
// The next field header of the struct being read; *last_id is that struct's previous
// field id (start each struct with 0): ids come as deltas from it.
int thrift_read_field(ThriftReader *r, int16_t *last_id, ThriftField *f);
// A list or set header: element type and count (count checked against the bytes left).
int thrift_read_list(ThriftReader *r, ThriftType *elem_type, uint32_t *count);
// Skips a value of the given type (structs and containers recursively, depth-limited).
int thrift_skip(ThriftReader *r, ThriftType type);

// Typed field readers: fail with the field's name when the wire type is not the
// expected one (a bool field is THRIFT_BOOL_TRUE/FALSE).
int thrift_field_i32(ThriftReader *r, const ThriftField *f, const char *name, int32_t *out);
int thrift_field_i64(ThriftReader *r, const ThriftField *f, const char *name, int64_t *out);
int thrift_field_bool(const ThriftField *f, const char *name, int *out);
int thrift_field_binary(ThriftReader *r, const ThriftField *f, const char *name, const uint8_t **data, size_t *len);
int thrift_field_expect(const ThriftField *f, ThriftType type, const char *name);
