#define _DEFAULT_SOURCE /* realpath */
#include "train/options.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io/run_folder.h"
#include "util/error.h"
#include "util/file.h"

typedef enum { K_STR, K_INT, K_DBL, K_U64, K_BOOL, K_LIST } kind;
typedef enum { R_SOURCE, R_FIXED, R_MAY, R_RUN } rule;

typedef struct {
    kind k;
    const char *name, *flag, *meta; /* name: the field, as trainer_state.json spells it */
    size_t off;
    const char *def_str;
    double def_num, min, max;
    rule r;
    const char *help, *section; /* section: a --help heading that comes before this row */
} option;

#define K_OF_STR    K_STR
#define K_OF_INT    K_INT
#define K_OF_DBL    K_DBL
#define K_OF_U64    K_U64
#define K_OF_BOOL   K_BOOL
#define K_OF_LIST   K_LIST
#define DEF_STR(d)  .def_str = d
#define DEF_INT(d)  .def_num = (double)(d)
#define DEF_DBL(d)  .def_num = (double)(d)
#define DEF_U64(d)  .def_num = (double)(d)
#define DEF_BOOL(d) .def_num = (double)(d)
#define DEF_LIST(d) .def_str = d
#define ROW(kind, field, fl, mv, def, lo, hi, rs, text)                                                                \
    {.k = K_OF_##kind,                                                                                                 \
     .name = #field,                                                                                                   \
     .flag = fl,                                                                                                       \
     .meta = mv,                                                                                                       \
     .off = offsetof(keel_train_opts, field),                                                                          \
     DEF_##kind(def),                                                                                                  \
     .min = (double)(lo),                                                                                              \
     .max = (double)(hi),                                                                                              \
     .r = R_##rs,                                                                                                      \
     .help = text},
#define SECTION(title) {.k = K_BOOL, .section = title},

static const option OPTIONS[] = {KEEL_TRAIN_OPTIONS(ROW, SECTION)};
#define N_OPTIONS (sizeof OPTIONS / sizeof OPTIONS[0])

static void *at(keel_train_opts *o, const option *d) { return (char *)o + d->off; }
static const void *at_c(const keel_train_opts *o, const option *d) { return (const char *)o + d->off; }
/* the LIST field's count: the int that follows its array (KEEL_OPT_FIELD_LIST) */
static int *list_n(keel_train_opts *o, const option *d) {
    return (int *)((char *)o + d->off + sizeof(const char *[KEEL_TRAIN_MAX_DATA]));
}

void keel_train_defaults(keel_train_opts *o) {
    memset(o, 0, sizeof *o);
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const option *d = &OPTIONS[i];
        if (d->section) continue;
        switch (d->k) {
        case K_STR:
            *(const char **)at(o, d) = d->def_str;
            break;
        case K_INT:
            *(int64_t *)at(o, d) = (int64_t)d->def_num;
            break;
        case K_DBL:
            *(double *)at(o, d) = d->def_num;
            break;
        case K_U64:
            *(uint64_t *)at(o, d) = (uint64_t)d->def_num;
            break;
        case K_BOOL:
            *(bool *)at(o, d) = d->def_num != 0;
            break;
        case K_LIST:
            break;
        }
    }
}

void keel_train_help(const char *backends) {
    keel_train_opts def;
    keel_train_defaults(&def);
    printf("usage: keel train (--model DIR | --preset NAME | --init CONFIG.json | --resume DIR) --data PATH... --out "
           "DIR [options]\n");
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const option *d = &OPTIONS[i];
        if (d->section) {
            printf("%s:\n", d->section);
            continue;
        }
        char lhs[64], dv[64] = "";
        snprintf(lhs, sizeof lhs, "%s%s%s", d->flag, d->meta[0] ? " " : "", d->meta);
        switch (d->k) {
        case K_STR:
            if (d->def_str) snprintf(dv, sizeof dv, " (default %s)", d->def_str);
            break;
        case K_INT:
            if (d->def_num != 0 || d->min <= 0) snprintf(dv, sizeof dv, " (default %lld)", (long long)d->def_num);
            break;
        case K_DBL:
            snprintf(dv, sizeof dv, " (default %g)", d->def_num);
            break;
        case K_U64:
            snprintf(dv, sizeof dv, " (default %llu)", (unsigned long long)d->def_num);
            break;
        default:
            break;
        }
        char text[1024];
        snprintf(text, sizeof text, "%s%s%s%s", d->help, dv, strcmp(d->flag, "--backend") ? "" : "; this build has ",
                 strcmp(d->flag, "--backend") ? "" : backends);
        printf("  %-22s", lhs);
        int col = 25; /* words wrapped at 110 columns, continued under the text */
        for (char *w = strtok(text, " "); w; w = strtok(NULL, " ")) {
            int len = (int)strlen(w);
            if (col + 1 + len > 110) printf("\n%24s", ""), col = 24;
            printf(" %s", w), col += 1 + len;
        }
        printf("\n");
    }
    printf(
        "--resume DIR takes every setting the checkpoint recorded; of the flags given again, --steps, --out,\n"
        "--eval-every, --eval-batches, --save-every, --backend, --threads and --recompute change the rest of the run,\n"
        "and a setting that fixes the run's data, batches or schedule must keep its value.\n"
        "Ctrl-C saves a checkpoint after the current step and stops.\n");
}

