/* keel: the backend interface. A backend owns buffers, moves bytes to and from the host, says
 * which ops and types it supports, and runs a planned graph, calling back after every node. */
#ifndef KEEL_BACKEND_H
#define KEEL_BACKEND_H

#include "graph/graph.h"
#include "plan/plan.h"

typedef struct keel_backend keel_backend;

#define KEEL_KERNEL_MAX 256 /* bytes of a backend's description of a node's kernels (last_kernel) */

/* Called after each node runs (index into g->nodes). Return non-zero to stop the run. */
typedef int (*keel_node_cb)(keel_backend *be, const keel_tensor *node, int64_t index, void *ud);

struct keel_backend {
    const char *name; /* for messages: callers branch on what follows, never on the name */
    /* What the backend is. */
    keel_type native_type; /* the type its kernels compute in: F64 for the oracle, else F32 */
    bool oracle;           /* the float64 reference every other backend is checked against; ignores KEEL_FAULT */
    bool on_device;        /* buffers in device memory: transfers cost, collectives can run there (NCCL) */
    bool thread_knob;      /* its thread count may be changed and must not change a bit (1 vs 2 threads are
                              compared); without it, a second run is the repeat check */
    /* The most memory it has held at once, for backends that track it (GPU memory); NULL otherwise. */
    size_t (*peak_bytes)(keel_backend *be);
    /* Forget the per-op profile so far (KEEL_CPU_PROFILE / KEEL_CUDA_PROFILE), e.g. after warm-up
     * steps whose first-touch page faults would swamp the table; NULL when the backend has none. */
    void (*profile_reset)(keel_backend *be);
    int n_threads;
    /* KEEL_FAULT=copy-row-limit:N: the copy routine copies only the first N elements of each row,
     * re-creating the row-limited GPU dispatch this project exists to catch. 0 = off. The ref
     * backend is the oracle and ignores it. */
    int64_t fault_row_limit;

    bool (*supports)(keel_backend *be, const keel_tensor *node);
    void *(*alloc)(keel_backend *be, size_t bytes);
    void (*free)(keel_backend *be, void *p);
    int (*write)(keel_backend *be, void *dst, const void *host, size_t n);
    int (*read)(keel_backend *be, void *host, const void *src, size_t n);
    int (*fill_bytes)(keel_backend *be, void *dst, int byte, size_t n);
    /* THE copy path: dst's strided region <- src's (same shape), with type conversion; accumulate
     * adds instead of assigning. Every op that copies calls this. */
    int (*copy)(keel_backend *be, const keel_tensor *dst, const keel_tensor *src, bool accumulate);
    /* The working memory its kernel of `node` takes beyond the node's result, from shapes, types and
     * strides alone: sessions hand it to the memory plan, which places it in the arena for that node
     * (node->scratch), so no step allocates. NULL on backends whose kernels need none planned (ref, cpu). */
    size_t (*scratch_bytes)(keel_backend *be, const keel_tensor *node);
    /* Node `reader`'s carried block (keel_carry_fn: what an earlier node's kernel makes that the
     * reader's would make again), from the node sequence alone; NULL: the backend carries nothing. */
    size_t (*carry_bytes)(keel_backend *be, const keel_graph *g, int64_t reader, int64_t *writer);
    /* What the kernels of the node that just ran chose at run time (cuBLASLt's algorithm for each
     * product), for the tracer: "" when nothing was chosen; NULL on backends that choose nothing. */
    const char *(*last_kernel)(keel_backend *be);
    /* Run nodes [from, to) of a bound graph. */
    int (*compute)(keel_backend *be, const keel_graph *g, int64_t from, int64_t to, keel_node_cb cb, void *ud);
    int (*set_threads)(keel_backend *be, int n);
    void (*destroy)(keel_backend *be);
    void *impl;
};

/* The registry (src/backends/registry.c): "ref", "cpu" (and "cuda" when built with it). NULL with
 * an error for an unknown name. */
keel_backend *keel_backend_new(const char *name, int n_threads);
void keel_backend_free(keel_backend *be);
/* The named backend's rules for the memory plan (scratch_bytes and carry_bytes above) as plan
 * options in o, without making the backend: none for ref and cpu, whose kernels need none planned.
 * -1 when the backend is not built. */
int keel_backend_plan_rules(const char *name, keel_plan_opts *o);
/* Names of the backends built into this binary, e.g. "ref,cpu". */
const char *keel_backend_list(void);
/* Parse KEEL_FAULT into be->fault_row_limit (called by backends that honour it). -1 on a bad value. */
int keel_backend_read_fault(keel_backend *be);

/* For compute loops: the node callback after node t failed; keeps its message, adds the node. */
int keel_backend_callback_failed(const keel_tensor *t);

/* A graph placed and bound on a backend: the arena plus the plan. */
typedef struct {
    keel_backend *be;
    keel_graph *g;
    keel_plan *plan;
    void *arena; /* the plan's total_bytes: tensors and the nodes' scratch */
} keel_session;

keel_session *keel_session_new(keel_backend *be, keel_graph *g, const keel_plan_opts *opts);
void keel_session_free(keel_session *s);
int keel_session_run(keel_session *s, keel_node_cb cb, void *ud);

/* Tensor bytes between host and backend. The host side is contiguous in `host_type`; the tensor
 * may have any strides and type: conversions and strided writes go through the copy path. */
int keel_tensor_write(keel_backend *be, keel_tensor *t, const void *host, keel_type host_type);
int keel_tensor_read(keel_backend *be, const keel_tensor *t, void *host, keel_type host_type);
/* Convenience: whole tensor as float64 (any type). Caller frees. */
double *keel_tensor_read_f64(keel_backend *be, const keel_tensor *t);
/* The tensor's bytes in flat order and its own type, by one raw transfer of its span and a gather
 * on the host: never the backend's copy path, so the tracer and the op-test harness can judge that
 * path with it. *n_bytes gets the size; caller frees; NULL (with a message) on failure. */
unsigned char *keel_tensor_read_raw_flat(keel_backend *be, const keel_tensor *t, size_t *n_bytes);

#endif
