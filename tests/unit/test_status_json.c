// status_json.h: the /status.json document parsed back with jansson against the RunStatus it came
// from (tests/unit/status_fixture.h): the Status counters, every peer (state, last seen, last
// upload, latest point, all points), the rounds; NaN and infinity written as null so the document
// stays valid JSON; a run with no peers and no rounds; the limits on points and rounds.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "status/status_json.h"
#include "status_fixture.h"

static json_t *render_limited(const RunStatus *s, StatusJsonLimits limits) {
    size_t len;
    char *text = status_json_render(s, limits, &len);
    assert_non_null(text);
    assert_int_equal(len, strlen(text));
    json_error_t err;
    json_t *doc = json_loads(text, JSON_REJECT_DUPLICATES, &err);   // strict: no NaN, no duplicate keys
    if (!doc)
        fail_msg("status.json does not parse: %s at %d", err.text, err.position);
    free(text);
    return doc;
}

static json_t *render_and_parse(const RunStatus *s) { return render_limited(s, STATUS_JSON_ALL); }

static double real_of(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    assert_true(json_is_number(v));
    return json_number_value(v);
}

static void test_counters(void **state) {
    (void)state;
    RunStatus s;
    assert_int_equal(status_fixture(&s), SPES_OK);
    json_t *doc = render_and_parse(&s);
    assert_true(fabs(real_of(doc, "now") - FIXTURE_NOW) < 1e-3);
    assert_int_equal(json_integer_value(json_object_get(doc, "rounds_completed")), 6);
    assert_int_equal(json_integer_value(json_object_get(doc, "open_step")), 70);
    json_t *uploaded = json_object_get(doc, "peers_uploaded");
    assert_int_equal(json_array_size(uploaded), 2);
    assert_int_equal(json_integer_value(json_array_get(uploaded, 1)), 3);
    assert_int_equal(json_integer_value(json_object_get(doc, "last_aggregate_step")), 60);
    assert_int_equal(json_integer_value(json_object_get(doc, "bytes_received")), 123456789);
    assert_int_equal(json_integer_value(json_object_get(doc, "bytes_sent")), 987654321);
    assert_int_equal(json_integer_value(json_object_get(doc, "uploads_rejected")), 2);
    assert_string_equal(json_string_value(json_object_get(doc, "fingerprint")), "0123456789abcdef");
    assert_true(fabs(real_of(doc, "last_aggregate_seconds") - 0.25) < 1e-12);
    assert_int_equal(json_integer_value(json_object_get(doc, "rounds_partial")), 1);
    assert_int_equal(json_integer_value(json_object_get(doc, "last_round_peers")), 3);
    assert_int_equal(json_integer_value(json_object_get(doc, "total_peers")), 4);
    assert_string_equal(json_string_value(json_object_get(doc, "mode")), "spes");
    assert_string_equal(json_string_value(json_object_get(doc, "aggregate_problem")), "");
    json_decref(doc);
    // A round whose aggregate the state dir cannot take says why.
    snprintf(s.rounds.aggregate_problem, sizeof s.rounds.aggregate_problem, "step 70: cannot write the aggregate");
    doc = render_and_parse(&s);
    assert_string_equal(json_string_value(json_object_get(doc, "aggregate_problem")), "step 70: cannot write the aggregate");
    json_decref(doc);
    run_status_free(&s);
}

static void test_peers(void **state) {
    (void)state;
    RunStatus s;
    assert_int_equal(status_fixture(&s), SPES_OK);
    json_t *doc = render_and_parse(&s);
    json_t *peers = json_object_get(doc, "peers");
    assert_int_equal(json_array_size(peers), 4);
    const char *names[4] = {"alive", "late", "missing", "unseen"};
    for (int p = 0; p < 4; p++) {
        json_t *peer = json_array_get(peers, (size_t)p);
        assert_int_equal(json_integer_value(json_object_get(peer, "peer")), p);
        assert_string_equal(json_string_value(json_object_get(peer, "state")), names[p]);
        assert_int_equal(json_integer_value(json_object_get(peer, "last_upload_step")), s.peers[p].last_upload_step);
        json_t *points = json_object_get(peer, "points");
        assert_int_equal(json_array_size(points), (size_t)s.peers[p].num_points);
        for (int i = 0; i < s.peers[p].num_points; i++) {   // every point, oldest first, every field
            json_t *pt = json_array_get(points, (size_t)i);
            const PeerMetricPoint *want = &s.peers[p].points[i];
            assert_int_equal(json_integer_value(json_object_get(pt, "step")), want->step);
            if (isfinite(want->loss))
                assert_true(fabs(real_of(pt, "loss") - want->loss) < 1e-12);
            assert_true(fabs(real_of(pt, "tokens_per_s") - want->tokens_per_s) < 1e-9);
            assert_true(fabs(real_of(pt, "route_max") - want->route_max) < 1e-12);
            const char *fields[] = {"ce", "lb", "device_mem_mb", "route_min"};
            for (int f = 0; f < 4; f++) assert_true(json_is_number(json_object_get(pt, fields[f])));
        }
    }
    json_t *alive = json_array_get(peers, 0), *late = json_array_get(peers, 1);
    assert_true(fabs(real_of(late, "last_seen") - (FIXTURE_NOW - 65)) < 1e-3);
    assert_true(fabs(real_of(late, "seconds_since_seen") - 65) < 1e-6);
    assert_true(json_is_null(json_object_get(json_array_get(json_object_get(late, "points"), 3), "loss")));
    json_t *latest = json_object_get(alive, "latest");
    assert_int_equal(json_integer_value(json_object_get(latest, "step")), 2 * 29 + 1);
    assert_true(json_is_null(json_object_get(latest, "mfu")));   // infinity: null
    json_t *unseen = json_array_get(peers, 3);
    assert_true(json_is_null(json_object_get(unseen, "last_seen")));
    assert_true(json_is_null(json_object_get(unseen, "seconds_since_seen")));
    assert_true(json_is_null(json_object_get(unseen, "latest")));
    assert_int_equal(json_integer_value(json_object_get(unseen, "last_upload_step")), -1);
    json_decref(doc);
    run_status_free(&s);
}

