/* keel: the backends built into this binary, by name: the one place that maps a name to a
 * constructor. What a backend is (oracle, device, type, thread knob) it says itself. */
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "util/error.h"

keel_backend *keel_backend_ref_new(void);
keel_backend *keel_backend_cpu_new(int n_threads);
#ifdef KEEL_HAVE_CUDA
#include "backends/cuda/cuda_api.h"
keel_backend *keel_backend_cuda_new(void);
#endif

static keel_backend *ref_new(int n_threads) {
    (void)n_threads;
    return keel_backend_ref_new();
}
#ifdef KEEL_HAVE_CUDA
static keel_backend *cuda_new(int n_threads) {
    (void)n_threads;
    return keel_backend_cuda_new();
}
#endif

static const struct {
    const char *name;
    keel_backend *(*make)(int n_threads);
} REGISTRY[] = {
    {"ref", ref_new},
    {"cpu", keel_backend_cpu_new},
#ifdef KEEL_HAVE_CUDA
    {"cuda", cuda_new},
#endif
};
#define N_REGISTRY (sizeof REGISTRY / sizeof REGISTRY[0])

const char *keel_backend_list(void) {
    static char list[64];
    if (!list[0])
        for (size_t i = 0; i < N_REGISTRY; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? "," : "", REGISTRY[i].name);
    return list;
}

keel_backend *keel_backend_new(const char *name, int n_threads) {
    for (size_t i = 0; i < N_REGISTRY; i++)
        if (strcmp(name, REGISTRY[i].name) == 0) return REGISTRY[i].make(n_threads);
    keel_fail("unknown backend '%s' (this build has: %s)", name, keel_backend_list());
    return NULL;
}

#ifdef KEEL_HAVE_CUDA
static size_t cuda_rule(void *ud, const keel_tensor *node) {
    (void)ud;
    return keel_cuda_scratch_bytes(node);
}
static size_t cuda_carry(void *ud, const keel_graph *g, int64_t reader, int64_t *writer) {
    (void)ud;
    return keel_cuda_carry_bytes(g, reader, writer);
}
#endif

int keel_backend_plan_rules(const char *name, keel_plan_opts *o) {
    o->scratch_bytes = NULL, o->carry = NULL;
#ifdef KEEL_HAVE_CUDA
    if (strcmp(name, "cuda") == 0) {
        o->scratch_bytes = cuda_rule, o->carry = cuda_carry;
        return 0;
    }
#endif
    return strcmp(name, "ref") == 0 || strcmp(name, "cpu") == 0 ? 0 : -1;
}
