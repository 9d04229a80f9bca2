/* keel: the op test suite. Cases walk the op table; each runs on every backend with inputs from a
 * seeded generator, outputs poisoned with NaN, guard bytes around every tensor, and is compared
 * with the ref backend in float64 by normalised squared error. The gradient tiers check analytic
 * gradients against central differences (ref, float64) and each backend's backward graph
 * against the ref backend's. */
#ifndef KEEL_TESTOPS_H
#define KEEL_TESTOPS_H

#include "tensor/tensor.h"

#define CASE_MAX_IN KEEL_MAX_SRC

typedef enum {
    DOM_NORMAL,
    DOM_POSITIVE,
    DOM_INDEX,
    DOM_INDEX_OR_IGNORED, /* DOM_INDEX, with about a third -100 (cross-entropy targets with no loss) */
    DOM_GATE,
    DOM_UNIT,
    DOM_UNIT_EDGES, /* DOM_UNIT, with about a third exactly 0 and a third exactly 1 */
    DOM_SMALL,
    DOM_SEGMENTS, /* i32 positions [T,B]: each column starts inside an example, and examples of up to
                   * index_max tokens restart at 0 at random (packed windows) */
} case_domain;
/* VIEW_ROWS_SWAPPED: dims 1 and 2 swapped, rows (dim 0) left whole: rows that are not one stride apart;
 * VIEW_HALF_ROWS: the second half of each row of a tensor twice as wide (attention's gate, beside q
 * in each head's row of the q projection): whole rows, strided apart */
typedef enum { VIEW_NONE, VIEW_TRANSPOSED, VIEW_PERMUTED, VIEW_STRIDED, VIEW_ROWS_SWAPPED, VIEW_HALF_ROWS } case_view;

typedef struct {
    int64_t ne[4];  /* the shape the op sees */
    keel_type type; /* the type under test (the oracle uses f64 for real inputs) */
    case_domain dom;
    int64_t index_max; /* DOM_INDEX: values in [0, index_max) */
    case_view view;
    double scale; /* values multiplied by this (0 means 1) */
} case_input;

typedef struct op_case op_case;
struct keel_ctx;
struct keel_backend;
/* A case may build its graph itself (composite, model-shaped cases); it returns the output and
 * fills the leaves it made (leaves[i] for inputs declared in the case). */
typedef keel_tensor *(*case_builder)(struct keel_ctx *ctx, const op_case *c, keel_tensor **inputs);

struct op_case {
    int op;
    int n_in;
    case_input in[CASE_MAX_IN];
    int64_t ip[KEEL_MAX_IP];
    int n_ip;
    double fp[KEEL_MAX_FP];
    int n_fp;
    keel_type fill_type; /* FILL: result type */
    bool keep_types;     /* the oracle uses the case's types (conversions under test) */
    int no_grad_mask;    /* inputs never differentiated in this case */
    uint32_t ip_elems;   /* bit i: ip[i] counts elements; the harness turns it into bytes of the built type */
    double tol;          /* NMSE threshold for non-f64 results (0: the default 1e-7) */
    const char *no_fd;   /* gradient tiers: why finite differences cannot check this case (bf16 roundings are
                          * steps); then only the backends' backward graphs against ref's */
    int64_t width;       /* widest row the copy path moves, when not the widest row of the graph (composite cases):
                             decides fault expectations */
    case_builder build;
    bool loss_out;     /* build cases: the gradient harness differentiates the output itself (one element),
                       * not its weighted sum: the backward's seed 1 reaches it as it is */
    const char *name;  /* composite cases: their own label */
    bool copies_exact; /* ADAMW_SHADOW: each bf16 copy must be the backend's own updated weight rounded as CAST
                        * rounds it, bit for bit (not when the update is skipped: then they must not change) */
    char label[320];
};

/* All cases, op-table order. Caller frees *out. */
int keel_cases_all(op_case **out);

typedef struct {
    const char *backends; /* comma list; NULL: every backend built in */
    const char *ops;      /* comma list of op names; NULL: all */
    bool grad;            /* run the gradient tiers instead of the forward tier */
    bool verbose;
    int64_t expect_fault; /* >0: expect cases wider than this to FAIL on non-ref backends, the rest to pass */
    bool check_threads;   /* cpu: run 1 and 2 threads and compare bits (default on) */
    bool bits;            /* print a hash of each passing case's result bits (two builds compared case by case) */
    int shard, shards;    /* shards > 1: only the cases of shard `shard` (keel_testops_shard_of) */
} keel_testops_opts;

/* Runs the suite and prints per-case lines, per-backend counts and the coverage table.
 * Returns the number of failures (unexpected outcomes), or -1 on a harness error. */
int keel_test_ops(const keel_testops_opts *o);
/* Whether op `name` is in the comma list (case-insensitive; a NULL list holds every op). */
bool keel_testops_listed(const char *list, const char *name);
/* bad_ids.c: ids and targets out of range on backend be, for the ops of the list: each run fails
 * naming the node and the value (a negative target is no loss, and runs), and the next valid run
 * passes. Prints a line each; returns the failures. */
int keel_test_bad_ids(struct keel_backend *be, const char *ops);

#endif
