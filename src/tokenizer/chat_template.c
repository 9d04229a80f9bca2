/* The Jinja subset of chat templates (chat_template.h): a lexer that applies Jinja's whitespace
 * rules (trim_blocks, lstrip_blocks, the - markers) to the text between tags, a recursive-descent
 * parser into a tree, and a tree-walking renderer over dynamically typed values. Everything a
 * render allocates lives in one arena freed at its end. */
#include "tokenizer/chat_template.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/file.h"

/* ---- arenas ---- */

typedef struct block {
    struct block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} block;

typedef struct {
    block *head;
    bool failed;
} arena;

static void *amalloc(arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!a->head || a->head->used + n > a->head->cap) {
        size_t cap = n > 65536 ? n : 65536;
        block *b = malloc(sizeof *b + cap);
        if (!b) {
            a->failed = true;
            return NULL;
        }
        b->next = a->head, b->used = 0, b->cap = cap;
        a->head = b;
    }
    void *p = a->head->data + a->head->used;
    a->head->used += n;
    memset(p, 0, n);
    return p;
}

static void arena_free(arena *a) {
    for (block *b = a->head, *n; b; b = n) n = b->next, free(b);
    a->head = NULL;
}

static char *astrndup(arena *a, const char *s, size_t n) {
    char *d = amalloc(a, n + 1);
    if (d) memcpy(d, s, n), d[n] = 0;
    return d;
}

/* ---- values ---- */

typedef enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS } vkind;

typedef struct value value;
struct value {
    vkind k;
    bool b;
    int64_t i;
    double f;
    const char *s; /* V_STR: bytes (not terminated) */
    size_t n;      /* V_STR: length; V_LIST, V_DICT, V_NS: count */
    value **items; /* V_LIST; V_DICT and V_NS: the values */
    const char **keys;
    size_t cap;
};

/* ---- the tree ---- */

typedef enum {
    N_TEXT,
    N_OUT,
    N_IF,
    N_FOR,
    N_SET,
    E_LIT,
    E_VAR,
    E_ATTR,
    E_INDEX,
    E_SLICE,
    E_CALL,
    E_FILTER,
    E_TEST,
    E_BIN,
    E_NOT,
    E_NEG,
    E_AND,
    E_OR,
    E_COND,
    E_LIST,
    E_DICT,
} nkind;

typedef struct node node;
struct node {
    nkind k;
    int line;
    const char *s; /* text, name, attribute, operator, filter or test name */
    size_t n;
    value *lit;
    node *a, *b, *c; /* children: if (cond, then, else), for (iterable, body, else), binary ops, ... */
    node *filt;      /* for ... if filt */
    node **args;     /* call/filter/test arguments, list items, dict keys and values */
    const char **arg_names;
    int n_args;
    const char *var, *var2; /* for: the loop variable(s); set: the name, and var2 the attribute */
    bool negate;            /* is not, not in */
    node *next;             /* the next statement of a body */
};

struct keel_chat_template {
    arena ar;
    node *body;
    const char *source;
    char label[256];
};

/* ---- parsing ---- */

typedef struct {
    arena *ar;
    const char *label;
    const char *p, *end; /* the current tag's content */
    int line;
    int depth; /* of expressions and statements being parsed: bounded, so a hostile template cannot
                * exhaust the stack */
    char err[512];
} parser;

static int perr(parser *ps, const char *fmt, ...) {
    if (ps->err[0]) return -1;
    va_list ap;
    va_start(ap, fmt);
    char msg[400];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(ps->err, sizeof ps->err, "%s:%d: %s", ps->label, ps->line, msg);
    return -1;
}

static node *mk(parser *ps, nkind k) {
    node *n = amalloc(ps->ar, sizeof *n);
    if (n) n->k = k, n->line = ps->line;
    return n;
}

static void skip_ws(parser *ps) {
    while (ps->p < ps->end && isspace((unsigned char)*ps->p)) {
        if (*ps->p == '\n') ps->line++;
        ps->p++;
    }
}

static bool at(parser *ps, const char *tok) {
    skip_ws(ps);
    size_t n = strlen(tok);
    return (size_t)(ps->end - ps->p) >= n && memcmp(ps->p, tok, n) == 0;
}

static bool eat(parser *ps, const char *tok) {
    if (!at(ps, tok)) return false;
    ps->p += strlen(tok);
    return true;
}

