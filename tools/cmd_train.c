/* keel train: flags -> keel_train_run. */
#define _DEFAULT_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli.h"
#include "train/train.h"
#include "util/error.h"

static void on_sigint(int sig) {
    (void)sig;
    keel_train_stop = 1;
}

static void help(const keel_train_opts *d) {
    printf("usage: keel train (--model DIR | --preset NAME | --init CONFIG.json | --resume DIR) --data PATH... --out DIR [options]\n\n"
           "model (exactly one):\n"
           "  --model DIR            a Hugging Face Qwen3.5 checkpoint folder to fine-tune\n"
           "  --preset NAME          a fresh model: tiny, small (the demo's), 0.8b\n"
           "  --init CONFIG.json     a fresh model from a config.json\n"
           "  --resume DIR           a checkpoint keel train wrote (OUT/checkpoint): continue up to --steps\n"
           "data:\n"
           "  --data PATH...         text files, folders of them, .jsonl files with a \"text\" field (one or more)\n"
           "  --tokenizer FILE       tokenizer.json (default: the model folder's, else a byte vocabulary)\n"
           "  --eval-fraction F      documents held out for evaluation (default %g)\n"
           "  --window T             tokens per sample (default %lld)\n"
           "  --batch B              samples per micro-batch (default %lld)\n"
           "  --accum N              micro-batches per optimiser step (default %lld)\n"
           "optimisation (AdamW, betas 0.9/0.95, decoupled weight decay):\n"
           "  --steps N              total optimiser steps (default %lld); the schedule spans them\n"
           "  --stop-at N            stop (with a checkpoint) after step N of the --steps schedule\n"
           "  --lr X                 peak learning rate (default %g)\n"
           "  --lr-min X             final learning rate of the cosine decay (default %g)\n"
           "  --warmup N             linear warm-up steps (default %lld)\n"
           "  --weight-decay X       on matrices; none on norms, gates and biases (default %g)\n"
           "  --clip X               global gradient-norm clipping, 0 for none (default %g)\n"
           "  --freeze REGEX         do not train the parameters whose names match (POSIX extended regex)\n"
           "  --seed N               data order, held-out split and fresh weights (default %llu)\n"
           "run:\n"
           "  --out DIR              checkpoint, metrics.jsonl and the token cache go here (required)\n"
           "  --eval-every N         evaluate every N steps, and at the end (default %lld)\n"
           "  --eval-batches N       batches per evaluation (default %lld)\n"
           "  --save-every N         checkpoint every N steps, and at the end (default: the end only)\n"
           "  --backend B            ref, cpu or cuda (this build has %s; default %s)\n"
           "  --threads N            cpu threads (default %lld)\n"
           "  --recompute MODE       off, full, every:N, layers:i,j (default %s; bitwise the same results)\n"
           "  --nproc N              data-parallel processes on this host (one per GPU); --batch is per process.\n"
           "                         Several hosts: start one process per rank with KEEL_RANK, KEEL_WORLD_SIZE,\n"
           "                         KEEL_MASTER_ADDR, KEEL_MASTER_PORT set (as mpirun or srun would)\n"
           "  --dist-timeout S       seconds a rank waits for another before giving up (default 60)\n"
           "  --trace FILE           trace step --trace-step (default %lld) for keel diff\n"
           "  --trace-data           store each node's output in the trace (for --tolerance), up to\n"
           "  --trace-max-bytes N    bytes of such data (default 256 MiB)\n"
           "  --trace-sample N       keep only N evenly spaced values of each node (large models)\n"
           "Ctrl-C saves a checkpoint after the current step and stops.\n",
           d->eval_fraction, (long long)d->window, (long long)d->batch, (long long)d->accum, (long long)d->steps, d->lr, d->lr_min,
           (long long)d->warmup, d->weight_decay, d->clip, (unsigned long long)d->seed, (long long)d->eval_every,
           (long long)d->eval_batches, keel_backend_list(), d->backend, (long long)d->threads, d->recompute, (long long)d->trace_step);
}

