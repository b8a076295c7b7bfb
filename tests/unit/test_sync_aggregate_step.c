// The step an aggregate states (src/sync/aggregate_step.c): the key read strictly, and the peer's
// check of a download against the step it asked for.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/error.h"
#include "sync/aggregate_step.h"

// A one-tensor safetensors file whose metadata holds spes_step = step_text (NULL: no metadata).
static uint8_t *aggregate_stating(const char *step_text, size_t *len) {
    static const float values[2] = {1, 2};
    StWriteTensor w = {.name = "lm_head.weight", .dtype = DTYPE_F32, .ndim = 1, .shape = {2}, .data = values};
    const char *keys[] = {SYNC_META_STEP}, *vals[] = {step_text};
    uint8_t *bytes;
    assert_int_equal(safetensors_serialize(&w, 1, keys, vals, step_text ? 1 : 0, &bytes, len), SPES_OK);
    return bytes;
}

// The step stated by an aggregate whose spes_step is text; SPES_ERR when not a step.
static int stated(const char *text, int *step) {
    size_t len;
    uint8_t *bytes = aggregate_stating(text, &len);
    SafeTensors st;
    assert_int_equal(safetensors_parse(bytes, len, "t", &st), SPES_OK);
    int rc = sync_aggregate_stated_step(&st, "aggregate from server x", step);
    safetensors_close(&st);
    free(bytes);
    return rc;
}

static void test_stated_step_read_strictly(void **state) {
    (void)state;
    int step;
    assert_int_equal(stated(NULL, &step), SPES_OK);
    assert_int_equal(step, -1);   // none stated: the reference server, older state dirs
    assert_int_equal(stated("0", &step), SPES_OK);
    assert_int_equal(step, 0);
    assert_int_equal(stated("2147483647", &step), SPES_OK);
    assert_int_equal(step, 2147483647);
    const char *bad[] = {"", "-2", "+2", " 2", "2 ", "2x", "0x10", "2147483648", "99999999999999999999", "two"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        assert_int_equal(stated(bad[i], &step), SPES_ERR);
        assert_non_null(strstr(spes_last_error(), "aggregate from server x: its spes_step"));
        assert_non_null(strstr(spes_last_error(), "is not a step"));
    }
}

static int check(const char *text, int asked) {
    size_t len;
    uint8_t *bytes = aggregate_stating(text, &len);
    int rc = sync_aggregate_check_step(bytes, len, asked, "10.0.0.1:50051");
    free(bytes);
    return rc;
}

static void test_peer_refuses_another_steps_aggregate(void **state) {
    (void)state;
    assert_int_equal(check("40", 40), SPES_OK);
    assert_int_equal(check(NULL, 40), SPES_OK);   // no key: taken
    assert_int_equal(check("38", 40), SPES_ERR);
    const char *e = spes_last_error();
    assert_non_null(strstr(e, "server 10.0.0.1:50051: asked for the aggregate of step 40, it sent the aggregate of step 38"));
    assert_int_equal(check("4O", 40), SPES_ERR);
    assert_non_null(strstr(spes_last_error(), "server 10.0.0.1:50051: the aggregate of step 40: its spes_step '4O'"));
    // Not safetensors: passed on to the loader, which names what is wrong; no error left behind.
    spes_clear_error();
    assert_int_equal(sync_aggregate_check_step((const uint8_t *)"junk", 4, 40, "x"), SPES_OK);
    assert_string_equal(spes_last_error(), "");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stated_step_read_strictly),
        cmocka_unit_test(test_peer_refuses_another_steps_aggregate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