static bool is_ident_start(char c) { return isalpha((unsigned char)c) || c == '_'; }
static bool is_ident(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* the identifier at the cursor (not consumed), or 0 length */
static size_t peek_ident(parser *ps, const char **s) {
    skip_ws(ps);
    *s = ps->p;
    if (ps->p >= ps->end || !is_ident_start(*ps->p)) return 0;
    const char *q = ps->p;
    while (q < ps->end && is_ident(*q)) q++;
    return (size_t)(q - ps->p);
}

static bool eat_kw(parser *ps, const char *kw) {
    const char *s;
    size_t n = peek_ident(ps, &s);
    if (n != strlen(kw) || memcmp(s, kw, n)) return false;
    ps->p += n;
    return true;
}

static const char *take_ident(parser *ps) {
    const char *s;
    size_t n = peek_ident(ps, &s);
    if (!n) {
        perr(ps, "expected a name at '%.20s'", ps->p);
        return NULL;
    }
    ps->p += n;
    return astrndup(ps->ar, s, n);
}

static node *expr(parser *ps);

static value *lit_value(parser *ps, vkind k) {
    value *v = amalloc(ps->ar, sizeof *v);
    if (v) v->k = k;
    return v;
}

static node *string_lit(parser *ps) {
    char q = *ps->p++;
    char *buf = amalloc(ps->ar, (size_t)(ps->end - ps->p) + 1);
    if (!buf) return NULL;
    size_t n = 0;
    while (ps->p < ps->end && *ps->p != q) {
        char c = *ps->p++;
        if (c == '\\' && ps->p < ps->end) {
            char e = *ps->p++;
            c = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e == '0' ? '\0' : e;
            if (e != 'n' && e != 't' && e != 'r' && e != '0' && e != '\\' && e != '\'' && e != '"')
                buf[n++] = '\\'; /* Python keeps unknown escapes as written */
        }
        if (c == '\n') ps->line++;
        buf[n++] = c;
    }
    if (ps->p >= ps->end) return perr(ps, "unterminated string"), NULL;
    ps->p++;
    node *e = mk(ps, E_LIT);
    value *v = lit_value(ps, V_STR);
    if (!e || !v) return NULL;
    v->s = buf, v->n = n, e->lit = v;
    return e;
}

/* (args) after a callee or filter: positional and name=value arguments */
static int call_args(parser *ps, node *n) {
    node *args[32];
    const char *names[32];
    int k = 0;
    if (!eat(ps, ")")) {
        do {
            if (k == 32) return perr(ps, "more than 32 arguments");
            names[k] = NULL;
            const char *s;
            size_t len = peek_ident(ps, &s);
            const char *q = s + len;
            while (q < ps->end && (*q == ' ' || *q == '\t')) q++;
            if (len && q < ps->end && *q == '=' && (q + 1 >= ps->end || q[1] != '=')) {
                names[k] = astrndup(ps->ar, s, len);
                ps->p = q + 1;
            }
            if (!(args[k++] = expr(ps))) return -1;
        } while (eat(ps, ","));
        if (!eat(ps, ")")) return perr(ps, "expected ')' at '%.20s'", ps->p);
    }
    n->args = amalloc(ps->ar, (size_t)(k ? k : 1) * sizeof *n->args);
    n->arg_names = amalloc(ps->ar, (size_t)(k ? k : 1) * sizeof *n->arg_names);
    if (!n->args || !n->arg_names) return -1;
    memcpy(n->args, args, (size_t)k * sizeof *args), memcpy(n->arg_names, names, (size_t)k * sizeof *names);
    n->n_args = k;
    return 0;
}

static node *primary(parser *ps) {
    skip_ws(ps);
    if (ps->p >= ps->end) return perr(ps, "unexpected end of the tag"), NULL;
    char c = *ps->p;
    if (c == '\'' || c == '"') return string_lit(ps);
    if (isdigit((unsigned char)c)) {
        char *endp;
        const char *q = ps->p;
        while (q < ps->end && (isdigit((unsigned char)*q) || *q == '_')) q++;
        bool flt = q < ps->end && *q == '.' && q + 1 < ps->end && isdigit((unsigned char)q[1]);
        node *e = mk(ps, E_LIT);
        value *v = lit_value(ps, flt ? V_FLOAT : V_INT);
        if (!e || !v) return NULL;
        if (flt) {
            v->f = strtod(ps->p, &endp);
        } else {
            errno = 0;
            v->i = strtoll(ps->p, &endp, 10);
            if (errno == ERANGE) return perr(ps, "integer literal outside 64 bits"), NULL;
        }
        ps->p = endp, e->lit = v;
        return e;
    }
    if (eat(ps, "(")) {
        node *e = expr(ps);
        if (e && !eat(ps, ")")) return perr(ps, "expected ')' (tuples are not supported)"), NULL;
        return e;
    }
    if (eat(ps, "[")) {
        node *e = mk(ps, E_LIST);
        node *items[256];
        int k = 0;
        if (!e) return NULL;
        if (!eat(ps, "]")) {
            do {
                if (at(ps, "]")) break;
                if (k == 256) return perr(ps, "a list literal of more than 256 items"), NULL;
                if (!(items[k++] = expr(ps))) return NULL;
            } while (eat(ps, ","));
            if (!eat(ps, "]")) return perr(ps, "expected ']'"), NULL;
        }
        e->args = amalloc(ps->ar, (size_t)(k ? k : 1) * sizeof *e->args);
        if (!e->args) return NULL;
        memcpy(e->args, items, (size_t)k * sizeof *items), e->n_args = k;
        return e;
    }
    if (eat(ps, "{")) {
        node *e = mk(ps, E_DICT);
        node *items[256];
        int k = 0;
        if (!e) return NULL;
        if (!eat(ps, "}")) {
            do {
                if (at(ps, "}")) break;
                if (k >= 254) return perr(ps, "a dict literal of more than 127 items"), NULL;
                if (!(items[k++] = expr(ps))) return NULL;
                if (!eat(ps, ":")) return perr(ps, "expected ':' in a dict literal"), NULL;
                if (!(items[k++] = expr(ps))) return NULL;
            } while (eat(ps, ","));
            if (!eat(ps, "}")) return perr(ps, "expected '}'"), NULL;
        }
        e->args = amalloc(ps->ar, (size_t)(k ? k : 1) * sizeof *e->args);
        if (!e->args) return NULL;
        memcpy(e->args, items, (size_t)k * sizeof *items), e->n_args = k;
        return e;
    }
    const char *s;
    size_t n = peek_ident(ps, &s);
    if (!n) return perr(ps, "unexpected '%.20s'", ps->p), NULL;
    ps->p += n;
    node *e = mk(ps, E_LIT);
    if (!e) return NULL;
#define KW(w) (n == strlen(w) && !memcmp(s, w, n))
    if (KW("true") || KW("True") || KW("false") || KW("False")) {
        if (!(e->lit = lit_value(ps, V_BOOL))) return NULL;
        e->lit->b = s[0] == 't' || s[0] == 'T';
        return e;
    }
    if (KW("none") || KW("None")) return (e->lit = lit_value(ps, V_NONE)) ? e : NULL;
#undef KW
    e->k = E_VAR, e->s = astrndup(ps->ar, s, n), e->n = n;
    return e;
}

/* fn(ps) one level deeper: the parser's recursions all pass here, so a hostile template's nesting
 * ends in a message, not in a stack overflow */
static node *nested(parser *ps, node *(*fn)(parser *)) {
    if (++ps->depth > 100) return perr(ps, "expressions nested more than 100 deep"), NULL;
    node *e = fn(ps);
    ps->depth--;
    return e;
}

static node *unary(parser *ps);

static node *postfix(parser *ps) {
    node *e = primary(ps);
    while (e) {
        if (eat(ps, ".")) {
            node *a = mk(ps, E_ATTR);
            if (!a || !(a->s = take_ident(ps))) return NULL;
            a->a = e, e = a;
        } else if (at(ps, "[")) {
            ps->p++;
            node *parts[3] = {NULL, NULL, NULL};
            int k = 0;
            bool slice = false;
            while (k < 3) {
                if (!at(ps, ":") && !at(ps, "]") && !(parts[k] = expr(ps))) return NULL;
                if (eat(ps, ":")) {
                    slice = true, k++;
                    continue;
                }
                break;
            }
            if (!eat(ps, "]")) return perr(ps, "expected ']'"), NULL;
            node *x = mk(ps, slice ? E_SLICE : E_INDEX);
            if (!x) return NULL;
            x->a = e, x->args = amalloc(ps->ar, 3 * sizeof *x->args);
            if (!x->args) return NULL;
            memcpy(x->args, parts, sizeof parts), x->n_args = 3;
            if (!slice && !parts[0]) return perr(ps, "an empty subscript"), NULL;
            e = x;
        } else if (at(ps, "(")) {
            ps->p++;
            node *c = mk(ps, E_CALL);
            if (!c) return NULL;
            c->a = e;
            if (call_args(ps, c)) return NULL;
            e = c;
        } else if (at(ps, "|") && !at(ps, "||")) {
            ps->p++;
            node *f = mk(ps, E_FILTER);
            if (!f || !(f->s = take_ident(ps))) return NULL;
            f->a = e;
            if (at(ps, "(")) {
                ps->p++;
                if (call_args(ps, f)) return NULL;
            }
            e = f;
        } else {
            break;
        }
    }
    return e;
}

static node *unary(parser *ps) {
    if (eat(ps, "-")) {
        node *n = mk(ps, E_NEG);
        if (n && !(n->a = nested(ps, unary))) return NULL;
        return n;
    }
    if (eat(ps, "+")) return nested(ps, unary);
    return postfix(ps);
}

static node *binary(parser *ps, nkind k, const char *op, node *a, node *b) {
    node *n = a && b ? mk(ps, k) : NULL;
    if (n) n->s = op, n->a = a, n->b = b;
    return n;
}

static node *mul(parser *ps) {
    node *e = unary(ps);
    for (;;) {
        const char *op = at(ps, "**")   ? NULL
                         : at(ps, "//") ? "//"
                         : at(ps, "*")  ? "*"
                         : at(ps, "/")  ? "/"
                         : at(ps, "%")  ? "%"
                                        : NULL;
        if (at(ps, "**")) return perr(ps, "'**' is not supported"), NULL;
        if (!op || !e) return e;
        ps->p += strlen(op);
        e = binary(ps, E_BIN, op, e, unary(ps));
    }
}

static node *add(parser *ps) {
    node *e = mul(ps);
    for (;;) {
        const char *op = at(ps, "+") ? "+" : at(ps, "-") ? "-" : at(ps, "~") ? "~" : NULL;
        if (!op || !e) return e;
        ps->p++;
        e = binary(ps, E_BIN, op, e, mul(ps));
    }
}

static node *compare(parser *ps) {
    node *e = add(ps);
    for (;;) {
        if (!e) return NULL;
        const char *op = at(ps, "==")   ? "=="
                         : at(ps, "!=") ? "!="
                         : at(ps, "<=") ? "<="
                         : at(ps, ">=") ? ">="
                         : at(ps, "<")  ? "<"
                         : at(ps, ">")  ? ">"
                                        : NULL;
        if (op) {
            ps->p += strlen(op);
            e = binary(ps, E_BIN, op, e, add(ps));
            continue;
        }
        const char *save = ps->p;
        int line = ps->line;
        bool neg = eat_kw(ps, "not");
        if (eat_kw(ps, "in")) {
            e = binary(ps, E_BIN, "in", e, add(ps));
            if (e) e->negate = neg;
            continue;
        }
        ps->p = save, ps->line = line;
        if (eat_kw(ps, "is")) {
            node *t = mk(ps, E_TEST);
            if (!t) return NULL;
            t->negate = eat_kw(ps, "not");
            const char *s;
            size_t n = peek_ident(ps, &s);
            if (!n) return perr(ps, "expected a test name after 'is'"), NULL;
            ps->p += n, t->s = astrndup(ps->ar, s, n), t->a = e;
            if (at(ps, "(")) {
                ps->p++;
                if (call_args(ps, t)) return NULL;
            } else if (!strcmp(t->s, "sameas") || !strcmp(t->s, "eq") || !strcmp(t->s, "equalto") ||
                       !strcmp(t->s, "divisibleby")) { /* one argument without parentheses */
                t->args = amalloc(ps->ar, sizeof *t->args);
                if (!t->args || !(t->args[0] = add(ps))) return NULL;
                t->n_args = 1;
            }
            e = t;
            continue;
        }
        return e;
    }
}

static node *not_expr(parser *ps) {
    if (eat_kw(ps, "not")) {
        node *n = mk(ps, E_NOT);
        if (n && !(n->a = nested(ps, not_expr))) return NULL;
        return n;
    }
    return compare(ps);
}

static node *and_expr(parser *ps) {
    node *e = not_expr(ps);
    while (e && eat_kw(ps, "and")) e = binary(ps, E_AND, "and", e, not_expr(ps));
    return e;
}

static node *or_expr(parser *ps) {
    node *e = and_expr(ps);
    while (e && eat_kw(ps, "or")) e = binary(ps, E_OR, "or", e, and_expr(ps));
    return e;
}

static node *expr_inner(parser *ps);

static node *expr(parser *ps) { return nested(ps, expr_inner); }

static node *expr_inner(parser *ps) {
    node *e = or_expr(ps);
    if (e && eat_kw(ps, "if")) {
        node *c = mk(ps, E_COND);
        if (!c) return NULL;
        c->a = e; /* value when true */
        if (!(c->b = or_expr(ps))) return NULL;
        if (eat_kw(ps, "else") && !(c->c = expr(ps))) return NULL;
        e = c;
    }
    return e;
}

/* ---- the template's tags ---- */

typedef struct {
    const char *src, *p, *end;
    int line;
} lexer;

typedef enum { T_TEXT, T_EXPR, T_STMT, T_COMMENT, T_END } ttype;

typedef struct {
    ttype t;
    const char *s, *e; /* content (without delimiters and - markers) */
    int line;
} tag;

/* the next piece: text up to the next tag (whitespace rules applied by the caller), or a tag */
static int next_piece(lexer *lx, tag *out, parser *ps) {
    if (lx->p >= lx->end) {
        out->t = T_END;
        return 0;
    }
    const char *q = lx->p;
    while (q < lx->end) {
        if (q[0] == '{' && q + 1 < lx->end && (q[1] == '{' || q[1] == '%' || q[1] == '#')) break;
        q++;
    }
    if (q > lx->p) {
        out->t = T_TEXT, out->s = lx->p, out->e = q, out->line = lx->line;
        for (const char *c = lx->p; c < q; c++) lx->line += *c == '\n';
        lx->p = q;
        return 0;
    }
    char kind = q[1];
    const char *close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    const char *body = q + 2, *e = body;
    while (e + 1 < lx->end && !(e[0] == close[0] && e[1] == close[1])) {
        if (kind != '#' && (*e == '\'' || *e == '"')) { /* a tag's string may hold the closing marks */
            char qc = *e++;
            while (e < lx->end && *e != qc) e += *e == '\\' && e + 1 < lx->end ? 2 : 1;
            if (e >= lx->end) break;
        }
        e++;
    }
    if (e + 1 >= lx->end) {
        ps->line = lx->line;
        return perr(ps, "unclosed '%c%c'", '{', kind);
    }
    out->line = lx->line;
    for (const char *c = q; c < e + 2; c++) lx->line += *c == '\n';
    out->t = kind == '{' ? T_EXPR : kind == '%' ? T_STMT : T_COMMENT; /* a comment acts on whitespace as a block */
    out->s = body, out->e = e;
    lx->p = e + 2;
    return 0;
}

typedef struct {
    node *head, *tail;
} list;

static void append(list *l, node *n) {
    if (!n) return;
    if (l->tail)
        l->tail->next = n;
    else
        l->head = n;
    l->tail = n;
}

/* A template is first a list of pieces (text with the whitespace rules applied, {{ }} and {% %}
 * contents), then the statements nest over it. */
typedef struct {
    nkind k;           /* N_TEXT, N_OUT, or N_SET standing for any statement */
    const char *s, *e; /* the text, or the tag's content */
    int line;
} piece;

typedef struct {
    piece *v;
    int n, cap;
    int at;
} pieces;

static int lex_all(const char *src, parser *ps, pieces *out) {
    lexer lx = {src, src, src + strlen(src), 1};
    typedef struct {
        ttype t;
        const char *s, *e; /* text, or a tag's content without its - / + markers */
        int line;
        bool lminus, rminus, lplus;
    } raw;
    raw *r = NULL;
    int nr = 0, cr = 0, rc = 0;
    for (;;) {
        tag t = {T_END, NULL, NULL, 0};
        if (next_piece(&lx, &t, ps)) {
            rc = -1;
            break;
        }
        if (nr == cr) {
            cr = cr ? 2 * cr : 256;
            raw *nv = realloc(r, (size_t)cr * sizeof *nv);
            if (!nv) {
                rc = perr(ps, "out of memory");
                break;
            }
            r = nv;
        }
        raw *x = &r[nr++];
        memset(x, 0, sizeof *x);
        x->t = t.t, x->s = t.s, x->e = t.e, x->line = t.line;
        if (t.t == T_END) break;
        if (t.t != T_TEXT) {
            if (x->s < x->e && (*x->s == '-' || *x->s == '+'))
                x->lminus = *x->s == '-', x->lplus = *x->s == '+', x->s++;
            if (x->e > x->s && x->e[-1] == '-') x->rminus = true, x->e--;
        }
    }
    /* Jinja's whitespace rules as transformers sets them: a - strips all whitespace on its side;
     * lstrip_blocks strips the spaces and tabs from the start of a line to a block tag (or a
     * comment); trim_blocks removes the newline right after one */
    for (int i = 0; i < nr && !rc; i++) {
        if (r[i].t != T_TEXT) continue;
        const char *os = r[i].s, *oe = r[i].e, *s = os, *e = oe;
        bool prev_block = i > 0 && (r[i - 1].t == T_STMT || r[i - 1].t == T_COMMENT);
        if (i > 0 && r[i - 1].rminus) {
            while (s < e && isspace((unsigned char)*s)) s++;
        } else if (prev_block) {
            if (s < e && *s == '\n')
                s++;
            else if (s + 1 < e && s[0] == '\r' && s[1] == '\n')
                s += 2;
        }
        if (i + 1 < nr && r[i + 1].lminus) {
            while (e > s && isspace((unsigned char)e[-1])) e--;
        } else if (i + 1 < nr && (r[i + 1].t == T_STMT || r[i + 1].t == T_COMMENT) && !r[i + 1].lplus) {
            const char *q = oe;
            while (q > os && (q[-1] == ' ' || q[-1] == '\t')) q--;
            if ((q > os && q[-1] == '\n') || (q == os && i == 0)) e = q < e ? q : e;
        }
        r[i].s = s, r[i].e = e > s ? e : s;
    }
    for (int i = 0; i < nr && !rc; i++) {
        if (r[i].t == T_END) break;
        if ((r[i].t == T_TEXT && r[i].s == r[i].e) || r[i].t == T_COMMENT) continue;
        if (out->n == out->cap) {
            out->cap = out->cap ? 2 * out->cap : 256;
            piece *nv = realloc(out->v, (size_t)out->cap * sizeof *nv);
            if (!nv) {
                rc = perr(ps, "out of memory");
                break;
            }
            out->v = nv;
        }
        piece *pc = &out->v[out->n++];
        memset(pc, 0, sizeof *pc);
        pc->s = r[i].s, pc->e = r[i].e, pc->line = r[i].line;
        pc->k = r[i].t == T_TEXT ? N_TEXT : r[i].t == T_EXPR ? N_OUT : N_SET;
    }
    free(r);
    return rc;
}

static int parse_list(parser *ps, pieces *pcs, list *out, const char *const *stops, const char **stopped);
static int parse_list_in(parser *ps, pieces *pcs, list *out, const char *const *stops, const char **stopped);

/* the keyword a statement piece starts with */
static size_t stmt_kw(parser *ps, const piece *pc, const char **kw) {
    ps->p = pc->s, ps->end = pc->e, ps->line = pc->line;
    return peek_ident(ps, kw);
}

static int parse_list(parser *ps, pieces *pcs, list *out, const char *const *stops, const char **stopped) {
    *stopped = NULL;
    if (ps->depth > 100) return perr(ps, "statements nested more than 100 deep");
    ps->depth++;
    int rc = parse_list_in(ps, pcs, out, stops, stopped);
    ps->depth--;
    return rc;
}

static int parse_list_in(parser *ps, pieces *pcs, list *out, const char *const *stops, const char **stopped) {
    while (pcs->at < pcs->n) {
        piece *pc = &pcs->v[pcs->at++];
        ps->line = pc->line;
        if (pc->k == N_TEXT) {
            node *n = mk(ps, N_TEXT);
            if (!n) return -1;
            n->s = pc->s, n->n = (size_t)(pc->e - pc->s);
            append(out, n);
            continue;
        }
        ps->p = pc->s, ps->end = pc->e;
        if (pc->k == N_OUT) {
            node *n = mk(ps, N_OUT);
            if (!n || !(n->a = expr(ps))) return -1;
            skip_ws(ps);
            if (ps->p < ps->end) return perr(ps, "unexpected '%.*s' in {{ }}", (int)(ps->end - ps->p), ps->p);
            append(out, n);
            continue;
        }
        const char *kw;
        size_t kn = stmt_kw(ps, pc, &kw);
        if (!kn) return perr(ps, "a statement without a keyword");
        for (int i = 0; stops && stops[i]; i++)
            if (kn == strlen(stops[i]) && !memcmp(kw, stops[i], kn)) {
                *stopped = stops[i];
                ps->p += kn;
                return 0;
            }
        ps->p += kn;
#define IS(w) (kn == strlen(w) && !memcmp(kw, w, kn))
        if (IS("if")) {
            node *n = mk(ps, N_IF), *cur = n;
            if (!n || !(n->a = expr(ps))) return -1;
            for (;;) {
                static const char *const st[] = {"elif", "else", "endif", NULL};
                list body = {0};
                const char *why;
                if (parse_list(ps, pcs, &body, st, &why)) return -1;
                if (!why) return perr(ps, "'if' without 'endif'");
                cur->b = body.head;
                if (!strcmp(why, "endif")) break;
                if (!strcmp(why, "else")) {
                    static const char *const st2[] = {"endif", NULL};
                    list eb = {0};
                    if (parse_list(ps, pcs, &eb, st2, &why)) return -1;
                    if (!why) return perr(ps, "'if' without 'endif'");
                    cur->c = eb.head;
                    break;
                }
                node *el = mk(ps, N_IF); /* elif: an if in the else branch */
                if (!el || !(el->a = expr(ps))) return -1;
                cur->c = el, cur = el;
            }
            append(out, n);
        } else if (IS("for")) {
            node *n = mk(ps, N_FOR);
            if (!n || !(n->var = take_ident(ps))) return -1;
            if (eat(ps, ",") && !(n->var2 = take_ident(ps))) return -1;
            if (!eat_kw(ps, "in")) return perr(ps, "expected 'in' in a for loop");
            if (!(n->a = or_expr(ps))) return -1; /* not expr(): its 'if' is the loop's filter */
            if (eat_kw(ps, "if") && !(n->filt = or_expr(ps))) return -1;
            if (eat_kw(ps, "recursive")) return perr(ps, "recursive loops are not supported");
            static const char *const st[] = {"else", "endfor", NULL};
            list body = {0};
            const char *why;
            if (parse_list(ps, pcs, &body, st, &why)) return -1;
            if (!why) return perr(ps, "'for' without 'endfor'");
            n->b = body.head;
            if (!strcmp(why, "else")) {
                static const char *const st2[] = {"endfor", NULL};
                list eb = {0};
                if (parse_list(ps, pcs, &eb, st2, &why)) return -1;
                if (!why) return perr(ps, "'for' without 'endfor'");
                n->c = eb.head;
            }
            append(out, n);
        } else if (IS("set")) {
            node *n = mk(ps, N_SET);
            if (!n || !(n->var = take_ident(ps))) return -1;
            if (eat(ps, ".") && !(n->var2 = take_ident(ps))) return -1;
            if (at(ps, ",")) return perr(ps, "'set' of several names is not supported");
            if (!eat(ps, "=")) return perr(ps, "block 'set' (without '=') is not supported");
            if (!(n->a = expr(ps))) return -1;
            append(out, n);
        } else {
            return perr(ps, "'%.*s' statements are not supported", (int)kn, kw);
        }
#undef IS
        skip_ws(ps);
        if (!ps->err[0] && ps->p < ps->end)
            return perr(ps, "unexpected '%.*s' in {%% %%}", (int)(ps->end - ps->p), ps->p);
    }
    return 0;
}

keel_chat_template *keel_chat_template_compile(const char *source, const char *label) {
    keel_chat_template *t = calloc(1, sizeof *t);
    if (!t) {
        keel_fail("out of memory");
        return NULL;
    }
    snprintf(t->label, sizeof t->label, "%s", label ? label : "chat template");
    parser ps = {.ar = &t->ar, .label = t->label, .line = 1};
    pieces pcs = {0};
    list body = {0};
    const char *why = NULL;
    /* the tree points into the template's own copy of the source (its text pieces) */
    int rc = (t->source = astrndup(&t->ar, source, strlen(source))) ? lex_all(t->source, &ps, &pcs)
                                                                    : perr(&ps, "out of memory");
    if (!rc) rc = parse_list(&ps, &pcs, &body, NULL, &why);
    if (!rc && why) rc = perr(&ps, "'%s' without its opening statement", why);
    free(pcs.v);
    if (!rc && t->ar.failed) rc = perr(&ps, "out of memory");
    if (rc) {
        keel_fail("%s", ps.err[0] ? ps.err : "cannot compile the chat template");
        keel_chat_template_free(t);
        return NULL;
    }
    t->body = body.head;
    return t;
}

const char *keel_chat_template_source(const keel_chat_template *t) { return t->source; }

const char *keel_chat_template_keep(keel_chat_template *t, const char *s) { return astrndup(&t->ar, s, strlen(s)); }

void keel_chat_template_free(keel_chat_template *t) {
    if (!t) return;
    arena_free(&t->ar);
    free(t);
}

keel_chat_template *keel_chat_template_from_config(const char *path) {
    cJSON *j = keel_read_json(path);
    if (!j) return NULL;
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(j, "chat_template");
    const char *src = cJSON_GetStringValue(ct);
    if (cJSON_IsArray(ct)) { /* [{name, template}]: the one named default */
        const cJSON *it;
        cJSON_ArrayForEach(it, ct) {
            const char *nm = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "name"));
            if (nm && !strcmp(nm, "default"))
                src = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(it, "template"));
        }
    }
    keel_chat_template *t = NULL;
    if (!src)
        keel_fail("%s: no \"chat_template\" string (give one with --chat-template FILE)", path);
    else
        t = keel_chat_template_compile(src, path);
    cJSON_Delete(j);
    return t;
}

