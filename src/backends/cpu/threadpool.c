#include "backends/cpu/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

struct keel_pool {
    int n;
    pthread_t *th;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    _Atomic int64_t generation; /* written under mu; read without it while spinning */
    _Atomic int pending;
    _Atomic int quit;
    keel_pool_fn fn;
    void *arg;
    int64_t items;
};

typedef struct {
    keel_pool *p;
    int index;
} worker_arg;

/* Before sleeping, a waiting thread polls for a while. A thread that sleeps between the many
 * short loops of a product is woken by the caller, and the scheduler then often runs it on the
 * caller's CPU: the two shared one core for whole products (the 1024 x 1024 product ran at half
 * the two-thread speed in about one run of two). A thread that is still polling keeps its CPU. */
enum { SPIN_POLLS = 2000 };

/* Yielding, not pausing: a woken thread placed on the caller's CPU gives it the core back. */
static inline void cpu_relax(void) { sched_yield(); }

static void run_share(keel_pool *p, int t) {
    int64_t per = (p->items + p->n - 1) / p->n, b = per * t, e = b + per;
    if (e > p->items) e = p->items;
    if (b < e) p->fn(p->arg, b, e, t);
}

static void *worker(void *v) {
    worker_arg *wa = v;
    keel_pool *p = wa->p;
    int t = wa->index;
    free(wa);
    int64_t seen = 0;
    for (;;) {
        for (int i = 0; i < SPIN_POLLS && atomic_load(&p->generation) == seen && !atomic_load(&p->quit); i++)
            cpu_relax();
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->generation) == seen && !atomic_load(&p->quit)) pthread_cond_wait(&p->go, &p->mu);
        pthread_mutex_unlock(&p->mu);
        if (atomic_load(&p->quit)) break;
        seen = atomic_load(&p->generation); /* fn, arg and items were set before it moved */
        run_share(p, t);
        if (atomic_fetch_sub(&p->pending, 1) == 1) { /* the last one: under mu, so the caller cannot miss it */
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

keel_pool *keel_pool_new(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    keel_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    p->th = calloc((size_t)n_threads, sizeof *p->th);
    if (!p->th) {
        free(p);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) { /* thread 0 is the caller */
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) {
            p->n = i;
            break;
        }
        wa->p = p;
        wa->index = i;
        if (pthread_create(&p->th[i], NULL, worker, wa)) {
            free(wa);
            p->n = i;
            break;
        }
    }
    return p;
}

void keel_pool_free(keel_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, 1);
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->th[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    free(p->th);
    free(p);
}

int keel_pool_size(const keel_pool *p) { return p->n; }

void keel_pool_for(keel_pool *p, int64_t n, keel_pool_fn fn, void *arg) {
    if (n <= 0) return;
    if (p->n == 1 || n == 1) {
        fn(arg, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->items = n;
    atomic_store(&p->pending, p->n - 1);
    atomic_fetch_add(&p->generation, 1);
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    run_share(p, 0);
    for (int i = 0; i < SPIN_POLLS && atomic_load(&p->pending) > 0; i++) cpu_relax();
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&p->pending) > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