static void test_rounds(void **state) {
    (void)state;
    RunStatus s;
    assert_int_equal(status_fixture(&s), SPES_OK);
    s.round_history[5].duration_s = NAN;
    json_t *doc = render_and_parse(&s);
    json_t *rounds = json_object_get(doc, "rounds");
    assert_int_equal(json_array_size(rounds), 6);
    for (int i = 0; i < 6; i++) {
        json_t *r = json_array_get(rounds, (size_t)i);
        const RoundRecord *want = &s.round_history[i];
        assert_int_equal(json_integer_value(json_object_get(r, "step")), want->step);
        assert_true(json_is_boolean(json_object_get(r, "partial")));
        assert_int_equal(json_is_true(json_object_get(r, "partial")), want->partial);
        assert_int_equal(json_integer_value(json_object_get(r, "peers")), want->peers);
        assert_int_equal(json_integer_value(json_object_get(r, "bytes_in")), want->bytes_in);
        assert_int_equal(json_integer_value(json_object_get(r, "bytes_out")), want->bytes_out);
        assert_true(fabs(real_of(r, "merge_alpha") - want->merge_alpha) < 1e-12);
        assert_true(fabs(real_of(r, "started") - want->started_unix) < 1e-3);
        if (i < 5)
            assert_true(fabs(real_of(r, "duration_s") - want->duration_s) < 1e-12);
    }
    assert_true(json_is_null(json_object_get(json_array_get(rounds, 5), "duration_s")));
    json_decref(doc);
    run_status_free(&s);
}

static void test_empty_run(void **state) {
    (void)state;
    RunStatus s;
    assert_int_equal(run_status_alloc(&s, 0), 0);
    s.rounds.open_step = -1;
    s.rounds.last_aggregate_step = -1;
    json_t *doc = render_and_parse(&s);
    assert_int_equal(json_array_size(json_object_get(doc, "peers")), 0);
    assert_int_equal(json_array_size(json_object_get(doc, "rounds")), 0);
    assert_int_equal(json_array_size(json_object_get(doc, "peers_uploaded")), 0);
    assert_int_equal(json_integer_value(json_object_get(doc, "open_step")), -1);
    json_decref(doc);
    run_status_free(&s);
}

// ?points=N&rounds=M: the newest N points of each peer (its latest point stays), the newest M rounds.
static void test_limits(void **state) {
    (void)state;
    RunStatus s;
    assert_int_equal(status_fixture(&s), SPES_OK);
    const StatusJsonLimits cases[] = {{2, 1}, {0, 0}, {100000, 100000}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        json_t *doc = render_limited(&s, cases[c]);
        json_t *peers = json_object_get(doc, "peers");
        for (int p = 0; p < s.num_peers; p++) {
            json_t *peer = json_array_get(peers, (size_t)p);
            json_t *points = json_object_get(peer, "points");
            int n = s.peers[p].num_points, want = n < cases[c].points ? n : cases[c].points;
            assert_int_equal(json_array_size(points), (size_t)want);
            for (int i = 0; i < want; i++)   // the newest, oldest first
                assert_int_equal(json_integer_value(json_object_get(json_array_get(points, (size_t)i), "step")),
                                 s.peers[p].points[n - want + i].step);
            assert_true(n == 0 || json_is_object(json_object_get(peer, "latest")));
        }
        json_t *rounds = json_object_get(doc, "rounds");
        int want = s.num_rounds < cases[c].rounds ? s.num_rounds : cases[c].rounds;
        assert_int_equal(json_array_size(rounds), (size_t)want);
        if (want)
            assert_int_equal(json_integer_value(json_object_get(json_array_get(rounds, (size_t)want - 1), "step")),
                             s.round_history[s.num_rounds - 1].step);
        json_decref(doc);
    }
    run_status_free(&s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_counters),
        cmocka_unit_test(test_peers),
        cmocka_unit_test(test_rounds),
        cmocka_unit_test(test_empty_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