/* ---- rendering ---- */

typedef struct frame {
    struct frame *up;
    const char **names;
    value **vals;
    int n, cap;
} frame;

typedef struct {
    arena *ar;
    const char *label;
    char *out;
    size_t n, cap;
    char err[512];
    int depth;
    int64_t steps; /* loop iterations so far: bounded, so a hostile template cannot hang a render */
} renderer;

static int rerr(renderer *r, const node *at, const char *fmt, ...) {
    if (r->err[0]) return -1;
    va_list ap;
    va_start(ap, fmt);
    char msg[400];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(r->err, sizeof r->err, "%s:%d: %s", r->label, at ? at->line : 0, msg);
    return -1;
}

static int emit(renderer *r, const char *s, size_t n) {
    if (r->n + n + 1 > r->cap) {
        size_t c = r->cap ? r->cap : 4096;
        while (c < r->n + n + 1) c *= 2;
        char *nb = realloc(r->out, c);
        if (!nb) return rerr(r, NULL, "out of memory");
        r->out = nb, r->cap = c;
    }
    memcpy(r->out + r->n, s, n);
    r->n += n;
    return 0;
}

static value *val(renderer *r, vkind k) {
    value *v = amalloc(r->ar, sizeof *v);
    if (v) v->k = k;
    return v;
}

