/* keel: the tracer. Records, for every node a run executes (forward, backward and recomputed
 * clones), its name, op, type, shape, strides, an xxHash64 of each input's contents as read and
 * of its output, summary numbers (non-zeros, sum of squares, first and last values) and what the
 * backend's kernels chose at run time (cuBLASLt's algorithm for each product); with
 * data on, the output values too (bounded; or an evenly spaced sample of each node's values, so a
 * large model's trace stays small and still compares values within a tolerance). keel_trace_diff finds the first node, in B's order,
 * whose inputs equal A's but whose output does not. The file format is little-endian whatever
 * the machine. */
#ifndef KEEL_TRACE_H
#define KEEL_TRACE_H

#include <stdio.h>

#include "backend/backend.h"

typedef struct {
    char name[KEEL_NAME_MAX]; /* as in the graph; a recomputed clone ends in "@recompute" */
    int32_t op, type, n_src;
    int64_t ne[4], nb[4];
    uint64_t src_hash[KEEL_MAX_SRC];
    char src_name[KEEL_MAX_SRC][KEEL_NAME_MAX];
    uint64_t hash;
    int64_t nnz;
    double sumsq, first, last;
    char kernel[KEEL_KERNEL_MAX]; /* what the backend's kernels chose at run time (cuBLASLt's algorithms), or "" */
    double *data;                 /* output values at flat indices 0, s, 2s, ... (s = data_stride), or NULL */
    int64_t n_data, data_stride;
} keel_trace_rec;

typedef struct {
    keel_trace_rec *r;
    int64_t n, cap;
    bool keep_data;
    size_t max_data_bytes, data_bytes;
    int64_t sample;       /* > 0: keep at most this many evenly spaced values per node (large models) */
    uint64_t *hash_by_id; /* tensor id -> last recorded hash (inputs are read through this) */
    int64_t n_ids;
    const char *flip; /* fault: flip one element of this node's output after it runs */
    bool flipped;
} keel_tracer;

keel_tracer *keel_tracer_new(bool keep_data, size_t max_data_bytes);
void keel_tracer_free(keel_tracer *t);
/* Record the graph's leaves (call before the run), then pass keel_tracer_node as the run's
 * node callback with the tracer as its user data. */
int keel_tracer_begin(keel_tracer *t, keel_backend *be, const keel_graph *g);
int keel_tracer_node(keel_backend *be, const keel_tensor *node, int64_t index, void *tracer);

int keel_trace_write(const keel_tracer *t, const char *path);
keel_tracer *keel_trace_read(const char *path);

/* Prints the report to out. Returns 0 when nothing diverged, 1 when a divergence was found. With
 * tolerance > 0, values within that normalised squared error count as equal (needs data). */
int keel_trace_diff(const keel_tracer *a, const keel_tracer *b, double tolerance, FILE *out);

#endif
