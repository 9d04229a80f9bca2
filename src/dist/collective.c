#define _DEFAULT_SOURCE
#include "dist/collective.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/error.h"
#ifdef KEEL_HAVE_NCCL
#include "dist/nccl.h"
#endif

struct keel_coll {
    int rank, size;
    int *peer; /* rank 0: socket per rank (peer[0] unused); others: peer[0] is rank 0 */
    void *tmp;
    size_t tmp_n; /* bytes */
    double timeout_s;
    float *stage;   /* host staging of gradient buffers for the TCP all-reduce */
    size_t stage_n; /* floats */
#ifdef KEEL_HAVE_NCCL
    keel_nccl *nccl; /* gradient sums on the GPU, when attached */
#endif
};

static int set_timeout(int fd, double s) {
    struct timeval tv = {(time_t)s, (suseconds_t)((s - (double)(time_t)s) * 1e6)};
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) ||
           setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

static int xfer(int fd, void *buf, size_t n, bool send_it, int me, int other) {
    char *p = buf;
    while (n) {
        ssize_t k = send_it ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k <= 0) {
            if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                return keel_fail("rank %d: rank %d did not answer in time (dead or hung?)", me, other);
            return keel_fail("rank %d: lost rank %d (%s)", me, other, k == 0 ? "connection closed" : strerror(errno));
        }
        p += k, n -= (size_t)k;
    }
    return 0;
}

keel_coll *keel_coll_from_env(double timeout_s, int *failed) {
    *failed = 0;
    const char *ws = getenv("KEEL_WORLD_SIZE"), *rs = getenv("KEEL_RANK"), *addr = getenv("KEEL_MASTER_ADDR"),
               *port = getenv("KEEL_MASTER_PORT");
    /* started by mpirun or srun: their rank and size, when keel's own are not set */
    if (!ws) ws = getenv("OMPI_COMM_WORLD_SIZE"), rs = getenv("OMPI_COMM_WORLD_RANK");
    if (!ws) ws = getenv("SLURM_NTASKS"), rs = getenv("SLURM_PROCID");
    if (!ws || atoi(ws) <= 1) return NULL;
    *failed = 1;
    int size = atoi(ws), rank = rs ? atoi(rs) : -1, prt = port ? atoi(port) : 0;
    if (rank < 0 || rank >= size || prt <= 0 || prt > 65535 || size > 1024) {
        keel_fail("KEEL_RANK (%s), KEEL_WORLD_SIZE (%s), KEEL_MASTER_PORT (%s): need 0 <= rank < size and a port",
                  rs ? rs : "unset", ws, port ? port : "unset");
        return NULL;
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)prt)};
    if (inet_pton(AF_INET, addr ? addr : "127.0.0.1", &sa.sin_addr) != 1) {
        keel_fail("KEEL_MASTER_ADDR '%s' is not an IPv4 address", addr);
        return NULL;
    }
    keel_coll *c = calloc(1, sizeof *c);
    if (!c || !(c->peer = calloc((size_t)size, sizeof *c->peer))) {
        free(c);
        keel_fail("out of memory for %d ranks' connections", size);
        return NULL;
    }
    c->rank = rank, c->size = size, c->timeout_s = timeout_s;
    for (int i = 0; i < size; i++) c->peer[i] = -1;
    if (rank == 0) {
        int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof sa) || listen(ls, size)) {
            keel_fail("rank 0: cannot listen on port %d: %s", prt, strerror(errno));
            if (ls >= 0) close(ls);
            keel_coll_free(c);
            return NULL;
        }
        set_timeout(ls, timeout_s);
        for (int k = 1; k < size; k++) {
            int fd = accept(ls, NULL, NULL);
            int32_t r = -1;
            if (fd < 0 || set_timeout(fd, timeout_s) || xfer(fd, &r, 4, false, 0, -1) || r <= 0 || r >= size ||
                c->peer[r] >= 0) {
                if (fd < 0)
                    keel_fail("rank 0: %d of %d ranks joined within %.0f s", k, size, timeout_s);
                else if (r <= 0 || r >= size)
                    keel_fail("rank 0: a peer claimed rank %d", r);
                if (fd >= 0) close(fd);
                close(ls);
                keel_coll_free(c);
                return NULL;
            }
            c->peer[r] = fd;
        }
        close(ls);
    } else {
        int fd = -1;
        double t0 = keel_now_s();
        for (;;) { /* rank 0 may not be listening yet */
            fd = socket(AF_INET, SOCK_STREAM, 0);
            if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) break;
            if (fd >= 0) close(fd);
            if (keel_now_s() - t0 > timeout_s) {
                keel_fail("rank %d: cannot reach rank 0 at %s:%d within %.0f s", rank, addr ? addr : "127.0.0.1", prt,
                          timeout_s);
                keel_coll_free(c);
                return NULL;
            }
            usleep(50000);
        }
        int32_t r = rank;
        if (set_timeout(fd, timeout_s) || xfer(fd, &r, 4, true, rank, 0)) {
            close(fd);
            keel_coll_free(c);
            return NULL;
        }
        c->peer[0] = fd;
    }
    *failed = 0;
    return c;
}

