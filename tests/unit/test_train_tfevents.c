// TensorBoard event files (src/train/tfevents.c): CRC-32C against its standard check value,
// TFRecord framing read back, every truncation and a flipped byte detected, and the resume
// trim (steps past the checkpoint and a torn last record dropped, emptied files removed).
// The files read back with TensorBoard itself: tests/integration/tfevents_tensorboard.sh.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/crc32c.h"
#include "base/file.h"
#include "tfevents.pb-c.h"
#include "train/tfevents.h"

static void test_crc32c(void **state) {
    (void)state;
    assert_int_equal(crc32c("123456789", 9), 0xe3069283u);   // the CRC-32C check value
    assert_int_equal(crc32c("", 0), 0);
    // TensorFlow's mask of it: rotate right by 15, add 0xa282ead8.
    uint32_t c = 0xe3069283u;
    assert_int_equal(tfrecord_masked_crc("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

static void test_framing_and_damage(void **state) {
    (void)state;
    const uint8_t payload[] = "an event's bytes";
    size_t n = sizeof payload;
    uint8_t rec[sizeof payload + TFRECORD_OVERHEAD];
    tfrecord_frame(payload, n, rec);
    size_t at = 0, len;
    const uint8_t *got;
    assert_int_equal(tfrecord_next(rec, sizeof rec, &at, &got, &len), TFRECORD_OK);
    assert_int_equal(len, n);
    assert_memory_equal(got, payload, n);
    assert_int_equal(at, sizeof rec);
    assert_int_equal(tfrecord_next(rec, sizeof rec, &at, &got, &len), TFRECORD_END);
    // Every cut inside the record is a torn record, never a record.
    for (size_t cut = 1; cut < sizeof rec; cut++) {
        at = 0;
        TfRecordStatus st = tfrecord_next(rec, cut, &at, &got, &len);
        if (st != TFRECORD_TRUNCATED) fail_msg("cut at %zu: status %d, not TRUNCATED", cut, st);
    }
    // Every flipped byte is caught by one of the two checksums (or, in the length, as a
    // record running past the end).
    for (size_t i = 0; i < sizeof rec; i++) {
        uint8_t bad[sizeof rec];
        memcpy(bad, rec, sizeof rec);
        bad[i] ^= 0x20;
        at = 0;
        TfRecordStatus st = tfrecord_next(bad, sizeof bad, &at, &got, &len);
        if (st == TFRECORD_OK) fail_msg("byte %zu flipped: read as a good record", i);
    }
}

// The steps of the summary Events of one file, in order; *torn: it ends in a torn record.
static int read_steps(const char *path, int64_t *steps, int max, bool *torn) {
    uint8_t *data;
    size_t size, at = 0, len;
    assert_int_equal(file_read_all(path, &data, &size), 0);
    const uint8_t *p;
    int n = 0, records = 0;
    TfRecordStatus st;
    while ((st = tfrecord_next(data, size, &at, &p, &len)) == TFRECORD_OK) {
        Tensorflow__Event *e = tensorflow__event__unpack(NULL, len, p);
        assert_non_null(e);
        if (records++ == 0) {
            assert_int_equal(e->what_case, TENSORFLOW__EVENT__WHAT_FILE_VERSION);
            assert_string_equal(e->file_version, "brain.Event:2");
        } else {
            assert_int_equal(e->what_case, TENSORFLOW__EVENT__WHAT_SUMMARY);
            assert_int_equal(e->summary->n_value, 2);
            assert_string_equal(e->summary->value[1]->tag, "train/zero");
            assert_int_equal(e->summary->value[1]->value_case, TENSORFLOW__SUMMARY__VALUE__VALUE_SIMPLE_VALUE);
            assert_true(e->summary->value[0]->simple_value == (float)(e->step * 0.5));
            if (n < max) steps[n++] = e->step;
        }
        tensorflow__event__free_unpacked(e, NULL);
    }
    *torn = st == TFRECORD_TRUNCATED;
    assert_true(st == TFRECORD_END || st == TFRECORD_TRUNCATED);
    free(data);
    return n;
}

static void write_steps(TfEvents *ev, int from, int to) {
    for (int s = from; s <= to; s++) {
        TfScalar v[2] = {{"train/loss", s * 0.5}, {"train/zero", 0.0}};
        assert_int_equal(tfevents_write_scalars(ev, s, 1.7e9 + s, v, 2), 0);
    }
}

static int count_event_files(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) n += strncmp(e->d_name, "events.out.tfevents.", 20) == 0;
    closedir(d);
    return n;
}

static void test_resume_trim(void **state) {
    (void)state;
    char dir[] = "/tmp/spes_tfevents_test_XXXXXX";
    assert_non_null(mkdtemp(dir));
    TfEvents ev;
    assert_int_equal(tfevents_open(&ev, dir, 0), 0);
    write_steps(&ev, 1, 5);
    char *first = strdup(ev.path);
    tfevents_close(&ev);
    // A crash mid-write left half a record.
    FILE *fp = fopen(first, "ab");
    fwrite("\x20\0\0\0\0\0", 1, 6, fp);
    fclose(fp);
    int64_t steps[16];
    bool torn;
    assert_int_equal(read_steps(first, steps, 16, &torn), 5);
    assert_true(torn);

    // Resume from step 3: the old file keeps steps 1-3 and loses its torn tail; a new file
    // takes steps 4-6.
    assert_int_equal(tfevents_open(&ev, dir, 3), 0);
    write_steps(&ev, 4, 6);
    char *second = strdup(ev.path);
    tfevents_close(&ev);
    assert_string_not_equal(first, second);
    assert_int_equal(read_steps(first, steps, 16, &torn), 3);
    assert_false(torn);
    for (int i = 0; i < 3; i++) assert_int_equal(steps[i], i + 1);
    assert_int_equal(read_steps(second, steps, 16, &torn), 3);
    assert_int_equal(steps[0], 4);

    // A fresh run (keep through 0) removes both: no scalars left in them.
    assert_int_equal(tfevents_open(&ev, dir, 0), 0);
    tfevents_close(&ev);
    assert_false(file_exists(first));
    assert_false(file_exists(second));
    assert_int_equal(count_event_files(dir), 1);
    free(first);
    free(second);
    remove_tree(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c),
        cmocka_unit_test(test_framing_and_damage),
        cmocka_unit_test(test_resume_trim),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