static value *vstr(renderer *r, const char *s, size_t n) {
    value *v = val(r, V_STR);
    if (v) v->s = s, v->n = n;
    return v;
}

static value *vint(renderer *r, int64_t i) {
    value *v = val(r, V_INT);
    if (v) v->i = i;
    return v;
}

static value *vbool(renderer *r, bool b) {
    value *v = val(r, V_BOOL);
    if (v) v->b = b;
    return v;
}

static int list_push(renderer *r, value *l, value *x) {
    if (l->n == l->cap) {
        size_t c = l->cap ? 2 * l->cap : 8;
        value **ni = amalloc(r->ar, c * sizeof *ni);
        const char **nk = l->k != V_LIST ? amalloc(r->ar, c * sizeof *nk) : NULL;
        if (!ni || (l->k != V_LIST && !nk)) return rerr(r, NULL, "out of memory");
        if (l->n) memcpy(ni, l->items, l->n * sizeof *ni);
        if (nk && l->n) memcpy(nk, l->keys, l->n * sizeof *nk);
        l->items = ni, l->cap = c;
        if (nk) l->keys = nk;
    }
    l->items[l->n++] = x;
    return 0;
}

static value *dict_get(const value *d, const char *key, size_t kn) {
    for (size_t i = 0; i < d->n; i++)
        if (strlen(d->keys[i]) == kn && !memcmp(d->keys[i], key, kn)) return d->items[i];
    return NULL;
}

static int dict_set(renderer *r, value *d, const char *key, value *x) {
    for (size_t i = 0; i < d->n; i++)
        if (!strcmp(d->keys[i], key)) {
            d->items[i] = x;
            return 0;
        }
    if (list_push(r, d, x)) return -1;
    d->keys[d->n - 1] = key;
    return 0;
}

static value *from_json(renderer *r, const cJSON *j) {
    if (!j || cJSON_IsNull(j)) return val(r, V_NONE);
    if (cJSON_IsBool(j)) return vbool(r, cJSON_IsTrue(j));
    if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) < 9e15) return vint(r, (int64_t)d);
        value *v = val(r, V_FLOAT);
        if (v) v->f = d;
        return v;
    }
    if (cJSON_IsString(j)) return vstr(r, j->valuestring, strlen(j->valuestring));
    value *v = val(r, cJSON_IsArray(j) ? V_LIST : V_DICT);
    const cJSON *it;
    cJSON_ArrayForEach(it, j) {
        value *x = from_json(r, it);
        if (!v || !x) return NULL;
        if (v->k == V_LIST ? list_push(r, v, x) : dict_set(r, v, it->string, x)) return NULL;
    }
    return v;
}

static bool truthy(const value *v) {
    switch (v->k) {
    case V_BOOL:
        return v->b;
    case V_INT:
        return v->i != 0;
    case V_FLOAT:
        return v->f != 0;
    case V_STR:
    case V_LIST:
    case V_DICT:
        return v->n > 0;
    case V_NS:
        return true;
    default:
        return false;
    }
}

static const char *kind_name(vkind k) {
    static const char *n[] = {"undefined", "none", "boolean", "integer",  "float",
                              "string",    "list", "dict",    "namespace"};
    return n[k];
}

static value *lookup(frame *f, const char *name) {
    for (; f; f = f->up)
        for (int i = f->n - 1; i >= 0; i--)
            if (!strcmp(f->names[i], name)) return f->vals[i];
    return NULL;
}

static int bind(renderer *r, frame *f, const char *name, value *v) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name)) {
            f->vals[i] = v;
            return 0;
        }
    if (f->n == f->cap) {
        int c = f->cap ? 2 * f->cap : 16;
        const char **nn = amalloc(r->ar, (size_t)c * sizeof *nn);
        value **nv = amalloc(r->ar, (size_t)c * sizeof *nv);
        if (!nn || !nv) return rerr(r, NULL, "out of memory");
        if (f->n) memcpy(nn, f->names, (size_t)f->n * sizeof *nn), memcpy(nv, f->vals, (size_t)f->n * sizeof *nv);
        f->names = nn, f->vals = nv, f->cap = c;
    }
    f->names[f->n] = name, f->vals[f->n] = v, f->n++;
    return 0;
}

/* Python's text of a value, as {{ }} prints it */
static int to_text(renderer *r, const value *v, const char **s, size_t *n) {
    char buf[64];
    switch (v->k) {
    case V_UNDEF:
        *s = "", *n = 0;
        return 0;
    case V_STR:
        *s = v->s, *n = v->n;
        return 0;
    case V_NONE:
        *s = "None", *n = 4;
        return 0;
    case V_BOOL:
        *s = v->b ? "True" : "False", *n = strlen(*s);
        return 0;
    case V_INT:
        snprintf(buf, sizeof buf, "%lld", (long long)v->i);
        break;
    case V_FLOAT: /* Python's repr: the shortest text that reads back, with a '.0' when integral */
        for (int p = 1; p <= 17; p++) {
            snprintf(buf, sizeof buf, "%.*g", p, v->f);
            if (strtod(buf, NULL) == v->f) break;
        }
        if (!strpbrk(buf, ".einfa")) strcat(buf, ".0");
        break;
    default:
        return rerr(r, NULL, "printing a %s is not supported", kind_name(v->k));
    }
    *n = strlen(buf), *s = astrndup(r->ar, buf, *n);
    return *s ? 0 : rerr(r, NULL, "out of memory");
}

