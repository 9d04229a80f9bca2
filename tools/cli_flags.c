#include "cli_flags.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cli_usage(const cli_spec *s, FILE *f) {
    fprintf(f, "usage: %s", s->cmd);
    for (int i = 0; i < s->n; i++) {
        const cli_flag *x = &s->flags[i];
        const char *open = x->required ? "" : "[", *close = x->required ? "" : "]";
        if (!x->flag)
            fprintf(f, " %s%s%s", open, x->meta, close);
        else if (x->kind == CLI_BOOL)
            fprintf(f, " %s%s%s", open, x->flag, close);
        else
            fprintf(f, " %s%s %s%s", open, x->flag, x->meta, close);
    }
    fprintf(f, "\n");
}

void cli_help(const cli_spec *s) {
    cli_usage(s, stdout);
    printf("  %s\n", s->summary);
    for (int i = 0; i < s->n; i++) {
        const cli_flag *x = &s->flags[i];
        char lhs[64];
        if (!x->flag)
            snprintf(lhs, sizeof lhs, "%s", x->meta);
        else
            snprintf(lhs, sizeof lhs, "%s%s%s", x->flag, x->kind == CLI_BOOL ? "" : " ",
                     x->kind == CLI_BOOL ? "" : x->meta);
        printf("  %-22s %s\n", lhs, x->help);
    }
}

static int fail(const cli_spec *s, const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "%s: ", s->cmd);
    fprintf(stderr, fmt, a, b);
    fprintf(stderr, "\n");
    cli_usage(s, stderr);
    return 2;
}

static int set(const cli_spec *s, const cli_flag *x, const char *name, const char *v) {
    char *end;
    errno = 0;
    if (x->kind == CLI_STR) {
        *(const char **)x->dst = v;
    } else if (x->kind == CLI_INT) {
        long long n = strtoll(v, &end, 10);
        if (errno || *end || end == v || (double)n < x->min || (double)n > x->max) {
            char range[96];
            snprintf(range, sizeof range, "an integer in [%.0f, %.0f]", x->min, x->max);
            fprintf(stderr, "%s: %s expects %s, got '%s'\n", s->cmd, name, range, v);
            return 2;
        }
        *(long long *)x->dst = n;
    } else {
        double d = strtod(v, &end);
        if (errno || *end || end == v || !isfinite(d) || d < x->min || d > x->max) {
            fprintf(stderr, "%s: %s expects a number in [%g, %g], got '%s'\n", s->cmd, name, x->min, x->max, v);
            return 2;
        }
        *(double *)x->dst = d;
    }
    return 0;
}

int cli_parse(const cli_spec *s, int argc, char **argv) {
    bool seen[64] = {false};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            cli_help(s);
            return 1;
        }
        const cli_flag *x = NULL;
        int k = 0;
        if (a[0] == '-' && a[1]) { /* a flag ("-" alone is a value: standard input) */
            for (k = 0; k < s->n && !x; k++)
                if (s->flags[k].flag && strcmp(s->flags[k].flag, a) == 0) x = &s->flags[k];
            if (!x) return fail(s, "unknown or incomplete option '%s'%s", a, "");
            k--;
        } else { /* the next positional argument */
            for (k = 0; k < s->n && !x; k++)
                if (!s->flags[k].flag && !seen[k]) x = &s->flags[k];
            if (!x) return fail(s, "unexpected argument '%s'%s", a, "");
            k--;
            seen[k] = true;
            if (set(s, x, x->meta, a)) return 2;
            continue;
        }
        seen[k] = true;
        if (x->kind == CLI_BOOL) {
            *(bool *)x->dst = true;
        } else if (x->kind == CLI_LIST) {
            const char **arr = x->dst;
            *x->count = 0;
            while (i + 1 < argc && !(argv[i + 1][0] == '-' && argv[i + 1][1])) {
                if (*x->count >= (int)x->max)
                    return fail(s, "%s takes at most its table's count of values (%s)", a, "see --help");
                arr[(*x->count)++] = argv[++i];
            }
            if (!*x->count) return fail(s, "%s needs a value%s", a, "");
        } else {
            if (i + 1 >= argc) return fail(s, "%s needs a value%s", a, "");
            if (set(s, x, a, argv[++i])) return 2;
        }
    }
    for (int k = 0; k < s->n; k++)
        if (s->flags[k].required && !seen[k])
            return fail(s, "%s is required%s", s->flags[k].flag ? s->flags[k].flag : s->flags[k].meta, "");
    return 0;
}
