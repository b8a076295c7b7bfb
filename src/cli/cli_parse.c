#include "cli/cli_parse.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/file.h"
#include "base/log.h"
#include "model/hf_import.h"
#include "train/checkpoint.h"

// The flag's name without its dashes: callers may pass "batch" or "--batch", messages say "--batch".
static const char *bare(const char *flag) {
    while (*flag == '-') flag++;
    return flag;
}

int cli_int(const char *flag, const char *text, long min, long max, int *out) {
    flag = bare(flag);
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < min || v > max)
        return spes_fail("--%s: '%s' is not an integer in [%ld, %ld]", flag, text, min, max);
    *out = (int)v;
    return SPES_OK;
}

int cli_u64(const char *flag, const char *text, uint64_t *out) {
    flag = bare(flag);
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text || *end || text[0] == '-')
        return spes_fail("--%s: '%s' is not a non-negative integer", flag, text);
    *out = (uint64_t)v;
    return SPES_OK;
}

int cli_double(const char *flag, const char *text, double min, double max, double *out) {
    flag = bare(flag);
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !isfinite(v) || v < min || v > max)
        return spes_fail("--%s: '%s' is not a number in [%g, %g]", flag, text, min, max);
    *out = v;
    return SPES_OK;
}

int cli_float(const char *flag, const char *text, double min, double max, float *out) {
    double v = 0;
    SPES_TRY(cli_double(flag, text, min, max, &v));
    *out = (float)v;
    return SPES_OK;
}

const char *cli_default_tokenizer(const char *model_dir) {
    char *path = model_dir ? path_join(model_dir, "tokenizer.json") : NULL;
    int found = path && file_exists(path);
    free(path);
    return found ? model_dir : NULL;
}

int cli_report_error(void) {
    fprintf(stderr, "spes: %s\n", spes_last_error());
    return 1;
}

int cli_check_model_out_dir(const char *out_dir, const char *source, const char *source_flag) {
    if (!dir_exists(out_dir)) return SPES_OK;
    char *state = path_join(out_dir, "train_state.json");
    if (!state) return SPES_ERR;
    bool is_checkpoint = file_exists(state);
    free(state);
    if (is_checkpoint)
        return spes_fail("--out %s is a training checkpoint (it holds train_state.json): the export would replace its "
                         "F32 weights and a resume would continue from them; choose another directory", out_dir);
    char *out_real = realpath(out_dir, NULL), *src_real = source ? realpath(source, NULL) : NULL;
    int rc = SPES_OK;
    if (out_real && src_real && !strcmp(out_real, src_real))
        rc = spes_fail("--out %s is the %s directory itself: writing the export there would replace its weights; "
                       "choose another directory", out_dir, source_flag);
    free(out_real);
    free(src_real);
    SPES_TRY(rc);
    char *latest = NULL;
    int64_t step = -1;
    SPES_TRY(checkpoint_find_latest(out_dir, &latest, &step));
    free(latest);
    if (step >= 0)
        return spes_fail("--out %s is a training save_folder (it holds checkpoint step%lld/); choose another directory",
                         out_dir, (long long)step);
    return SPES_OK;
}

int cli_load_model(const char *dir, const char *device, const char *precision, Model *m) {
    Precision p;
    Backend *be;
    SPES_TRY(precision_from_name(precision ? precision : "fp32", &p));
    SPES_TRY(model_load_hf_dir(dir, m));
    if (backend_open(device ? device : "auto", p, &be) != SPES_OK) {
        model_free(m);
        return SPES_ERR;
    }
    if (model_move_to(m, be) != SPES_OK) {
        model_free(m);
        backend_close(be);
        return SPES_ERR;
    }
    if (!be->host_memory) log_info("device: %s", be->description);
    return SPES_OK;
}

void cli_free_model(Model *m) {
    Backend *be = m->be;
    model_free(m);
    backend_close(be);
}