static bool equal(const value *a, const value *b) {
    bool an = a->k == V_INT || a->k == V_FLOAT || a->k == V_BOOL,
         bn = b->k == V_INT || b->k == V_FLOAT || b->k == V_BOOL;
    if (an && bn) {
        double x = a->k == V_INT     ? (double)a->i
                   : a->k == V_FLOAT ? a->f
                                     : a->b,
               y = b->k == V_INT     ? (double)b->i
                   : b->k == V_FLOAT ? b->f
                                     : b->b;
        if (a->k != V_FLOAT && b->k != V_FLOAT) return (a->k == V_INT ? a->i : a->b) == (b->k == V_INT ? b->i : b->b);
        return x == y;
    }
    if (a->k != b->k) return false;
    switch (a->k) {
    case V_UNDEF:
    case V_NONE:
        return true;
    case V_STR:
        return a->n == b->n && !memcmp(a->s, b->s, a->n);
    case V_LIST:
        if (a->n != b->n) return false;
        for (size_t i = 0; i < a->n; i++)
            if (!equal(a->items[i], b->items[i])) return false;
        return true;
    case V_DICT:
        if (a->n != b->n) return false;
        for (size_t i = 0; i < a->n; i++) {
            const value *o = dict_get(b, a->keys[i], strlen(a->keys[i]));
            if (!o || !equal(a->items[i], o)) return false;
        }
        return true;
    default:
        return a == b;
    }
}

/* JSON as Python's json.dumps(ensure_ascii=False) writes it (", " and ": "), for tojson */
static int to_json(renderer *r, const value *v, int indent, int level) {
    char buf[64];
    const char *s;
    size_t n;
    switch (v->k) {
    case V_UNDEF:
    case V_NONE:
        return emit(r, "null", 4);
    case V_BOOL:
        return emit(r, v->b ? "true" : "false", v->b ? 4 : 5);
    case V_INT:
    case V_FLOAT:
        if (to_text(r, v, &s, &n)) return -1;
        return emit(r, s, n);
    case V_STR: {
        if (emit(r, "\"", 1)) return -1;
        for (size_t i = 0; i < v->n; i++) {
            unsigned char c = (unsigned char)v->s[i];
            const char *e = c == '"'    ? "\\\""
                            : c == '\\' ? "\\\\"
                            : c == '\n' ? "\\n"
                            : c == '\r' ? "\\r"
                            : c == '\t' ? "\\t"
                            : c == '\b' ? "\\b"
                            : c == '\f' ? "\\f"
                                        : NULL;
            if (e) {
                if (emit(r, e, 2)) return -1;
            } else if (c < 0x20) {
                snprintf(buf, sizeof buf, "\\u%04x", c);
                if (emit(r, buf, 6)) return -1;
            } else if (emit(r, (const char *)&v->s[i], 1)) {
                return -1;
            }
        }
        return emit(r, "\"", 1);
    }
    case V_LIST:
    case V_DICT:
    case V_NS: {
        bool list = v->k == V_LIST;
        if (emit(r, list ? "[" : "{", 1)) return -1;
        for (size_t i = 0; i < v->n; i++) {
            if (i && emit(r, indent >= 0 ? "," : ", ", indent >= 0 ? 1 : 2)) return -1;
            if (indent >= 0) {
                if (emit(r, "\n", 1)) return -1;
                for (int k = 0; k < (level + 1) * indent; k++)
                    if (emit(r, " ", 1)) return -1;
            }
            if (!list) {
                value key = {.k = V_STR, .s = v->keys[i], .n = strlen(v->keys[i])};
                if (to_json(r, &key, indent, level + 1) || emit(r, ": ", 2)) return -1;
            }
            if (to_json(r, v->items[i], indent, level + 1)) return -1;
        }
        if (indent >= 0 && v->n) {
            if (emit(r, "\n", 1)) return -1;
            for (int k = 0; k < level * indent; k++)
                if (emit(r, " ", 1)) return -1;
        }
        return emit(r, list ? "]" : "}", 1);
    }
    }
    return 0;
}

static value *eval(renderer *r, const node *e, frame *f);

static bool is_space_in(char c, const value *chars) {
    if (!chars || chars->k == V_NONE || chars->k == V_UNDEF) return isspace((unsigned char)c) != 0;
    return memchr(chars->s, c, chars->n) != NULL;
}

static value *strip(renderer *r, const value *s, const value *chars, bool left, bool right) {
    size_t a = 0, b = s->n;
    while (left && a < b && is_space_in(s->s[a], chars)) a++;
    while (right && b > a && is_space_in(s->s[b - 1], chars)) b--;
    return vstr(r, s->s + a, b - a);
}

/* Python's str.split(sep) (sep None: runs of whitespace), at most maxsplit splits (-1: all) */
static value *split(renderer *r, const value *s, const value *sep, int64_t maxsplit) {
    value *l = val(r, V_LIST);
    if (!l) return NULL;
    if (!sep || sep->k == V_NONE) {
        size_t i = 0;
        while (i < s->n) {
            while (i < s->n && isspace((unsigned char)s->s[i])) i++;
            if (i >= s->n) break;
            size_t j = i;
            if (maxsplit >= 0 && (int64_t)l->n >= maxsplit) {
                size_t e = s->n;
                while (e > i && isspace((unsigned char)s->s[e - 1])) e--;
                j = e;
            } else {
                while (j < s->n && !isspace((unsigned char)s->s[j])) j++;
            }
            if (list_push(r, l, vstr(r, s->s + i, j - i))) return NULL;
            i = j;
        }
        return l;
    }
    if (sep->k != V_STR || sep->n == 0) return rerr(r, NULL, "split() needs a non-empty string separator"), NULL;
    size_t i = 0;
    for (;;) {
        const char *hit = NULL;
        if (maxsplit < 0 || (int64_t)l->n < maxsplit)
            for (size_t k = i; k + sep->n <= s->n; k++)
                if (!memcmp(s->s + k, sep->s, sep->n)) {
                    hit = s->s + k;
                    break;
                }
        if (!hit) {
            if (list_push(r, l, vstr(r, s->s + i, s->n - i))) return NULL;
            return l;
        }
        if (list_push(r, l, vstr(r, s->s + i, (size_t)(hit - (s->s + i))))) return NULL;
        i = (size_t)(hit - s->s) + sep->n;
    }
}

static value *arg(value **a, const char **names, int n, int pos, const char *name) {
    for (int i = 0; i < n; i++)
        if (names[i] && name && !strcmp(names[i], name)) return a[i];
    int k = 0;
    for (int i = 0; i < n; i++)
        if (!names[i] && k++ == pos) return a[i];
    return NULL;
}

static value *case_map(renderer *r, const value *s, int mode) { /* 0 lower, 1 upper, 2 title, 3 capitalize */
    char *d = amalloc(r->ar, s->n + 1);
    if (!d) return NULL;
    bool start = true;
    for (size_t i = 0; i < s->n; i++) {
        unsigned char c = (unsigned char)s->s[i];
        bool up = mode == 1 || ((mode == 2 || mode == 3) && start);
        if (mode == 3 && !start) up = false;
        d[i] = (char)(c < 128 ? (up ? toupper(c) : tolower(c)) : c);
        if (mode == 2) start = !isalnum(c);
        if (mode == 3) start = false;
    }
    return vstr(r, d, s->n);
}

/* obj.name(args): the methods of strings and dicts that templates use */
static value *method(renderer *r, const node *at, value *obj, const char *name, value **a, const char **nm, int n) {
    value *a0 = arg(a, nm, n, 0, NULL), *a1 = arg(a, nm, n, 1, NULL);
    if (obj->k == V_STR) {
        if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
            if (!a0 || a0->k != V_STR) return rerr(r, at, "%s() needs a string", name), NULL;
            bool ok = a0->n <= obj->n && !memcmp(name[0] == 's' ? obj->s : obj->s + obj->n - a0->n, a0->s, a0->n);
            return vbool(r, ok);
        }
        if (!strcmp(name, "strip")) return strip(r, obj, a0, true, true);
        if (!strcmp(name, "lstrip")) return strip(r, obj, a0, true, false);
        if (!strcmp(name, "rstrip")) return strip(r, obj, a0, false, true);
        if (!strcmp(name, "split")) {
            value *ms = arg(a, nm, n, 1, "maxsplit");
            return split(r, obj, arg(a, nm, n, 0, "sep"), ms && ms->k == V_INT ? ms->i : -1);
        }
        if (!strcmp(name, "lower")) return case_map(r, obj, 0);
        if (!strcmp(name, "upper")) return case_map(r, obj, 1);
        if (!strcmp(name, "title")) return case_map(r, obj, 2);
        if (!strcmp(name, "capitalize")) return case_map(r, obj, 3);
        if (!strcmp(name, "replace")) {
            if (!a0 || !a1 || a0->k != V_STR || a1->k != V_STR || a0->n == 0)
                return rerr(r, at, "replace() needs two strings"), NULL;
            value *parts = split(r, obj, a0, -1);
            if (!parts) return NULL;
            size_t tot = 0;
            for (size_t i = 0; i < parts->n; i++) tot += parts->items[i]->n + (i ? a1->n : 0);
            char *d = amalloc(r->ar, tot + 1), *q = d;
            if (!d) return NULL;
            for (size_t i = 0; i < parts->n; i++) {
                if (i) memcpy(q, a1->s, a1->n), q += a1->n;
                memcpy(q, parts->items[i]->s, parts->items[i]->n), q += parts->items[i]->n;
            }
            return vstr(r, d, tot);
        }
    } else if (obj->k == V_DICT || obj->k == V_NS) {
        if (!strcmp(name, "get")) {
            if (!a0 || a0->k != V_STR) return rerr(r, at, "get() needs a string key"), NULL;
            value *x = dict_get(obj, a0->s, a0->n);
            return x ? x : a1 ? a1 : val(r, V_NONE);
        }
        if (!strcmp(name, "items") || !strcmp(name, "keys") || !strcmp(name, "values")) {
            value *l = val(r, V_LIST);
            for (size_t i = 0; l && i < obj->n; i++) {
                value *k = vstr(r, obj->keys[i], strlen(obj->keys[i])), *x = k;
                if (name[0] == 'v') x = obj->items[i];
                if (name[0] == 'i') {
                    x = val(r, V_LIST);
                    if (!x || list_push(r, x, k) || list_push(r, x, obj->items[i])) return NULL;
                }
                if (list_push(r, l, x)) return NULL;
            }
            return l;
        }
    }
    return rerr(r, at, "the method %s() of a %s is not supported", name, kind_name(obj->k)), NULL;
}

