/* keel plot: train and eval loss against tokens seen, from metrics.jsonl, as an SVG. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_flags.h"

typedef struct {
    double x, y;
} pt;

typedef struct {
    const char *path;
    pt *tr, *ev; /* train loss, eval loss against tokens */
    int nt, ne;
} series;

/* Room for more points (*cap doubled, or `first`): 0, or -1 with a message and *p unchanged */
static int grow(pt **p, int *cap, int first) {
    int c = *cap ? 2 * *cap : first;
    pt *q = realloc(*p, (size_t)c * sizeof *q);
    if (!q) {
        fprintf(stderr, "keel plot: out of memory for %d points\n", c);
        return -1;
    }
    *p = q, *cap = c;
    return 0;
}

/* One metrics.jsonl: its train and eval loss records. 0, or 2 with a message. */
static int read_series(series *s) {
    FILE *f = fopen(s->path, "r");
    if (!f) {
        fprintf(stderr, "keel plot: cannot read %s\n", s->path);
        return 2;
    }
    int ct = 0, ce = 0, line_no = 0;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        line_no++;
        cJSON *j = cJSON_Parse(line);
        if (!j) {
            fprintf(stderr, "keel plot: %s:%d: not JSON\n", s->path, line_no);
            fclose(f);
            return 2;
        }
        const cJSON *tok = cJSON_GetObjectItemCaseSensitive(j, "tokens"),
                    *l = cJSON_GetObjectItemCaseSensitive(j, "loss"),
                    *e = cJSON_GetObjectItemCaseSensitive(j, "eval_loss");
        if (cJSON_IsNumber(tok) && cJSON_IsNumber(l)) {
            if (s->nt == ct && grow(&s->tr, &ct, 256)) {
                cJSON_Delete(j);
                fclose(f);
                return 2;
            }
            s->tr[s->nt++] = (pt){tok->valuedouble, l->valuedouble};
        }
        if (cJSON_IsNumber(tok) && cJSON_IsNumber(e)) {
            if (s->ne == ce && grow(&s->ev, &ce, 64)) {
                cJSON_Delete(j);
                fclose(f);
                return 2;
            }
            s->ev[s->ne++] = (pt){tok->valuedouble, e->valuedouble};
        }
        cJSON_Delete(j);
    }
    fclose(f);
    if (!s->nt && !s->ne) {
        fprintf(stderr, "keel plot: %s has no loss records\n", s->path);
        return 2;
    }
    return 0;
}

