// A view of an aggregate image: the safetensors bytes of a subset of its tensors, served
// without copying them. The view is a header built for the subset followed by the kept
// tensors' bytes, taken in place from the image (safetensors data is the tensors back to back
// in header order, so consecutive kept tensors form one piece). Used to leave a peer's own
// experts out of its download when the round took them unchanged from its upload.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "io/safetensors.h"

typedef struct {
    const uint8_t *data;        // into the view's header or into the image
    size_t len;
} ViewPiece;

typedef struct {
    char *header;               // the view's own safetensors header
    size_t header_len;
    ViewPiece *pieces;          // pieces[0] is the header; then runs of kept tensors' bytes
    int n_pieces;
    size_t len;                 // total bytes of the view
} AggregateView;

// image: the parsed aggregate (its tensors in file order, data pointing into the image bytes,
// which must outlive the view). keep[i]: whether image tensor i is in the view. The view's
// __metadata__ is the image's plus "spes_view" = view_name.
int aggregate_view_build(const SafeTensors *image, const bool *keep, const char *view_name, AggregateView *out);
// The whole image as it is, one piece (no header of its own): the seeds' download, byte for byte.
int aggregate_view_whole(const uint8_t *image, size_t len, AggregateView *out);
void aggregate_view_free(AggregateView *v);

// Calls emit(ctx, data, len) for the pieces (cut to fit) that cover bytes [at, at + n) of the
// view, in order. Returns the bytes covered (less than n only past the end).
size_t aggregate_view_range(const AggregateView *v, size_t at, size_t n,
                            void (*emit)(void *ctx, const uint8_t *data, size_t len), void *ctx);