static value *index_of(renderer *r, const node *at, value *o, value *k) {
    if (o->k == V_DICT || o->k == V_NS) {
        if (k->k != V_STR) return rerr(r, at, "a dict subscript must be a string"), NULL;
        value *x = dict_get(o, k->s, k->n);
        return x ? x : val(r, V_UNDEF);
    }
    if ((o->k == V_LIST || o->k == V_STR) && k->k == V_INT) {
        int64_t i = k->i < 0 ? k->i + (int64_t)o->n : k->i;
        if (i < 0 || i >= (int64_t)o->n) return val(r, V_UNDEF);
        return o->k == V_LIST ? o->items[i] : vstr(r, o->s + i, 1);
    }
    if (o->k == V_UNDEF) return rerr(r, at, "subscript of an undefined value"), NULL;
    return rerr(r, at, "a %s cannot be subscripted by a %s", kind_name(o->k), kind_name(k->k)), NULL;
}

static value *filter(renderer *r, const node *e, value *x, value **a, const char **nm, int n) {
    const char *f = e->s;
    if (!strcmp(f, "length") || !strcmp(f, "count")) {
        if (x->k != V_STR && x->k != V_LIST && x->k != V_DICT && x->k != V_NS)
            return rerr(r, e, "length of a %s", kind_name(x->k)), NULL;
        return vint(r, (int64_t)x->n);
    }
    if (!strcmp(f, "safe")) return x;
    if (!strcmp(f, "string")) {
        const char *s;
        size_t len;
        return to_text(r, x, &s, &len) ? NULL : vstr(r, s, len);
    }
    if (!strcmp(f, "trim")) return x->k == V_STR ? strip(r, x, arg(a, nm, n, 0, "chars"), true, true) : x;
    if (!strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "title") || !strcmp(f, "capitalize")) {
        if (x->k != V_STR) return rerr(r, e, "%s of a %s", f, kind_name(x->k)), NULL;
        return case_map(r, x, f[0] == 'l' ? 0 : f[0] == 'u' ? 1 : f[0] == 't' ? 2 : 3);
    }
    if (!strcmp(f, "tojson")) {
        value *ind = arg(a, nm, n, 0, "indent");
        size_t start = r->n;
        if (to_json(r, x, ind && ind->k == V_INT ? (int)ind->i : -1, 0)) return NULL;
        value *s = vstr(r, astrndup(r->ar, r->out + start, r->n - start), r->n - start);
        r->n = start; /* written to the output buffer only to build the text */
        return s;
    }
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        if (x->k != V_LIST && x->k != V_STR) return rerr(r, e, "%s of a %s", f, kind_name(x->k)), NULL;
        if (!x->n) return val(r, V_UNDEF);
        size_t i = f[0] == 'f' ? 0 : x->n - 1;
        return x->k == V_LIST ? x->items[i] : vstr(r, x->s + i, 1);
    }
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        value *d = arg(a, nm, n, 0, "default_value"), *b = arg(a, nm, n, 1, "boolean");
        bool use = x->k == V_UNDEF || (b && truthy(b) && !truthy(x));
        return use ? (d ? d : vstr(r, "", 0)) : x;
    }
    if (!strcmp(f, "join")) {
        value *sep = arg(a, nm, n, 0, "d");
        if (x->k != V_LIST) return rerr(r, e, "join of a %s", kind_name(x->k)), NULL;
        size_t start = r->n;
        for (size_t i = 0; i < x->n; i++) {
            const char *s;
            size_t len;
            if ((i && sep && sep->k == V_STR && emit(r, sep->s, sep->n)) || to_text(r, x->items[i], &s, &len) ||
                emit(r, s, len))
                return NULL;
        }
        value *s = vstr(r, astrndup(r->ar, r->out + start, r->n - start), r->n - start);
        r->n = start;
        return s;
    }
    if (!strcmp(f, "items") || !strcmp(f, "list") || !strcmp(f, "reverse")) {
        if (f[0] == 'i') return method(r, e, x, "items", NULL, NULL, 0);
        value *l = val(r, V_LIST);
        if (x->k == V_STR && l) {
            for (size_t i = 0; i < x->n; i++)
                if (list_push(r, l, vstr(r, x->s + (f[0] == 'r' ? x->n - 1 - i : i), 1))) return NULL;
            if (f[0] == 'r') { /* a reversed string is a string */
                char *d = amalloc(r->ar, x->n + 1);
                if (!d) return NULL;
                for (size_t i = 0; i < x->n; i++) d[i] = x->s[x->n - 1 - i];
                return vstr(r, d, x->n);
            }
            return l;
        }
        if (x->k != V_LIST && x->k != V_DICT) return rerr(r, e, "%s of a %s", f, kind_name(x->k)), NULL;
        for (size_t i = 0; l && i < x->n; i++) {
            size_t j = f[0] == 'r' ? x->n - 1 - i : i;
            if (list_push(r, l, x->k == V_LIST ? x->items[j] : vstr(r, x->keys[j], strlen(x->keys[j])))) return NULL;
        }
        return l;
    }
    if (!strcmp(f, "int") || !strcmp(f, "float") || !strcmp(f, "abs")) {
        double d = x->k == V_INT     ? (double)x->i
                   : x->k == V_FLOAT ? x->f
                   : x->k == V_STR   ? strtod(astrndup(r->ar, x->s, x->n), NULL)
                   : x->k == V_BOOL  ? x->b
                                     : 0;
        if (f[0] == 'a') d = fabs(d);
        bool to_int = f[0] == 'i' || (f[0] == 'a' && x->k == V_INT);
        if (to_int && x->k == V_INT && f[0] == 'a' && x->i == INT64_MIN)
            return rerr(r, e, "integer overflow: abs(%lld) is outside 64 bits", (long long)x->i), NULL;
        if (to_int && x->k == V_INT) return vint(r, f[0] == 'a' && x->i < 0 ? -x->i : x->i); /* exact, not via double */
        if (to_int && !(d > -9.2e18 && d < 9.2e18)) return rerr(r, e, "%s of %g: outside 64-bit integers", f, d), NULL;
        if (to_int) return vint(r, (int64_t)d);
        value *v = val(r, V_FLOAT);
        if (v) v->f = d;
        return v;
    }
    return rerr(r, e, "the filter '%s' is not supported", f), NULL;
}

static bool test(renderer *r, const node *e, value *x, value **a, int n, bool *ok) {
    const char *t = e->s;
    *ok = true;
    if (!strcmp(t, "defined")) return x->k != V_UNDEF;
    if (!strcmp(t, "undefined")) return x->k == V_UNDEF;
    if (!strcmp(t, "none")) return x->k == V_NONE;
    if (!strcmp(t, "string")) return x->k == V_STR;
    if (!strcmp(t, "number")) return x->k == V_INT || x->k == V_FLOAT;
    if (!strcmp(t, "integer")) return x->k == V_INT;
    if (!strcmp(t, "float")) return x->k == V_FLOAT;
    if (!strcmp(t, "boolean")) return x->k == V_BOOL;
    if (!strcmp(t, "true")) return x->k == V_BOOL && x->b;
    if (!strcmp(t, "false")) return x->k == V_BOOL && !x->b;
    if (!strcmp(t, "mapping")) return x->k == V_DICT || x->k == V_NS;
    if (!strcmp(t, "sequence") || !strcmp(t, "iterable")) return x->k == V_LIST || x->k == V_STR || x->k == V_DICT;
    if (!strcmp(t, "odd") || !strcmp(t, "even")) return x->k == V_INT && (x->i % 2 != 0) == (t[0] == 'o');
    if ((!strcmp(t, "eq") || !strcmp(t, "equalto") || !strcmp(t, "sameas")) && n == 1) return equal(x, a[0]);
    if (!strcmp(t, "divisibleby") && n == 1 && x->k == V_INT && a[0]->k == V_INT && a[0]->i) return x->i % a[0]->i == 0;
    *ok = false;
    rerr(r, e, "the test '%s' is not supported", t);
    return false;
}

