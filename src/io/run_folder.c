#define _DEFAULT_SOURCE /* flock, gethostname */
#include "io/run_folder.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/error.h"
#include "util/file.h"

int keel_run_lock(const char *dir, int *fd) {
    char path[4200];
    *fd = -1;
    snprintf(path, sizeof path, "%s/keel.lock", dir);
    int f = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (f < 0) return keel_fail("%s: cannot open the run's lock: %s", path, strerror(errno));
    if (flock(f, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char who[256] = "";
        ssize_t n = pread(f, who, sizeof who - 1, 0);
        who[n > 0 ? n : 0] = 0;
        who[strcspn(who, "\n")] = 0;
        close(f);
        if (e == EWOULDBLOCK)
            return keel_fail("--out %s is in use by another keel run (%s); two runs on one folder would overwrite "
                             "each other's checkpoint and metrics: wait for it, stop it, or choose another --out",
                             dir, who[0] ? who : "its pid not recorded yet");
        return keel_fail("%s: cannot lock: %s", path, strerror(e));
    }
    char host[128] = "?", rec[256];
    gethostname(host, sizeof host - 1);
    int len = snprintf(rec, sizeof rec, "pid %ld on %s\n", (long)getpid(), host);
    if (ftruncate(f, 0) != 0 || pwrite(f, rec, (size_t)len, 0) != len) { /* the record is a courtesy */
    }
    *fd = f;
    return 0;
}

static bool starts(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

int keel_run_clean(const char *dir, const char *keep, int *n_removed) {
    *n_removed = 0;
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : keel_fail("%s: cannot list: %s", dir, strerror(errno));
    struct stat ks;
    bool have_keep = keep && stat(keep, &ks) == 0;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) && !rc) {
        if (!starts(e->d_name, "checkpoint.tmp.") && !starts(e->d_name, "checkpoint.old.") &&
            !starts(e->d_name, "tokens.cache.tmp.") && !starts(e->d_name, "metrics.jsonl.tmp."))
            continue;
        char p[4400];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (have_keep && lstat(p, &st) == 0 && st.st_dev == ks.st_dev && st.st_ino == ks.st_ino) continue;
        rc = keel_remove_tree(p);
        if (!rc) ++*n_removed;
    }
    closedir(d);
    return rc;
}

/* The step a checkpoint folder's trainer_state.json records; -1 when it has none or it is unreadable. */
static long long recorded_step(const char *dir) {
    char p[4500];
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    struct stat st;
    if (lstat(p, &st) != 0 || !S_ISREG(st.st_mode)) return -1;
    cJSON *j = keel_read_json(p);
    const cJSON *s = j ? cJSON_GetObjectItemCaseSensitive(j, "step") : NULL;
    long long v = cJSON_IsNumber(s) && s->valuedouble >= 0 && s->valuedouble < 9e15 ? (long long)s->valuedouble : -1;
    cJSON_Delete(j);
    return v;
}

int keel_resume_locate(const char *dir, char *out, size_t n) {
    char p[4400];
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    struct stat st;
    if (stat(p, &st) == 0) return snprintf(out, n, "%s", dir) < (int)n ? 0 : keel_fail("%s: path too long", dir);
    snprintf(p, sizeof p, "%s/checkpoint/trainer_state.json", dir);
    if (stat(p, &st) == 0)
        return snprintf(out, n, "%s/checkpoint", dir) < (int)n ? 0 : keel_fail("%s: path too long", dir);
    DIR *d = opendir(dir);
    if (!d) return keel_fail("--resume %s: %s", dir, strerror(errno));
    long long best = -1;
    struct dirent *e;
    while ((e = readdir(d))) { /* a swap stopped between its renames: the old checkpoint, complete */
        if (!starts(e->d_name, "checkpoint.old.")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        long long s = recorded_step(p);
        if (s > best && snprintf(out, n, "%s", p) < (int)n) best = s;
    }
    closedir(d);
    if (best < 0)
        return keel_fail("--resume %s: no checkpoint here (no trainer_state.json in it or in %s/checkpoint; is it "
                         "a folder keel train wrote?)",
                         dir, dir);
    fprintf(stderr,
            "keel train: --resume %s: no %s/checkpoint (a save was interrupted); continuing from %s (step %lld)\n", dir,
            dir, out, best);
    return 0;
}