static const option *find_flag(const char *flag) {
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (!OPTIONS[i].section && strcmp(OPTIONS[i].flag, flag) == 0) return &OPTIONS[i];
    return NULL;
}

/* One value into o, checked against the row's range; -1 naming the flag (or where it came from). */
static int set_value(keel_train_opts *o, const option *d, const char *v, const char *from) {
    char *end;
    errno = 0;
    if (d->k == K_STR) {
        *(const char **)at(o, d) = v;
        return 0;
    }
    if (d->k == K_DBL) {
        double x = strtod(v, &end);
        if (errno || *end || end == v || !isfinite(x) || x < d->min || x > d->max)
            return keel_fail("%s%s expects a number in [%g, %g], got '%s'", from, d->flag, d->min, d->max, v);
        *(double *)at(o, d) = x;
        return 0;
    }
    long long x = strtoll(v, &end, 10);
    if (errno || *end || end == v || x < (long long)d->min || (double)x > d->max)
        return keel_fail("%s%s expects an integer in [%lld, %.0f], got '%s'", from, d->flag, (long long)d->min, d->max,
                         v);
    if (d->k == K_U64)
        *(uint64_t *)at(o, d) = (uint64_t)x;
    else
        *(int64_t *)at(o, d) = x;
    return 0;
}

/* The absolute form of a path, to record and to compare (the path itself when it does not resolve). */
static const char *absolute(const char *p, char buf[PATH_MAX]) { return p && realpath(p, buf) ? buf : p; }

static bool same_value(const keel_train_opts *a, const keel_train_opts *b, const option *d) {
    switch (d->k) {
    case K_STR: {
        const char *x = *(const char *const *)at_c(a, d), *y = *(const char *const *)at_c(b, d);
        char bx[PATH_MAX], by[PATH_MAX];
        if (!x || !y) return x == y;
        return strcmp(x, y) == 0 || strcmp(absolute(x, bx), absolute(y, by)) == 0;
    }
    case K_INT:
        return *(const int64_t *)at_c(a, d) == *(const int64_t *)at_c(b, d);
    case K_DBL:
        return *(const double *)at_c(a, d) == *(const double *)at_c(b, d);
    case K_U64:
        return *(const uint64_t *)at_c(a, d) == *(const uint64_t *)at_c(b, d);
    case K_BOOL:
        return *(const bool *)at_c(a, d) == *(const bool *)at_c(b, d);
    case K_LIST: {
        const char *const *x = at_c(a, d), *const *y = at_c(b, d);
        int nx = *list_n((keel_train_opts *)a, d), ny = *list_n((keel_train_opts *)b, d);
        if (nx != ny) return false;
        char bx[PATH_MAX], by[PATH_MAX];
        for (int i = 0; i < nx; i++)
            if (strcmp(x[i], y[i]) && strcmp(absolute(x[i], bx), absolute(y[i], by))) return false;
        return true;
    }
    }
    return false;
}

static void copy_value(keel_train_opts *dst, const keel_train_opts *src, const option *d) {
    size_t n = d->k == K_STR    ? sizeof(const char *)
               : d->k == K_INT  ? sizeof(int64_t)
               : d->k == K_DBL  ? sizeof(double)
               : d->k == K_U64  ? sizeof(uint64_t)
               : d->k == K_BOOL ? sizeof(bool)
                                : sizeof(const char *[KEEL_TRAIN_MAX_DATA]);
    memcpy(at(dst, d), at_c(src, d), n);
    if (d->k == K_LIST) *list_n(dst, d) = *list_n((keel_train_opts *)src, d);
}