static value *slice(renderer *r, const node *e, value *o, value *const *p) {
    if (o->k != V_LIST && o->k != V_STR) return rerr(r, e, "a slice of a %s", kind_name(o->k)), NULL;
    for (int i = 0; i < 3; i++)
        if (p[i] && p[i]->k != V_INT && p[i]->k != V_NONE) return rerr(r, e, "slice bounds must be integers"), NULL;
    int64_t len = (int64_t)o->n, step = p[2] && p[2]->k == V_INT ? p[2]->i : 1;
    if (step == 0) return rerr(r, e, "a slice step of 0"), NULL;
    int64_t lo, hi;
    bool has0 = p[0] && p[0]->k == V_INT, has1 = p[1] && p[1]->k == V_INT;
    if (step > 0) {
        lo = has0 ? p[0]->i : 0, hi = has1 ? p[1]->i : len;
        if (lo < 0) lo += len;
        if (hi < 0) hi += len;
        lo = lo < 0 ? 0 : lo > len ? len : lo, hi = hi < 0 ? 0 : hi > len ? len : hi;
    } else {
        lo = has0 ? p[0]->i : len - 1, hi = has1 ? p[1]->i : -len - 1;
        if (lo < 0) lo += len;
        if (hi < 0) hi += len;
        lo = lo < -1 ? -1 : lo > len - 1 ? len - 1 : lo, hi = hi < -1 ? -1 : hi > len - 1 ? len - 1 : hi;
    }
    value *l = val(r, V_LIST);
    char *buf = o->k == V_STR ? amalloc(r->ar, o->n + 1) : NULL;
    size_t bn = 0;
    if (!l || (o->k == V_STR && !buf)) return NULL;
    for (int64_t i = lo; step > 0 ? i < hi : i > hi;) {
        if (o->k == V_STR)
            buf[bn++] = o->s[i];
        else if (list_push(r, l, o->items[i]))
            return NULL;
        if (__builtin_add_overflow(i, step, &i)) break; /* past either end of 64 bits: past the slice */
    }
    return o->k == V_STR ? vstr(r, buf, bn) : l;
}

static value *binop(renderer *r, const node *e, value *a, value *b) {
    const char *op = e->s;
    if (!strcmp(op, "==") || !strcmp(op, "!=")) return vbool(r, equal(a, b) == (op[0] == '='));
    if (!strcmp(op, "in")) {
        bool found = false;
        if (b->k == V_STR && a->k == V_STR) {
            for (size_t k = 0; !found && k + a->n <= b->n; k++) found = !memcmp(b->s + k, a->s, a->n);
        } else if (b->k == V_LIST) {
            for (size_t k = 0; !found && k < b->n; k++) found = equal(a, b->items[k]);
        } else if ((b->k == V_DICT || b->k == V_NS) && a->k == V_STR) {
            found = dict_get(b, a->s, a->n) != NULL;
        } else {
            return rerr(r, e, "'in' a %s", kind_name(b->k)), NULL;
        }
        return vbool(r, found != e->negate);
    }
    if (!strcmp(op, "~")) {
        const char *s1, *s2;
        size_t n1, n2;
        if (to_text(r, a, &s1, &n1) || to_text(r, b, &s2, &n2)) return NULL;
        char *d = amalloc(r->ar, n1 + n2 + 1);
        if (!d) return NULL;
        memcpy(d, s1, n1), memcpy(d + n1, s2, n2);
        return vstr(r, d, n1 + n2);
    }
    if (!strcmp(op, "+") && a->k == V_STR && b->k == V_STR) {
        char *d = amalloc(r->ar, a->n + b->n + 1);
        if (!d) return NULL;
        memcpy(d, a->s, a->n), memcpy(d + a->n, b->s, b->n);
        return vstr(r, d, a->n + b->n);
    }
    if (!strcmp(op, "+") && a->k == V_LIST && b->k == V_LIST) {
        value *l = val(r, V_LIST);
        for (size_t i = 0; l && i < a->n + b->n; i++)
            if (list_push(r, l, i < a->n ? a->items[i] : b->items[i - a->n])) return NULL;
        return l;
    }
    bool an = a->k == V_INT || a->k == V_FLOAT, bn = b->k == V_INT || b->k == V_FLOAT;
    if ((a->k == V_STR && b->k == V_STR) && op[0] != '+' && op[0] != '-' && op[0] != '*' && op[0] != '/' &&
        op[0] != '%') {
        size_t m = a->n < b->n ? a->n : b->n;
        int c = memcmp(a->s, b->s, m);
        if (!c) c = a->n < b->n ? -1 : a->n > b->n;
        bool res = !strcmp(op, "<") ? c < 0 : !strcmp(op, "<=") ? c <= 0 : !strcmp(op, ">") ? c > 0 : c >= 0;
        return vbool(r, res);
    }
    if (!an || !bn) return rerr(r, e, "'%s' of a %s and a %s", op, kind_name(a->k), kind_name(b->k)), NULL;
    bool ints = a->k == V_INT && b->k == V_INT;
    double x = a->k == V_INT ? (double)a->i : a->f, y = b->k == V_INT ? (double)b->i : b->f;
    if (!strcmp(op, "<")) return vbool(r, ints ? a->i < b->i : x < y);
    if (!strcmp(op, "<=")) return vbool(r, ints ? a->i <= b->i : x <= y);
    if (!strcmp(op, ">")) return vbool(r, ints ? a->i > b->i : x > y);
    if (!strcmp(op, ">=")) return vbool(r, ints ? a->i >= b->i : x >= y);
    if ((!strcmp(op, "//") || !strcmp(op, "%")) && (ints ? b->i == 0 : y == 0))
        return rerr(r, e, "division by zero"), NULL;
    if (ints && strcmp(op, "/")) {
        /* Python's integers have no limit; keel's are 64 bits: a result outside them is an error */
        int64_t v = 0;
        bool over = false;
        if (!strcmp(op, "+"))
            over = __builtin_add_overflow(a->i, b->i, &v);
        else if (!strcmp(op, "-"))
            over = __builtin_sub_overflow(a->i, b->i, &v);
        else if (!strcmp(op, "*"))
            over = __builtin_mul_overflow(a->i, b->i, &v);
        else if (b->i == -1) /* x // -1 = -x (outside 64 bits for the smallest x); x % -1 = 0 */
            over = op[0] == '/' && a->i == INT64_MIN, v = op[0] == '/' && !over ? -a->i : 0;
        else { /* Python: floor division, and the remainder with the divisor's sign (never q * b: it can overflow) */
            int64_t q = a->i / b->i, rem = a->i % b->i;
            if (rem != 0 && ((rem < 0) != (b->i < 0))) q--, rem += b->i;
            v = op[0] == '/' ? q : rem;
        }
        if (over)
            return rerr(r, e, "integer overflow: %lld %s %lld is outside 64 bits", (long long)a->i, op,
                        (long long)b->i),
                   NULL;
        return vint(r, v);
    }
    value *v = val(r, V_FLOAT);
    if (!v) return NULL;
    if (!strcmp(op, "/") && y == 0) return rerr(r, e, "division by zero"), NULL;
    v->f = !strcmp(op, "+")    ? x + y
           : !strcmp(op, "-")  ? x - y
           : !strcmp(op, "*")  ? x * y
           : !strcmp(op, "/")  ? x / y
           : !strcmp(op, "//") ? floor(x / y)
                               : x - floor(x / y) * y;
    return v;
}

static int eval_args(renderer *r, const node *e, frame *f, value **out) {
    for (int i = 0; i < e->n_args; i++)
        if (!(out[i] = eval(r, e->args[i], f))) return -1;
    return 0;
}

static value *call(renderer *r, const node *e, frame *f) {
    value *a[32];
    if (eval_args(r, e, f, a)) return NULL;
    const node *c = e->a;
    if (c->k == E_ATTR) { /* a method */
        value *obj = eval(r, c->a, f);
        if (!obj) return NULL;
        return method(r, e, obj, c->s, a, e->arg_names, e->n_args);
    }
    if (c->k != E_VAR) return rerr(r, e, "only named functions and methods can be called"), NULL;
    if (!strcmp(c->s, "namespace")) {
        value *ns = val(r, V_NS);
        for (int i = 0; ns && i < e->n_args; i++) {
            if (!e->arg_names[i]) return rerr(r, e, "namespace() takes name=value arguments"), NULL;
            if (dict_set(r, ns, e->arg_names[i], a[i])) return NULL;
        }
        return ns;
    }
    if (!strcmp(c->s, "raise_exception")) {
        const char *s = "raise_exception()";
        size_t n = strlen(s);
        if (e->n_args && to_text(r, a[0], &s, &n)) return NULL;
        rerr(r, e, "the template raised: %.*s", (int)n, s);
        return NULL;
    }
    if (!strcmp(c->s, "range")) {
        int64_t lo = 0, hi, st = 1;
        for (int i = 0; i < e->n_args; i++)
            if (a[i]->k != V_INT) return rerr(r, e, "range() takes integers"), NULL;
        if (e->n_args == 1)
            hi = a[0]->i;
        else if (e->n_args >= 2)
            lo = a[0]->i, hi = a[1]->i, st = e->n_args > 2 ? a[2]->i : 1;
        else
            return rerr(r, e, "range() needs an argument"), NULL;
        int64_t span;
        bool empty = st > 0 ? lo >= hi : lo <= hi;
        if (st == 0 || (!empty && (__builtin_sub_overflow(hi, lo, &span) || (double)span / (double)st > 1e6)))
            return rerr(r, e, "range() too long or of step 0"), NULL;
        value *l = val(r, V_LIST);
        for (int64_t i = lo; l && (st > 0 ? i < hi : i > hi);) {
            if (list_push(r, l, vint(r, i))) return NULL;
            if (__builtin_add_overflow(i, st, &i)) break;
        }
        return l;
    }
    return rerr(r, e, "the function %s() is not supported", c->s), NULL;
}

