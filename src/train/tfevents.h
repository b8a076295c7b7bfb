// TensorBoard event files: save_folder/events.out.tfevents.<time>.<host>.<pid>.<n>, beside
// metrics.jsonl, holding the same scalars, so TensorBoard shows a run (`tensorboard --logdir
// save_folder`) and W&B imports it (`wandb sync --sync-tensorboard save_folder`).
//
// A file is a sequence of TFRecords, each
//   uint64 length | uint32 masked_crc32c(length bytes) | payload[length] | uint32 masked_crc32c(payload)
// (little endian; masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8, CRC-32C/Castagnoli), the
// payload a serialised tensorflow.Event (proto/tfevents.proto): first {file_version:
// "brain.Event:2"}, then one Event per metrics line with a Summary of simple_value scalars.
//
// Crash safety: every record is assembled in memory and handed to the kernel with one
// write() on an O_APPEND descriptor as soon as its line is logged (no user-space buffering),
// so the file only ever ends in whole records, or, if the machine dies mid-write or the disk
// fills, in one torn record that tfevents_open drops at the next start (readers stop there).
// A record cut short by a full disk is truncated off again, and a record the disk does not take
// is lost, counted and said, without failing the run (base/append_log.h): each later one is tried
// again, so the file goes on in whole records when space comes back.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/append_log.h"

typedef struct {
    AppendLog file;             // valid while open
    bool open;
    char *path;
} TfEvents;

typedef struct {
    const char *tag;            // e.g. "train/loss"
    double value;               // stored as float (TensorBoard's simple_value)
} TfScalar;

// Resume: in every event file already in dir, drops the records of steps greater than
// keep_through_step and a torn last record (each file rewritten atomically; a file left with
// no scalars is removed), as metrics_open does with metrics.jsonl. Then opens a new file and
// writes its file_version record.
int tfevents_open(TfEvents *ev, const char *dir, int64_t keep_through_step);
void tfevents_close(TfEvents *ev);
// One Event at step: a Summary with the n scalars. NaN and infinities are stored as they are.
int tfevents_write_scalars(TfEvents *ev, int64_t step, double wall_time, const TfScalar *values, int n);
// Seconds since the Unix epoch (an Event's wall_time).
double tfevents_wall_clock(void);

// ---- TFRecord framing (shared by the writer, the resume trim and the tests) ----

#define TFRECORD_OVERHEAD 16    // 8 length + 4 length crc + 4 payload crc
// The masked CRC-32C of the framing above (base/crc32c.h).
uint32_t tfrecord_masked_crc(const void *data, size_t len);
// Writes the record of payload into out (len + TFRECORD_OVERHEAD bytes).
void tfrecord_frame(const uint8_t *payload, size_t len, uint8_t *out);

typedef enum {
    TFRECORD_OK,                // *payload, *len set; *at moved past the record
    TFRECORD_END,               // *at == size: no more records
    TFRECORD_TRUNCATED,         // the bytes end inside a record (a torn write)
    TFRECORD_CORRUPT,           // a length or payload checksum does not match
} TfRecordStatus;
// The record starting at *at in data[0, size).
TfRecordStatus tfrecord_next(const uint8_t *data, size_t size, size_t *at, const uint8_t **payload, size_t *len);