static char *value_text(const keel_train_opts *o, const option *d, char *buf, size_t n) {
    switch (d->k) {
    case K_STR:
        snprintf(buf, n, "%s", *(const char *const *)at_c(o, d) ? *(const char *const *)at_c(o, d) : "(none)");
        break;
    case K_INT:
        snprintf(buf, n, "%lld", (long long)*(const int64_t *)at_c(o, d));
        break;
    case K_DBL:
        snprintf(buf, n, "%.17g", *(const double *)at_c(o, d));
        break;
    case K_U64:
        snprintf(buf, n, "%llu", (unsigned long long)*(const uint64_t *)at_c(o, d));
        break;
    case K_BOOL:
        snprintf(buf, n, "%s", *(const bool *)at_c(o, d) ? "on" : "off");
        break;
    case K_LIST: {
        const char *const *x = at_c(o, d);
        int k = *list_n((keel_train_opts *)o, d);
        size_t used = 0;
        buf[0] = 0;
        for (int i = 0; i < k && used < n; i++)
            used += (size_t)snprintf(buf + used, n - used, "%s%s", i ? " " : "", x[i]);
        break;
    }
    }
    return buf;
}

cJSON *keel_train_opts_json(const keel_train_opts *o) {
    cJSON *j = cJSON_CreateObject();
    for (size_t i = 0; j && i < N_OPTIONS; i++) {
        const option *d = &OPTIONS[i];
        if (d->section || (d->r != R_FIXED && d->r != R_MAY)) continue;
        char buf[32], path[PATH_MAX];
        switch (d->k) {
        case K_STR: {
            const char *v = *(const char *const *)at_c(o, d);
            const char *p =
                v && (strcmp(d->name, "tokenizer") == 0 || strcmp(d->name, "out_dir") == 0) ? absolute(v, path) : v;
            if (p)
                cJSON_AddStringToObject(j, d->name, p);
            else
                cJSON_AddNullToObject(j, d->name);
            break;
        }
        case K_INT:
            cJSON_AddNumberToObject(j, d->name, (double)*(const int64_t *)at_c(o, d));
            break;
        case K_DBL:
            cJSON_AddNumberToObject(j, d->name, *(const double *)at_c(o, d));
            break;
        case K_U64: /* as text: a 64-bit seed does not survive a JSON number */
            snprintf(buf, sizeof buf, "%llu", (unsigned long long)*(const uint64_t *)at_c(o, d));
            cJSON_AddStringToObject(j, d->name, buf);
            break;
        case K_BOOL:
            cJSON_AddBoolToObject(j, d->name, *(const bool *)at_c(o, d));
            break;
        case K_LIST: {
            cJSON *a = cJSON_AddArrayToObject(j, d->name);
            const char *const *x = at_c(o, d);
            for (int k = 0; a && k < *list_n((keel_train_opts *)o, d); k++)
                cJSON_AddItemToArray(a, cJSON_CreateString(absolute(x[k], path)));
            break;
        }
        }
    }
    return j;
}

/* The strings parsing allocates (settings read from a checkpoint, the located --resume folder):
 * kept here and freed together by keel_train_opts_release, since options point at them and at
 * argv alike. */
static char **g_owned;
static int g_n_owned, g_cap_owned;

static char *owned(const char *s) {
    char *c = s ? strdup(s) : NULL;
    if (c && g_n_owned == g_cap_owned) {
        int cap = g_cap_owned ? 2 * g_cap_owned : 32;
        char **n = realloc(g_owned, (size_t)cap * sizeof *n);
        if (!n) return free(c), NULL;
        g_owned = n, g_cap_owned = cap;
    }
    if (c) g_owned[g_n_owned++] = c;
    return c;
}

void keel_train_opts_release(void) {
    for (int i = 0; i < g_n_owned; i++) free(g_owned[i]);
    free(g_owned);
    g_owned = NULL, g_n_owned = g_cap_owned = 0;
}

/* The settings a checkpoint recorded, over the defaults, each checked as a flag would be. 1 when
 * the checkpoint recorded none (written before keel recorded them). */