static value *eval(renderer *r, const node *e, frame *f) {
    if (r->err[0]) return NULL;
    switch (e->k) {
    case E_LIT:
        return e->lit;
    case E_VAR: {
        value *v = lookup(f, e->s);
        return v ? v : val(r, V_UNDEF);
    }
    case E_ATTR: {
        value *o = eval(r, e->a, f);
        if (!o) return NULL;
        if (o->k == V_DICT || o->k == V_NS) {
            value *x = dict_get(o, e->s, strlen(e->s));
            return x ? x : val(r, V_UNDEF);
        }
        if (o->k == V_UNDEF) return rerr(r, e, "'%s' of an undefined value", e->s), NULL;
        return val(r, V_UNDEF); /* a string's method named without a call, or another type's attribute */
    }
    case E_INDEX: {
        value *o = eval(r, e->a, f), *k = o ? eval(r, e->args[0], f) : NULL;
        return k ? index_of(r, e, o, k) : NULL;
    }
    case E_SLICE: {
        value *o = eval(r, e->a, f), *p[3] = {NULL, NULL, NULL};
        if (!o) return NULL;
        for (int i = 0; i < 3; i++)
            if (e->args[i] && !(p[i] = eval(r, e->args[i], f))) return NULL;
        return slice(r, e, o, p);
    }
    case E_CALL:
        return call(r, e, f);
    case E_FILTER: {
        value *x = eval(r, e->a, f), *a[32];
        if (!x || eval_args(r, e, f, a)) return NULL;
        return filter(r, e, x, a, e->arg_names, e->n_args);
    }
    case E_TEST: {
        value *x = eval(r, e->a, f), *a[32];
        if (!x || eval_args(r, e, f, a)) return NULL;
        bool ok, res = test(r, e, x, a, e->n_args, &ok);
        return ok ? vbool(r, res != e->negate) : NULL;
    }
    case E_BIN: {
        value *a = eval(r, e->a, f), *b = a ? eval(r, e->b, f) : NULL;
        return b ? binop(r, e, a, b) : NULL;
    }
    case E_NOT: {
        value *a = eval(r, e->a, f);
        return a ? vbool(r, !truthy(a)) : NULL;
    }
    case E_NEG: {
        value *a = eval(r, e->a, f);
        if (!a) return NULL;
        if (a->k == V_INT && a->i == INT64_MIN)
            return rerr(r, e, "integer overflow: -(%lld) is outside 64 bits", (long long)a->i), NULL;
        if (a->k == V_INT) return vint(r, -a->i);
        if (a->k != V_FLOAT) return rerr(r, e, "'-' of a %s", kind_name(a->k)), NULL;
        value *v = val(r, V_FLOAT);
        if (v) v->f = -a->f;
        return v;
    }
    case E_AND:
    case E_OR: { /* Python's: the deciding operand itself */
        value *a = eval(r, e->a, f);
        if (!a) return NULL;
        if (truthy(a) == (e->k == E_OR)) return a;
        return eval(r, e->b, f);
    }
    case E_COND: {
        value *c = eval(r, e->b, f);
        if (!c) return NULL;
        if (truthy(c)) return eval(r, e->a, f);
        return e->c ? eval(r, e->c, f) : val(r, V_UNDEF);
    }
    case E_LIST: {
        value *l = val(r, V_LIST);
        for (int i = 0; l && i < e->n_args; i++) {
            value *x = eval(r, e->args[i], f);
            if (!x || list_push(r, l, x)) return NULL;
        }
        return l;
    }
    case E_DICT: {
        value *d = val(r, V_DICT);
        for (int i = 0; d && i + 1 < e->n_args; i += 2) {
            value *k = eval(r, e->args[i], f), *x = k ? eval(r, e->args[i + 1], f) : NULL;
            if (!x) return NULL;
            if (k->k != V_STR) return rerr(r, e, "dict keys must be strings"), NULL;
            if (dict_set(r, d, astrndup(r->ar, k->s, k->n), x)) return NULL;
        }
        return d;
    }
    default:
        return rerr(r, e, "internal: not an expression"), NULL;
    }
}

static int run(renderer *r, const node *n, frame *f);

static int run_for(renderer *r, const node *n, frame *f) {
    value *it = eval(r, n->a, f);
    if (!it) return -1;
    value *seq = it;
    if (it->k == V_DICT || it->k == V_NS || it->k == V_STR) {
        node fl = {.k = E_FILTER, .s = "list", .line = n->line};
        if (!(seq = filter(r, &fl, it, NULL, NULL, 0))) return -1;
    } else if (it->k == V_UNDEF || it->k == V_NONE) {
        if (it->k == V_NONE) return rerr(r, n, "a for loop over none");
        seq = val(r, V_LIST); /* undefined: no iterations, as Jinja */
        if (!seq) return -1;
    } else if (it->k != V_LIST) {
        return rerr(r, n, "a for loop over a %s", kind_name(it->k));
    }
    /* the items that pass the loop's filter (loop.index counts only them) */
    value **items = amalloc(r->ar, (seq->n ? seq->n : 1) * sizeof *items);
    size_t m = 0;
    if (!items) return -1;
    for (size_t i = 0; i < seq->n; i++) {
        if (n->filt) {
            frame tf = {.up = f};
            if (n->var2) {
                value *x = seq->items[i];
                if (x->k != V_LIST || x->n != 2)
                    return rerr(r, n, "cannot unpack a %s into two names", kind_name(x->k));
                if (bind(r, &tf, n->var, x->items[0]) || bind(r, &tf, n->var2, x->items[1])) return -1;
            } else if (bind(r, &tf, n->var, seq->items[i])) {
                return -1;
            }
            value *c = eval(r, n->filt, &tf);
            if (!c) return -1;
            if (!truthy(c)) continue;
        }
        items[m++] = seq->items[i];
    }
    if (!m) return n->c ? run(r, n->c, f) : 0;
    for (size_t i = 0; i < m; i++) {
        if (++r->steps > 10000000) return rerr(r, n, "more than 10 million loop iterations");
        frame lf = {.up = f};
        value *loop = val(r, V_DICT);
        if (!loop) return -1;
        struct {
            const char *k;
            value *v;
        } lv[] = {{"index", vint(r, (int64_t)i + 1)},
                  {"index0", vint(r, (int64_t)i)},
                  {"revindex", vint(r, (int64_t)(m - i))},
                  {"revindex0", vint(r, (int64_t)(m - i - 1))},
                  {"first", vbool(r, i == 0)},
                  {"last", vbool(r, i + 1 == m)},
                  {"length", vint(r, (int64_t)m)},
                  {"previtem", i ? items[i - 1] : val(r, V_UNDEF)},
                  {"nextitem", i + 1 < m ? items[i + 1] : val(r, V_UNDEF)}};
        for (size_t k = 0; k < sizeof lv / sizeof *lv; k++)
            if (!lv[k].v || dict_set(r, loop, lv[k].k, lv[k].v)) return -1;
        if (bind(r, &lf, "loop", loop)) return -1;
        if (n->var2) {
            value *x = items[i];
            if (x->k != V_LIST || x->n != 2) return rerr(r, n, "cannot unpack a %s into two names", kind_name(x->k));
            if (bind(r, &lf, n->var, x->items[0]) || bind(r, &lf, n->var2, x->items[1])) return -1;
        } else if (bind(r, &lf, n->var, items[i])) {
            return -1;
        }
        if (run(r, n->b, &lf)) return -1;
    }
    return 0;
}

static int run(renderer *r, const node *n, frame *f) {
    if (++r->depth > 200) return rerr(r, n, "statements nested too deep");
    for (; n && !r->err[0]; n = n->next) {
        switch (n->k) {
        case N_TEXT:
            if (emit(r, n->s, n->n)) return -1;
            break;
        case N_OUT: {
            value *v = eval(r, n->a, f);
            const char *s;
            size_t len;
            if (!v || to_text(r, v, &s, &len) || emit(r, s, len)) return -1;
            break;
        }
        case N_IF: {
            value *c = eval(r, n->a, f);
            if (!c) return -1;
            if (run(r, truthy(c) ? n->b : n->c, f)) return -1;
            break;
        }
        case N_FOR:
            if (run_for(r, n, f)) return -1;
            break;
        case N_SET: {
            value *v = eval(r, n->a, f);
            if (!v) return -1;
            if (n->var2) {
                value *ns = lookup(f, n->var);
                if (!ns || ns->k != V_NS)
                    return rerr(r, n, "'set %s.%s': %s is not a namespace", n->var, n->var2, n->var);
                if (dict_set(r, ns, n->var2, v)) return -1;
            } else if (bind(r, f, n->var, v)) {
                return -1;
            }
            break;
        }
        default:
            return rerr(r, n, "internal: not a statement");
        }
    }
    r->depth--;
    return r->err[0] ? -1 : 0;
}

char *keel_chat_template_render(const keel_chat_template *t, const keel_chat_vars *v, size_t *len) {
    arena ar = {0};
    renderer r = {.ar = &ar, .label = t->label};
    frame root = {0};
    value *msgs = v->messages ? from_json(&r, v->messages) : NULL;
    int rc = !msgs || msgs->k != V_LIST ? rerr(&r, NULL, "messages must be a list") : 0;
    if (!rc) rc = bind(&r, &root, "messages", msgs);
    if (!rc) rc = bind(&r, &root, "add_generation_prompt", vbool(&r, v->add_generation_prompt));
    if (!rc && v->bos_token) rc = bind(&r, &root, "bos_token", vstr(&r, v->bos_token, strlen(v->bos_token)));
    if (!rc && v->eos_token) rc = bind(&r, &root, "eos_token", vstr(&r, v->eos_token, strlen(v->eos_token)));
    const cJSON *x;
    if (v->extra) cJSON_ArrayForEach(x, v->extra) if (!rc) rc = bind(&r, &root, x->string, from_json(&r, x));
    if (!rc) rc = run(&r, t->body, &root);
    if (!rc && ar.failed) rc = rerr(&r, NULL, "out of memory");
    arena_free(&ar);
    if (rc) {
        free(r.out);
        keel_fail("%s", r.err[0] ? r.err : "cannot render the chat template");
        return NULL;
    }
    if (!r.out && !(r.out = malloc(1))) {
        keel_fail("out of memory");
        return NULL;
    }
    r.out[r.n] = 0;
    *len = r.n;
    return r.out;
}
