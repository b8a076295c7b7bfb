// TensorBoard event files. See tfevents.h.
#include "train/tfevents.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/crc32c.h"
#include "base/error.h"
#include "base/file.h"
#include "base/log.h"
#include "tfevents.pb-c.h"

#define EVENT_FILE_PREFIX "events.out.tfevents."

// ---- framing ----

uint32_t tfrecord_masked_crc(const void *data, size_t len) {
    uint32_t crc = crc32c(data, len);
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static void put_le(uint8_t *out, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) out[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *in, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)in[i] << (8 * i);
    return v;
}

void tfrecord_frame(const uint8_t *payload, size_t len, uint8_t *out) {
    put_le(out, len, 8);
    put_le(out + 8, tfrecord_masked_crc(out, 8), 4);
    memmove(out + 12, payload, len);   // payload may already sit at out + 12
    put_le(out + 12 + len, tfrecord_masked_crc(out + 12, len), 4);
}

TfRecordStatus tfrecord_next(const uint8_t *data, size_t size, size_t *at, const uint8_t **payload, size_t *len) {
    size_t left = size - *at;
    if (left == 0) return TFRECORD_END;
    const uint8_t *rec = data + *at;
    if (left < 12) return TFRECORD_TRUNCATED;
    if (get_le(rec + 8, 4) != tfrecord_masked_crc(rec, 8)) return TFRECORD_CORRUPT;
    uint64_t n = get_le(rec, 8);
    if (n > left - 12 || left - 12 - n < 4) return TFRECORD_TRUNCATED;
    if (get_le(rec + 12 + n, 4) != tfrecord_masked_crc(rec + 12, (size_t)n)) return TFRECORD_CORRUPT;
    *payload = rec + 12;
    *len = (size_t)n;
    *at += 12 + (size_t)n + 4;
    return TFRECORD_OK;
}

// ---- writing ----

// The framed record of event (caller frees), or NULL when out of memory.
static uint8_t *frame_event(const Tensorflow__Event *event, size_t *total) {
    size_t n = tensorflow__event__get_packed_size(event);
    uint8_t *rec = spes_malloc(n + TFRECORD_OVERHEAD);
    if (!rec) return NULL;
    tensorflow__event__pack(event, rec + 12);
    tfrecord_frame(rec + 12, n, rec);
    *total = n + TFRECORD_OVERHEAD;
    return rec;
}

// One whole record with one write() (see the header: crash safety); a failure is the file's
// (counted and said, base/append_log.h), not the run's.
static int write_event(TfEvents *ev, const Tensorflow__Event *event) {
    size_t total;
    uint8_t *rec = frame_event(event, &total);
    if (!rec) return spes_fail_context("event file %s", ev->path);
    append_log_write(&ev->file, rec, total, event->step);
    free(rec);
    return SPES_OK;
}

int tfevents_write_scalars(TfEvents *ev, int64_t step, double wall_time, const TfScalar *values, int n) {
    Tensorflow__Summary__Value *vals = spes_calloc((size_t)(n > 0 ? n : 1), sizeof *vals);
    Tensorflow__Summary__Value **ptrs = spes_calloc((size_t)(n > 0 ? n : 1), sizeof *ptrs);
    int rc = SPES_ERR;
    if (vals && ptrs) {
        for (int i = 0; i < n; i++) {
            tensorflow__summary__value__init(&vals[i]);
            vals[i].tag = (char *)values[i].tag;
            vals[i].value_case = TENSORFLOW__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
            vals[i].simple_value = (float)values[i].value;
            ptrs[i] = &vals[i];
        }
        Tensorflow__Summary summary = TENSORFLOW__SUMMARY__INIT;
        summary.n_value = (size_t)n;
        summary.value = ptrs;
        Tensorflow__Event event = TENSORFLOW__EVENT__INIT;
        event.wall_time = wall_time;
        event.step = step;
        event.what_case = TENSORFLOW__EVENT__WHAT_SUMMARY;
        event.summary = &summary;
        rc = write_event(ev, &event);
    } else {
        spes_fail_context("event file %s", ev->path);
    }
    free(vals);
    free(ptrs);
    return rc;
}

static double wall_clock(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + tv.tv_usec * 1e-6;
}

// ---- resume: trimming the files of an earlier run ----