int cmd_train(int argc, char **argv) {
    keel_train_opts o;
    keel_train_defaults(&o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long x;
#define STR(flag, field) if (!strcmp(a, flag) && v) { o.field = v; i++; continue; }
#define INT(flag, field, min) if (!strcmp(a, flag)) { if ((x = cli_int(a, v, min)) < 0) return 2; o.field = x; i++; continue; }
#define DBL(flag, field) if (!strcmp(a, flag) && v) { char *e; o.field = strtod(v, &e); if (*e || e == v || o.field < 0) { fprintf(stderr, "keel train: %s expects a non-negative number, got '%s'\n", a, v); return 2; } i++; continue; }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { help(&o); return 0; }
        if (!strcmp(a, "--data")) {
            while (i + 1 < argc && argv[i + 1][0] != '-' && o.n_data < 64) o.data[o.n_data++] = argv[++i];
            if (!o.n_data) { fprintf(stderr, "keel train: --data needs a path\n"); return 2; }
            continue;
        }
        STR("--model", model_dir) STR("--preset", preset) STR("--init", init_config) STR("--resume", resume_dir)
        STR("--tokenizer", tokenizer) STR("--out", out_dir) STR("--backend", backend) STR("--recompute", recompute)
        STR("--freeze", freeze) STR("--trace", trace)
        INT("--steps", steps, 1) INT("--stop-at", stop_at, 1) INT("--window", window, 1) INT("--batch", batch, 1) INT("--accum", accum, 1)
        INT("--warmup", warmup, 0) INT("--eval-every", eval_every, 0) INT("--save-every", save_every, 0)
        INT("--nproc", nproc, 1)
        if (!strcmp(a, "--dist-timeout") && v) { o.dist_timeout = atof(v); if (o.dist_timeout <= 0) { fprintf(stderr, "keel train: --dist-timeout must be positive\n"); return 2; } i++; continue; }
        INT("--threads", threads, 1) INT("--trace-step", trace_step, 1) INT("--trace-max-bytes", trace_max_bytes, 0) INT("--trace-sample", trace_sample, 1)
        if (!strcmp(a, "--trace-data")) { o.trace_data = true; continue; } INT("--eval-batches", eval_batches, 1)
        DBL("--lr", lr) DBL("--lr-min", lr_min) DBL("--weight-decay", weight_decay) DBL("--clip", clip) DBL("--eval-fraction", eval_fraction)
        if (!strcmp(a, "--seed")) { if ((x = cli_int(a, v, 0)) < 0) return 2; o.seed = (uint64_t)x; i++; continue; }
        fprintf(stderr, "keel train: unknown or incomplete option '%s' (see keel train --help)\n", a);
        return 2;
#undef STR
#undef INT
#undef DBL
    }
    if (o.eval_fraction >= 1) { fprintf(stderr, "keel train: --eval-fraction must be below 1\n"); return 2; }
    signal(SIGINT, on_sigint);
    if (o.nproc > 1 && !getenv("KEEL_WORLD_SIZE")) { /* start the ranks here, on loopback */
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof sa;
        if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) || getsockname(fd, (struct sockaddr *)&sa, &len)) {
            fprintf(stderr, "keel train: --nproc: cannot find a free port\n");
            return 1;
        }
        close(fd);
        char port[16], world[16];
        snprintf(port, sizeof port, "%d", ntohs(sa.sin_port));
        snprintf(world, sizeof world, "%lld", (long long)o.nproc);
        pid_t *pids = calloc((size_t)o.nproc, sizeof *pids);
        for (int r = 0; r < o.nproc; r++) {
            pid_t pid = fork();
            if (pid == 0) {
                char rank[16];
                snprintf(rank, sizeof rank, "%d", r);
                setenv("KEEL_RANK", rank, 1), setenv("KEEL_WORLD_SIZE", world, 1), setenv("KEEL_MASTER_ADDR", "127.0.0.1", 1), setenv("KEEL_MASTER_PORT", port, 1);
                setenv("KEEL_LOCAL_RANK", rank, 1); /* one GPU per process: rank r takes GPU r */
                _exit(keel_train_run(&o));
            }
            pids[r] = pid;
        }
        /* The first failure stops the rest: they get a few seconds to notice on their own (and
         * say so), then SIGTERM. */
        int result = 0, left = (int)o.nproc, waited_ms = 0;
        while (left > 0) {
            int status;
            pid_t pid = waitpid(-1, &status, result ? WNOHANG : 0);
            if (pid < 0) break;
            if (pid == 0) { /* a failure happened; the others are still running */
                usleep(50000);
                if ((waited_ms += 50) == 5000)
                    for (int k = 0; k < o.nproc; k++) if (pids[k] > 0) kill(pids[k], SIGTERM);
                continue;
            }
            left--;
            int r = 0;
            while (r < o.nproc && pids[r] != pid) r++;
            if (r < o.nproc) pids[r] = -1;
            int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            if (code && !result) {
                fprintf(stderr, "keel train: rank %d exited with status %d; stopping the other ranks\n", r, code);
                result = code;
            }
        }
        free(pids);
        return result;
    }
    int r = keel_train_run(&o);
    return r;
}
