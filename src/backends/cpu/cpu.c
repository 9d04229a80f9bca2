/* keel: the cpu backend: host buffers, a thread pool, float32 kernels (cpu_ops.c, cpu_gdn.c,
 * gemm.c) and one copy path (cpu_copy.c) that converts between every type. */
#include <stdio.h>
#include <stdlib.h>

#include "backends/cpu/cpu_internal.h"
#include "backends/host_memory.h"
#include "ops/ops.h"
#include "util/clock.h"
#include "util/error.h"

static bool cpu_supports(keel_backend *be, const keel_tensor *t) {
    (void)be;
    return keel_backend_f32_supports(t);
}

static int cpu_compute(keel_backend *be, const keel_graph *g, int64_t from, int64_t to, keel_node_cb cb, void *ud) {
    for (int64_t i = from; i < to; i++) {
        const keel_tensor *t = g->nodes[i];
        if (!(keel_op_get(t->op)->flags & OPF_VIEW)) {
            cpu_impl *im = be->impl;
            double t0 = im->profile ? keel_now_s() : 0;
            if (cpu_node(be, t)) {
                /* keep the kernel's message, add the node */
                char msg[1536];
                snprintf(msg, sizeof msg, "%s", keel_last_error());
                return keel_fail("%s (node '%s')", msg, t->name);
            }
            if (im->profile) keel_op_profile_add(im->profile, t, (keel_now_s() - t0) * 1e3);
        }
        if (cb && cb(be, t, i, ud)) return keel_backend_callback_failed(t);
    }
    return 0;
}

static int cpu_set_threads(keel_backend *be, int n) {
    cpu_impl *im = be->impl;
    if (n < 1) return keel_fail("thread count must be >= 1 (got %d)", n);
    if (im->pool && keel_pool_size(im->pool) == n) return 0;
    keel_pool *p = keel_pool_new(n);
    if (!p) return keel_fail("cannot start %d threads", n);
    keel_pool_free(im->pool);
    im->pool = p;
    be->n_threads = keel_pool_size(p);
    return 0;
}

static void cpu_profile_reset(keel_backend *be) {
    cpu_impl *im = be->impl;
    if (im->profile) keel_op_profile_reset(im->profile);
}

void *cpu_scratch(keel_backend *be, size_t bytes) {
    cpu_impl *im = be->impl;
    if (bytes > im->scratch_bytes) {
        free(im->scratch);
        im->scratch = malloc(bytes ? bytes : 1);
        im->scratch_bytes = im->scratch ? bytes : 0;
        if (!im->scratch) keel_fail("cpu: out of memory for %zu bytes of scratch", bytes);
    }
    return im->scratch;
}

static void cpu_destroy(keel_backend *be) {
    cpu_impl *im = be->impl;
    free(im->scratch);
    if (im->profile) {
        char what[64];
        snprintf(what, sizeof what, "wall time on %d thread(s)", be->n_threads);
        keel_op_profile_print(im->profile, stderr, "cpu profile (KEEL_CPU_PROFILE)", what);
        keel_op_profile_free(im->profile);
    }
    keel_pool_free(im->pool);
    free(im);
    free(be);
}

keel_backend *keel_backend_cpu_new(int n_threads) {
    keel_backend *be = calloc(1, sizeof *be);
    cpu_impl *im = calloc(1, sizeof *im);
    if (!be || !im) {
        free(be), free(im);
        keel_fail("out of memory");
        return NULL;
    }
    be->name = "cpu";
    be->native_type = KEEL_F32, be->thread_knob = true;
    be->impl = im;
    be->supports = cpu_supports;
    be->alloc = keel_host_alloc;
    be->free = keel_host_free;
    be->write = keel_host_write;
    be->read = keel_host_read;
    be->fill_bytes = keel_host_fill_bytes;
    be->copy = cpu_copy;
    be->compute = cpu_compute;
    be->set_threads = cpu_set_threads;
    be->destroy = cpu_destroy;
    be->profile_reset = cpu_profile_reset;
    im->profile = keel_op_profile_from_env("KEEL_CPU_PROFILE");
    if (keel_backend_read_fault(be) || cpu_set_threads(be, n_threads > 0 ? n_threads : 1)) {
        keel_op_profile_free(im->profile);
        keel_pool_free(im->pool);
        free(im), free(be);
        return NULL;
    }
    return be;
}
