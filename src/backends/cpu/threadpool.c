#include "backends/cpu/threadpool.h"

#include <pthread.h>
#include <stdlib.h>

struct keel_pool {
    int n;
    pthread_t *th;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    int64_t generation;
    int pending;
    int quit;
    keel_pool_fn fn;
    void *arg;
    int64_t items;
};

typedef struct {
    keel_pool *p;
    int index;
} worker_arg;

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
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (p->generation == seen && !p->quit) pthread_cond_wait(&p->go, &p->mu);
        if (p->quit) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        run_share(p, t);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
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
    p->quit = 1;
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
    p->pending = p->n - 1;
    p->generation++;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    run_share(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