int cmd_plot(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *more[7];
    int n_more = 0;
    const cli_flag flags[] = {
        {NULL, CLI_STR, &in, .meta = "METRICS.jsonl", .help = "what keel train wrote", .required = true},
        {"--compare", CLI_LIST, more, 0, 7, &n_more, "METRICS.jsonl...",
         "other runs on the same axes, a color each (their eval losses drawn bold, train losses faint)", false},
        {"-o", CLI_STR, &out, .meta = "FILE.svg", .help = "the plot (SVG)", .required = true},
    };
    const cli_spec spec = {"keel plot", "train and eval loss against tokens seen, of one run or several", flags,
                           (int)(sizeof flags / sizeof *flags)};
    int pr = cli_parse(&spec, argc, argv);
    if (pr) return pr == 1 ? 0 : 2;
    size_t len = strlen(out);
    if (len < 4 || strcmp(out + len - 4, ".svg")) {
        fprintf(stderr, "keel plot: -o %s: keel writes SVG (name the file .svg)\n", out);
        return 2;
    }
    series sv[8];
    int ns = 1 + n_more, rc = 0;
    memset(sv, 0, sizeof sv);
    sv[0].path = in;
    for (int i = 0; i < n_more; i++) sv[1 + i].path = more[i];
    for (int i = 0; i < ns && !rc; i++) rc = read_series(&sv[i]);
    if (rc) {
        for (int i = 0; i < ns; i++) free(sv[i].tr), free(sv[i].ev);
        return rc;
    }
    double x0 = 0, x1 = 1, y0 = INFINITY, y1 = -INFINITY;
    for (int k = 0; k < ns; k++) {
        for (int i = 0; i < sv[k].nt; i++)
            x1 = fmax(x1, sv[k].tr[i].x), y0 = fmin(y0, sv[k].tr[i].y), y1 = fmax(y1, sv[k].tr[i].y);
        for (int i = 0; i < sv[k].ne; i++)
            x1 = fmax(x1, sv[k].ev[i].x), y0 = fmin(y0, sv[k].ev[i].y), y1 = fmax(y1, sv[k].ev[i].y);
    }
    if (y1 - y0 < 1e-9) y1 = y0 + 1;
    const double W = 720, H = 420, L = 70, R = 20, T = 30, B = 50;
#define PX(x) (L + ((x)-x0) / (x1 - x0) * (W - L - R))
#define PY(y) (T + (y1 - (y)) / (y1 - y0) * (H - T - B))
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", out);
    FILE *o = fopen(tmp, "w");
    if (!o) {
        fprintf(stderr, "keel plot: cannot write %s\n", out);
        return 2;
    }
    fprintf(o,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
            "font-size=\"12\">\n",
            W, H);
    fprintf(o, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    if (ns == 1) fprintf(o, "<text x=\"%.0f\" y=\"18\" font-size=\"14\">%s</text>\n", L, in);
    for (int k = 0; k <= 5; k++) { /* grid and tick labels */
        double y = y0 + (y1 - y0) * k / 5, x = x0 + (x1 - x0) * k / 5;
        fprintf(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, PY(y), W - R, PY(y));
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.2f</text>\n", L - 6, PY(y) + 4, y);
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.3g</text>\n", PX(x), H - B + 18, x);
    }
    fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">tokens seen</text>\n", (L + W - R) / 2, H - 12);
    fprintf(o, "<text transform=\"translate(16 %.1f) rotate(-90)\" text-anchor=\"middle\">loss (nats)</text>\n",
            (T + H - B) / 2);
    /* one run: train blue, eval red; several: a color a run, train faint, eval bold */
    static const char *pal[8] = {"#d62728", "#1f77b4", "#2ca02c", "#9467bd",
                                 "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};
    for (int k = 0; k < ns; k++) {
        const series *v = &sv[k];
        const char *ce = pal[k], *ct = ns == 1 ? "#1f77b4" : pal[k];
        if (v->nt) {
            fprintf(o, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\"%s points=\"", ct,
                    ns == 1 ? "" : " stroke-opacity=\"0.35\"");
            for (int i = 0; i < v->nt; i++) fprintf(o, "%.1f,%.1f ", PX(v->tr[i].x), PY(v->tr[i].y));
            fprintf(o, "\"/>\n");
        }
        if (v->ne) {
            fprintf(o, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", ce);
            for (int i = 0; i < v->ne; i++) fprintf(o, "%.1f,%.1f ", PX(v->ev[i].x), PY(v->ev[i].y));
            fprintf(o, "\"/>\n");
            for (int i = 0; i < v->ne; i++)
                fprintf(o, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", PX(v->ev[i].x), PY(v->ev[i].y),
                        ce);
        }
        if (ns > 1)
            fprintf(o,
                    "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\" fill=\"%s\">%s (eval bold, train faint)</text>\n",
                    W - R, T + 14 + 16 * k, ce, v->path);
    }
    if (ns == 1)
        fprintf(o,
                "<text x=\"%.0f\" y=\"%.0f\" fill=\"#1f77b4\">train loss</text><text x=\"%.0f\" y=\"%.0f\" "
                "fill=\"#d62728\">eval loss</text>\n",
                W - R - 160, T + 14, W - R - 80, T + 14);
    fprintf(o, "</svg>\n");
    int ok = fclose(o) == 0 && rename(tmp, out) == 0;
    int nt = 0, ne = 0;
    for (int k = 0; k < ns; k++) nt += sv[k].nt, ne += sv[k].ne, free(sv[k].tr), free(sv[k].ev);
    if (!ok) {
        remove(tmp);
        fprintf(stderr, "keel plot: cannot write %s\n", out);
        return 2;
    }
    printf("wrote %s (%d run%s, %d train points, %d eval points)\n", out, ns, ns > 1 ? "s" : "", nt, ne);
    return 0;
}
