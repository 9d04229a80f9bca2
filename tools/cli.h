/* keel: the command-line tool's commands. Each returns the process exit status. */
#ifndef KEEL_CLI_H
#define KEEL_CLI_H

int cmd_test_ops(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_bench_train(int argc, char **argv);
int cmd_ops(int argc, char **argv);
int cmd_test_model(int argc, char **argv);
int cmd_check_reference(int argc, char **argv);
int cmd_save(int argc, char **argv);
int cmd_init(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_test_recompute(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_diff(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_plot(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_merge(int argc, char **argv);

/* Parse a positive integer flag value; prints the error and returns -1 when it is not one. */
long long cli_int(const char *flag, const char *value, long long min);

#endif
