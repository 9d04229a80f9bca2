/* keel: one flag table per command. A command lists its flags once (flag, kind, where the value
 * goes, range, metavariable, help); cli_parse reads argv by it, checks each value (integers and
 * finite numbers within their range), and prints `keel CMD --help` from it. */
#ifndef KEEL_CLI_FLAGS_H
#define KEEL_CLI_FLAGS_H

#include <stdbool.h>
#include <stdio.h>

typedef enum {
    CLI_STR,  /* const char * */
    CLI_INT,  /* long long, in [min, max] */
    CLI_DBL,  /* double, finite, in [min, max] */
    CLI_BOOL, /* bool, set by the flag alone */
    CLI_LIST, /* const char *[max] and its count: the values up to the next flag */
} cli_kind;

typedef struct {
    const char *flag; /* "--window"; NULL: a positional argument, taken in table order */
    cli_kind kind;
    void *dst;
    double min, max; /* CLI_INT, CLI_DBL; CLI_LIST: max is the most values */
    int *count;      /* CLI_LIST */
    const char *meta, *help;
    bool required;
} cli_flag;

typedef struct {
    const char *cmd;     /* "keel eval" */
    const char *summary; /* one line */
    const cli_flag *flags;
    int n;
} cli_spec;

/* Parses argv[1..argc) (argv[0] is the command's name). 0: parsed; 1: --help was printed; 2: an
 * unknown flag, a missing or out-of-range value, or a missing required one (printed, naming it). */
int cli_parse(const cli_spec *spec, int argc, char **argv);
void cli_help(const cli_spec *spec);
/* The one-line synopsis, from the table (for errors found after parsing). */
void cli_usage(const cli_spec *spec, FILE *f);

#endif
