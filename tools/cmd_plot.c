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

int cmd_plot(int argc, char **argv) {
    const char *in = NULL, *out = NULL;
    const cli_flag flags[] = {
        {NULL, CLI_STR, &in, .meta = "METRICS.jsonl", .help = "what keel train wrote", .required = true},
        {"-o", CLI_STR, &out, .meta = "FILE.svg", .help = "the plot (SVG)", .required = true},
    };
    const cli_spec spec = {"keel plot", "train and eval loss against tokens seen", flags,
                           (int)(sizeof flags / sizeof *flags)};
    int pr = cli_parse(&spec, argc, argv);
    if (pr) return pr == 1 ? 0 : 2;
    size_t len = strlen(out);
    if (len < 4 || strcmp(out + len - 4, ".svg")) {
        fprintf(stderr, "keel plot: -o %s: keel writes SVG (name the file .svg)\n", out);
        return 2;
    }
    FILE *f = fopen(in, "r");
    if (!f) {
        fprintf(stderr, "keel plot: cannot read %s\n", in);
        return 2;
    }
    pt *tr = NULL, *ev = NULL;
    int nt = 0, ne = 0, ct = 0, ce = 0, line_no = 0;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        line_no++;
        cJSON *j = cJSON_Parse(line);
        if (!j) {
            fprintf(stderr, "keel plot: %s:%d: not JSON\n", in, line_no);
            fclose(f);
            return 2;
        }
        const cJSON *tok = cJSON_GetObjectItemCaseSensitive(j, "tokens"),
                    *l = cJSON_GetObjectItemCaseSensitive(j, "loss"),
                    *e = cJSON_GetObjectItemCaseSensitive(j, "eval_loss");
        if (cJSON_IsNumber(tok) && cJSON_IsNumber(l)) {
            if (nt == ct) ct = ct ? 2 * ct : 256, tr = realloc(tr, (size_t)ct * sizeof *tr);
            tr[nt++] = (pt){tok->valuedouble, l->valuedouble};
        }
        if (cJSON_IsNumber(tok) && cJSON_IsNumber(e)) {
            if (ne == ce) ce = ce ? 2 * ce : 64, ev = realloc(ev, (size_t)ce * sizeof *ev);
            ev[ne++] = (pt){tok->valuedouble, e->valuedouble};
        }
        cJSON_Delete(j);
    }
    fclose(f);
    if (!nt && !ne) {
        fprintf(stderr, "keel plot: %s has no loss records\n", in);
        return 2;
    }
    double x0 = 0, x1 = 1, y0 = INFINITY, y1 = -INFINITY;
    for (int i = 0; i < nt; i++) x1 = fmax(x1, tr[i].x), y0 = fmin(y0, tr[i].y), y1 = fmax(y1, tr[i].y);
    for (int i = 0; i < ne; i++) x1 = fmax(x1, ev[i].x), y0 = fmin(y0, ev[i].y), y1 = fmax(y1, ev[i].y);
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
    fprintf(o, "<text x=\"%.0f\" y=\"18\" font-size=\"14\">%s</text>\n", L, in);
    for (int k = 0; k <= 5; k++) { /* grid and tick labels */
        double y = y0 + (y1 - y0) * k / 5, x = x0 + (x1 - x0) * k / 5;
        fprintf(o, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, PY(y), W - R, PY(y));
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.2f</text>\n", L - 6, PY(y) + 4, y);
        fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.3g</text>\n", PX(x), H - B + 18, x);
    }
    fprintf(o, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">tokens seen</text>\n", (L + W - R) / 2, H - 12);
    fprintf(o, "<text transform=\"translate(16 %.1f) rotate(-90)\" text-anchor=\"middle\">loss (nats)</text>\n",
            (T + H - B) / 2);
    if (nt) {
        fprintf(o, "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"");
        for (int i = 0; i < nt; i++) fprintf(o, "%.1f,%.1f ", PX(tr[i].x), PY(tr[i].y));
        fprintf(o, "\"/>\n");
    }
    if (ne) {
        fprintf(o, "<polyline fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\" points=\"");
        for (int i = 0; i < ne; i++) fprintf(o, "%.1f,%.1f ", PX(ev[i].x), PY(ev[i].y));
        fprintf(o, "\"/>\n");
        for (int i = 0; i < ne; i++)
            fprintf(o, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"#d62728\"/>\n", PX(ev[i].x), PY(ev[i].y));
    }
    fprintf(o,
            "<text x=\"%.0f\" y=\"%.0f\" fill=\"#1f77b4\">train loss</text><text x=\"%.0f\" y=\"%.0f\" "
            "fill=\"#d62728\">eval loss</text>\n",
            W - R - 160, T + 14, W - R - 80, T + 14);
    fprintf(o, "</svg>\n");
    int ok = fclose(o) == 0 && rename(tmp, out) == 0;
    free(tr), free(ev);
    if (!ok) {
        remove(tmp);
        fprintf(stderr, "keel plot: cannot write %s\n", out);
        return 2;
    }
    printf("wrote %s (%d train points, %d eval points)\n", out, nt, ne);
    return 0;
}