static int read_recorded(const char *dir, keel_train_opts *o) {
    char p[4096 + 32];
    struct stat st;
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    if (stat(p, &st) != 0)
        return keel_fail("--resume %s: no trainer_state.json (not a checkpoint keel train wrote?)", dir);
    cJSON *j = keel_read_json(p);
    if (!j) return -1;
    const cJSON *rec = cJSON_GetObjectItemCaseSensitive(j, "options");
    if (!cJSON_IsObject(rec)) {
        cJSON_Delete(j);
        return 1;
    }
    int rc = 0;
    char from[4096 + 64];
    snprintf(from, sizeof from, "%s: recorded ", p);
    for (size_t i = 0; i < N_OPTIONS && !rc; i++) {
        const option *d = &OPTIONS[i];
        if (d->section || (d->r != R_FIXED && d->r != R_MAY)) continue;
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(rec, d->name);
        if (!v) continue; /* not recorded: the default */
        char num[64];
        if (d->k == K_STR && cJSON_IsNull(v))
            *(const char **)at(o, d) = NULL;
        else if (d->k == K_STR && cJSON_IsString(v))
            rc = set_value(o, d, owned(v->valuestring), from);
        else if ((d->k == K_INT || d->k == K_DBL) && cJSON_IsNumber(v))
            snprintf(num, sizeof num, "%.17g", v->valuedouble), rc = set_value(o, d, num, from);
        else if (d->k == K_U64 && cJSON_IsString(v))
            rc = set_value(o, d, v->valuestring, from);
        else if (d->k == K_BOOL && cJSON_IsBool(v))
            *(bool *)at(o, d) = cJSON_IsTrue(v);
        else if (d->k == K_LIST && cJSON_IsArray(v) && cJSON_GetArraySize(v) <= KEEL_TRAIN_MAX_DATA) {
            const char **x = at(o, d);
            int n = 0;
            const cJSON *it;
            cJSON_ArrayForEach(it, v) {
                if (!cJSON_IsString(it)) {
                    rc = keel_fail("%s \"%s\" holds a non-string", from, d->name);
                    break;
                }
                x[n++] = owned(it->valuestring);
            }
            *list_n(o, d) = n;
        } else {
            rc = keel_fail("%s \"%s\" has the wrong type", from, d->name);
        }
    }
    cJSON_Delete(j);
    return rc;
}

int keel_train_parse(int argc, char **argv, keel_train_opts *o) {
    keel_train_opts given;
    bool set[N_OPTIONS] = {false};
    keel_train_defaults(&given);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return 1;
        const option *d = find_flag(a);
        if (!d) return keel_fail("unknown or incomplete option '%s' (see keel train --help)", a);
        set[d - OPTIONS] = true;
        if (d->k == K_BOOL) {
            *(bool *)at(&given, d) = true;
        } else if (d->k == K_LIST) {
            const char **x = at(&given, d);
            int *n = list_n(&given, d);
            while (i + 1 < argc && argv[i + 1][0] != '-') {
                if (*n == KEEL_TRAIN_MAX_DATA) return keel_fail("%s: at most %d paths", a, KEEL_TRAIN_MAX_DATA);
                x[(*n)++] = argv[++i];
            }
            if (!*n) return keel_fail("%s needs a path", a);
        } else {
            if (!v) return keel_fail("%s needs a value", a);
            if (set_value(&given, d, v, "")) return -1;
            i++;
        }
    }
    if (given.resume_dir) { /* a checkpoint folder, or a run's --out: its newest complete checkpoint */
        char at[4096];
        if (keel_resume_locate(given.resume_dir, at, sizeof at)) return -1;
        given.resume_dir = owned(at);
        if (!given.resume_dir) return keel_fail("out of memory");
    }
    *o = given;
    if (!given.resume_dir) return 0;
    keel_train_opts rec;
    keel_train_defaults(&rec);
    int r = read_recorded(given.resume_dir, &rec);
    if (r < 0) return -1;
    if (r == 1) return 0; /* an older checkpoint: the flags as given (the trainer still checks window, batch, seed) */
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const option *d = &OPTIONS[i];
        if (d->section || (d->r != R_FIXED && d->r != R_MAY)) continue;
        if (!set[i]) {
            copy_value(o, &rec, d);
        } else if (d->r == R_FIXED && !same_value(&given, &rec, d)) {
            char a[512], b[512];
            return keel_fail("--resume %s: %s cannot change in a resumed run (the run used %s; given %s)",
                             given.resume_dir, d->flag, value_text(&rec, d, a, sizeof a),
                             value_text(&given, d, b, sizeof b));
        }
    }
    return 0;
}