void keel_coll_free(keel_coll *c) {
    if (!c) return;
#ifdef KEEL_HAVE_NCCL
    keel_nccl_free(c->nccl);
#endif
    for (int i = 0; i < c->size; i++)
        if (c->peer[i] >= 0) close(c->peer[i]);
    free(c->peer), free(c->tmp), free(c->stage), free(c);
}

int keel_coll_rank(const keel_coll *c) { return c ? c->rank : 0; }
int keel_coll_size(const keel_coll *c) { return c ? c->size : 1; }

/* Gather to rank 0, sum in rank order, send back; es is 4 (float) or 8 (double). */
static int allreduce(keel_coll *c, void *buf, size_t n, size_t es) {
    if (!c) return 0;
    if (c->rank != 0) {
        uint64_t len = n;
        if (xfer(c->peer[0], &len, 8, true, c->rank, 0) || xfer(c->peer[0], buf, n * es, true, c->rank, 0)) return -1;
        return xfer(c->peer[0], buf, n * es, false, c->rank, 0);
    }
    if (c->tmp_n < n * es) {
        free(c->tmp);
        c->tmp = malloc(n * es);
        c->tmp_n = c->tmp ? n * es : 0;
        if (!c->tmp) return keel_fail("out of memory");
    }
    for (int r = 1; r < c->size; r++) { /* the sum in rank order: ((b0 + b1) + b2) + ... */
        uint64_t len;
        if (xfer(c->peer[r], &len, 8, false, 0, r)) return -1;
        if (len != n) return keel_fail("rank 0: rank %d sent %llu values, expected %zu", r, (unsigned long long)len, n);
        if (xfer(c->peer[r], c->tmp, n * es, false, 0, r)) return -1;
        if (es == 4)
            for (size_t i = 0; i < n; i++) ((float *)buf)[i] += ((float *)c->tmp)[i];
        else
            for (size_t i = 0; i < n; i++) ((double *)buf)[i] += ((double *)c->tmp)[i];
    }
    for (int r = 1; r < c->size; r++)
        if (xfer(c->peer[r], buf, n * es, true, 0, r)) return -1;
    return 0;
}

int keel_coll_allreduce_sum_f64(keel_coll *c, double *buf, size_t n) { return allreduce(c, buf, n, 8); }

int keel_coll_broadcast(keel_coll *c, void *buf, size_t n) {
    if (!c) return 0;
    if (c->rank != 0) return xfer(c->peer[0], buf, n, false, c->rank, 0);
    for (int r = 1; r < c->size; r++)
        if (xfer(c->peer[r], buf, n, true, 0, r)) return -1;
    return 0;
}

int keel_coll_attach_backend(keel_coll *c, keel_backend *be, const char **name) {
    *name = "TCP all-reduce through host memory (rank order)";
    if (!c) return 0;
    const char *want = getenv("KEEL_DIST_COLLECTIVE");
    if (want && *want && strcmp(want, "tcp") && strcmp(want, "nccl"))
        return keel_fail("KEEL_DIST_COLLECTIVE='%s': expected tcp or nccl", want);
    bool gpu = be->on_device;
#ifdef KEEL_HAVE_NCCL
    if (gpu && !(want && !strcmp(want, "tcp"))) {
        unsigned char id[KEEL_NCCL_ID_BYTES];
        if (c->rank == 0 && keel_nccl_unique_id(id)) return -1;
        if (keel_coll_broadcast(c, id, sizeof id)) return -1;
        c->nccl = keel_nccl_new(be, c->rank, c->size, id, c->timeout_s);
        if (!c->nccl) return -1;
        *name = "NCCL all-reduce on the GPU";
        return 0;
    }
#endif
    if (want && !strcmp(want, "nccl"))
        return keel_fail("KEEL_DIST_COLLECTIVE=nccl: %s", gpu ? "this build has no NCCL" : "NCCL needs --backend cuda");
    return 0;
}

int keel_coll_allreduce_tensors(keel_coll *c, keel_backend *be, keel_tensor *const *ts, int n) {
    if (!c) return 0;
#ifdef KEEL_HAVE_NCCL
    if (c->nccl) return keel_nccl_allreduce(c->nccl, ts, n);
#endif
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (size_t)keel_nelements(ts[i]);
    if (c->stage_n < total) {
        free(c->stage);
        c->stage = malloc(total * sizeof *c->stage);
        c->stage_n = c->stage ? total : 0;
        if (!c->stage) return keel_fail("out of memory for a gradient bucket of %zu values", total);
    }
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        if (keel_tensor_read(be, ts[i], c->stage + at, KEEL_F32)) return -1;
        at += (size_t)keel_nelements(ts[i]);
    }
    if (allreduce(c, c->stage, total, 4)) return -1;
    at = 0;
    for (int i = 0; i < n; i++) {
        if (keel_tensor_write(be, ts[i], c->stage + at, KEEL_F32)) return -1;
        at += (size_t)keel_nelements(ts[i]);
    }
    return 0;
}

int keel_coll_wait(keel_coll *c, keel_backend *be) {
    (void)be;
    if (!c) return 0;
#ifdef KEEL_HAVE_NCCL
    if (c->nccl) return keel_nccl_wait(c->nccl);
#endif
    return 0; /* the TCP sums finished when they were started */
}
