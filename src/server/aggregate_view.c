// Views of aggregate images (see aggregate_view.h).
#include "server/aggregate_view.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

int aggregate_view_build(const SafeTensors *image, const bool *keep, const char *view_name, AggregateView *out) {
    memset(out, 0, sizeof *out);
    int n = image->count, n_meta = image->meta_count + 1;
    StWriteTensor *w = spes_calloc(n > 0 ? (size_t)n : 1, sizeof *w);
    const char **keys = spes_calloc((size_t)n_meta, sizeof *keys);
    const char **values = spes_calloc((size_t)n_meta, sizeof *values);
    out->pieces = spes_calloc((size_t)n + 1, sizeof *out->pieces);
    int rc = w && keys && values && out->pieces ? SPES_OK : SPES_ERR;
    int kept = 0;
    for (int i = 0; rc == SPES_OK && i < n; i++) {
        if (!keep[i]) continue;
        const StTensor *t = &image->tensors[i];
        w[kept++] = (StWriteTensor){.name = t->name, .dtype = t->dtype, .ndim = t->ndim};
        memcpy(w[kept - 1].shape, t->shape, sizeof t->shape);
    }
    int m = 0;
    for (int i = 0; i < image->meta_count; i++)
        if (strcmp(image->meta_keys[i], "spes_view") != 0) keys[m] = image->meta_keys[i], values[m++] = image->meta_values[i];
    if (keys) keys[m] = "spes_view", values[m++] = view_name;
    size_t data_len = 0;
    if (rc == SPES_OK) rc = safetensors_build_header(w, kept, keys, values, m, &out->header, &out->header_len, &data_len);
    if (rc == SPES_OK) {
        out->pieces[out->n_pieces++] = (ViewPiece){(const uint8_t *)out->header, out->header_len};
        out->len = out->header_len;
        for (int i = 0; i < n; i++) {
            if (!keep[i]) continue;
            const StTensor *t = &image->tensors[i];
            ViewPiece *last = &out->pieces[out->n_pieces - 1];
            if (out->n_pieces > 1 && last->data + last->len == t->data) last->len += t->nbytes;
            else out->pieces[out->n_pieces++] = (ViewPiece){t->data, t->nbytes};
            out->len += t->nbytes;
        }
        if (out->len != out->header_len + data_len)
            rc = spes_fail("aggregate view: %zu data bytes laid out, the header says %zu", out->len - out->header_len,
                           data_len);
    }
    free(w);
    free(keys);
    free(values);
    if (rc != SPES_OK) aggregate_view_free(out);
    return rc;
}

int aggregate_view_whole(const uint8_t *image, size_t len, AggregateView *out) {
    memset(out, 0, sizeof *out);
    out->pieces = spes_calloc(1, sizeof *out->pieces);
    if (!out->pieces) return SPES_ERR;
    out->pieces[0] = (ViewPiece){image, len};
    out->n_pieces = 1;
    out->len = len;
    return SPES_OK;
}

void aggregate_view_free(AggregateView *v) {
    if (!v) return;
    free(v->header);
    free(v->pieces);
    memset(v, 0, sizeof *v);
}

size_t aggregate_view_range(const AggregateView *v, size_t at, size_t n,
                            void (*emit)(void *ctx, const uint8_t *data, size_t len), void *ctx) {
    size_t start = 0, done = 0;
    for (int i = 0; i < v->n_pieces && done < n; i++) {
        const ViewPiece *p = &v->pieces[i];
        size_t end = start + p->len;
        if (end > at + done) {
            size_t off = at + done - start, take = p->len - off < n - done ? p->len - off : n - done;
            emit(ctx, p->data + off, take);
            done += take;
        }
        start = end;
    }
    return done;
}