// Keeps the records of steps <= keep_through_step (and file_version records) of one file.
// A torn last record is dropped quietly (a crash mid-write); a corrupt one, and all after
// it, with a warning naming the file and offset. The file is rewritten only if it changes.
static int trim_file(const char *path, int64_t keep_through_step) {
    uint8_t *data;
    size_t size;
    SPES_TRY(file_read_all(path, &data, &size));
    uint8_t *kept = spes_malloc(size + 1);
    if (!kept) {
        free(data);
        return SPES_ERR;
    }
    size_t at = 0, kept_len = 0;
    int scalars = 0;
    for (;;) {
        size_t start = at, len;
        const uint8_t *payload;
        TfRecordStatus st = tfrecord_next(data, size, &at, &payload, &len);
        if (st == TFRECORD_END || st == TFRECORD_TRUNCATED) break;
        Tensorflow__Event *event = st == TFRECORD_OK ? tensorflow__event__unpack(NULL, len, payload) : NULL;
        if (!event) {
            log_warn("%s: the record at byte %zu is damaged (%s); it and everything after it are dropped", path, start,
                     st == TFRECORD_OK ? "not an Event" : "checksum mismatch");
            break;
        }
        bool keep = event->what_case != TENSORFLOW__EVENT__WHAT_SUMMARY || event->step <= keep_through_step;
        scalars += keep && event->what_case == TENSORFLOW__EVENT__WHAT_SUMMARY;
        tensorflow__event__free_unpacked(event, NULL);
        if (keep) {
            memcpy(kept + kept_len, data + start, at - start);
            kept_len += at - start;
        }
    }
    int rc = SPES_OK;
    if (scalars == 0) {
        if (unlink(path) != 0) rc = spes_fail("cannot remove %s: %s", path, strerror(errno));
    } else if (kept_len != size) {
        rc = file_write_atomic(path, kept, kept_len);
    }
    free(kept);
    free(data);
    return rc;
}

static int trim_dir(const char *dir, int64_t keep_through_step) {
    DIR *d = opendir(dir);
    if (!d) return spes_fail("cannot list %s: %s", dir, strerror(errno));
    int rc = SPES_OK;
    struct dirent *e;
    while (rc == SPES_OK && (e = readdir(d))) {
        if (strncmp(e->d_name, EVENT_FILE_PREFIX, strlen(EVENT_FILE_PREFIX)) != 0) continue;
        if (strstr(e->d_name, ".tmp.")) continue;   // an atomic write's leftover, not a record file
        char *path = path_join(dir, e->d_name);
        rc = path ? trim_file(path, keep_through_step) : SPES_ERR;
        free(path);
    }
    closedir(d);
    return rc;
}

// ---- open / close ----

int tfevents_open(TfEvents *ev, const char *dir, int64_t keep_through_step) {
    static atomic_int files_opened;   // TensorFlow's own names end in a per-process counter too
    ev->open = false;
    ev->path = NULL;
    if (trim_dir(dir, keep_through_step) != SPES_OK) return spes_fail_context("event files in %s", dir);
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "localhost");
    for (char *c = host; *c; c++)
        if (*c == '/') *c = '_';
    double now = wall_clock();
    char name[400];
    snprintf(name, sizeof name, EVENT_FILE_PREFIX "%010" PRId64 ".%s.%d.%d", (int64_t)now, host, (int)getpid(),
             atomic_fetch_add(&files_opened, 1));
    if (!(ev->path = path_join(dir, name))) return SPES_ERR;
    // The file_version record: the file's header, also of a file started anew (append_log.h).
    Tensorflow__Event first = TENSORFLOW__EVENT__INIT;
    first.wall_time = now;
    first.what_case = TENSORFLOW__EVENT__WHAT_FILE_VERSION;
    first.file_version = "brain.Event:2";
    size_t header_len;
    uint8_t *header = frame_event(&first, &header_len);
    int rc = header ? append_log_open(&ev->file, ev->path, "record", true, header, header_len) : SPES_ERR;
    free(header);
    if (rc != SPES_OK) {
        free(ev->path);
        ev->path = NULL;
        return SPES_ERR;
    }
    ev->open = true;
    return SPES_OK;
}

void tfevents_close(TfEvents *ev) {
    if (ev->open) append_log_close(&ev->file);
    free(ev->path);
    ev->open = false;
    ev->path = NULL;
}

double tfevents_wall_clock(void) { return wall_clock(); }
