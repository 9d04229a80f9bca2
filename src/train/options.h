/* keel: the training options, listed once. The table below makes the options struct, the
 * defaults, the flag parser with its range checks, `keel train --help`, and what a checkpoint
 * records of its run (trainer_state.json's "options") so that `--resume DIR` continues with the
 * same settings.
 *
 * X(kind, field, flag, metavar, default, min, max, resume, help); S(section title) for --help.
 *   kind    STR, INT (int64), DBL (finite double), U64, BOOL (a flag without a value), LIST (paths)
 *   resume  SOURCE  where the model comes from; never recorded
 *           FIXED   recorded; --resume takes it, and giving a different value is refused
 *           MAY     recorded; --resume takes it unless given again
 *           RUN     this invocation's only (stopping, tracing, timeouts); never recorded */
#ifndef KEEL_TRAIN_OPTIONS_H
#define KEEL_TRAIN_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>

struct cJSON;

#define KEEL_TRAIN_MAX_DATA 64

/* one row a line: */
// clang-format off
#define KEEL_TRAIN_OPTIONS(X, S)                                                                                       \
    S("model (exactly one)")                                                                                           \
    X(STR, model_dir, "--model", "DIR", NULL, 0, 0, SOURCE, "a Hugging Face Qwen3.5 checkpoint folder to fine-tune")   \
    X(STR, preset, "--preset", "NAME", NULL, 0, 0, SOURCE, "a fresh model: tiny, small (the demo's), 0.8b")            \
    X(STR, init_config, "--init", "CONFIG.json", NULL, 0, 0, SOURCE, "a fresh model from a config.json")               \
    X(STR, resume_dir, "--resume", "DIR", NULL, 0, 0, SOURCE,                                                          \
      "a checkpoint keel train wrote, or the run's --out folder (its newest complete checkpoint): continue "        \
      "the run with its settings")                            \
    S("data")                                                                                                          \
    X(LIST, data, "--data", "PATH...", NULL, 0, 0, FIXED,                                                              \
      "text files, folders of them, .jsonl files (\"text\"; \"prompt\" and \"completion\"; \"messages\")")                     \
    X(STR, tokenizer, "--tokenizer", "FILE", NULL, 0, 0, FIXED,                                                        \
      "tokenizer.json (default: the model folder's, else bytes)")                                                      \
    X(STR, data_format, "--data-format", "F", "auto", 0, 0, FIXED,                                                     \
      "of .jsonl files: auto (each file's first line says), text, prompt-completion, messages")                       \
    X(BOOL, skip_bad_lines, "--skip-bad-lines", "", 0, 0, 0, FIXED,                                                    \
      "count and skip .jsonl lines that are not examples (default: stop, naming file and line)")                     \
    X(STR, train_on, "--train-on", "WHAT", "responses", 0, 0, FIXED,                                                   \
      "responses: the loss on the completions and the assistant's turns only; all: on every token")                  \
    X(STR, chat_template, "--chat-template", "FILE", NULL, 0, 0, FIXED,                                                \
      "a Jinja chat template for \"messages\" data (default: the tokenizer's tokenizer_config.json)")                 \
    X(STR, doc_boundaries, "--doc-boundaries", "on|off", "auto", 0, 0, FIXED,                                          \
      "on: each example (document, conversation, prompt with completion) alone in its window's attention, "           \
      "convolution and state, positions from 0, examples packed first fit; off: one token stream cut into "          \
      "windows; auto: on for .jsonl data")                                                                             \
    X(BOOL, no_pack, "--no-pack", "", 0, 0, 0, FIXED, "with document boundaries, one example a window (padded)")     \
    X(STR, overlong, "--overlong", "HOW", "truncate", 0, 0, FIXED,                                                     \
      "with document boundaries, an example longer than the window: truncate, split (pieces from position 0) or "    \
      "drop")                                                                                                          \
    X(DBL, eval_fraction, "--eval-fraction", "F", 0.05, 0, 0.99, FIXED, "documents held out for evaluation")           \
    X(INT, window, "--window", "T", 128, 1, 1 << 24, FIXED, "tokens per sample")                                       \
    X(INT, batch, "--batch", "B", 8, 1, 1 << 20, FIXED, "samples per micro-batch")                                     \
    X(INT, accum, "--accum", "N", 1, 1, 1 << 20, FIXED, "micro-batches per optimiser step")                            \
    S("optimisation (AdamW, betas 0.9/0.95, decoupled weight decay)")                                                  \
    X(INT, steps, "--steps", "N", 100, 1, INT32_MAX, MAY, "total optimiser steps; the schedule spans them")            \
    X(INT, stop_at, "--stop-at", "N", 0, 1, INT32_MAX, RUN,                                                            \
      "stop (with a checkpoint) after step N of the --steps schedule")                                                 \
    X(DBL, lr, "--lr", "X", 1e-3, 0, 1e30, FIXED, "peak learning rate")                                                \
    X(DBL, lr_min, "--lr-min", "X", 1e-4, 0, 1e30, FIXED, "final learning rate of the cosine decay")                   \
    X(INT, warmup, "--warmup", "N", 10, 0, INT32_MAX, FIXED, "linear warm-up steps")                                   \
    X(DBL, weight_decay, "--weight-decay", "X", 0.1, 0, 1e30, FIXED, "on matrices; none on norms, gates and biases")   \
    X(DBL, clip, "--clip", "X", 1.0, 0, 1e30, FIXED, "global gradient-norm clipping, 0 for none")                      \
    X(STR, freeze, "--freeze", "REGEX", NULL, 0, 0, FIXED,                                                             \
      "do not train the parameters whose names match (POSIX ERE)")                                                     \
    X(U64, seed, "--seed", "N", 1, 0, INT64_MAX, FIXED, "data order, held-out split and fresh weights")                \
    S("LoRA (low-rank adapters beside the base weights, which stay frozen; saved in PEFT's format)")                  \
    X(INT, lora_rank, "--lora-rank", "R", 0, 0, 1 << 16, FIXED,                                                        \
      "train adapters of rank R instead of every weight (0: full fine-tuning; needs --model)")                        \
    X(DBL, lora_alpha, "--lora-alpha", "A", 0, 0, 1e30, FIXED, "the adapters' scale is A/R; 0 takes A = R (scale 1)")           \
    X(DBL, lora_dropout, "--lora-dropout", "P", 0, 0, 0.99, FIXED, "dropout on the adapters' input while training")    \
    X(STR, lora_targets, "--lora-targets", "REGEX", NULL, 0, 0, FIXED,                                                 \
      "modules to adapt, a POSIX ERE over names like model.layers.0.mlp.up_proj (default: every projection of "      \
      "the attention, DeltaNet and MLP)")                                                                              \
    X(STR, base_dtype, "--base-dtype", "T", "f32", 0, 0, FIXED,                                                        \
      "f32 or bf16: the frozen base's matrices (bf16 halves them; with --recompute their float32 copies live one "    \
      "layer at a time)")                                                                                              \
    X(STR, precision, "--precision", "P", "f32", 0, 0, FIXED,                                                          \
      "f32 (keel's parity mode) or bf16: mixed precision, the projections' operands bf16 copies of the float32 "      \
      "weights and inputs, float32 sums, master weights, gradients, moments and residual stream")                      \
    S("run")                                                                                                           \
    X(STR, out_dir, "--out", "DIR", NULL, 0, 0, MAY,                                                                   \
      "checkpoint, metrics.jsonl and the token cache go here (required)")                                              \
    X(INT, eval_every, "--eval-every", "N", 50, 0, INT32_MAX, MAY, "evaluate every N steps, and at the end")           \
    X(INT, eval_batches, "--eval-batches", "N", 8, 1, 1 << 20, MAY, "batches per evaluation")                          \
    X(INT, save_every, "--save-every", "N", 0, 0, INT32_MAX, MAY,                                                      \
      "checkpoint every N steps, and at the end (0: the end only)")                                                    \
    X(STR, backend, "--backend", "B", "cpu", 0, 0, MAY, "ref, cpu or cuda")                                            \
    X(INT, threads, "--threads", "N", 2, 1, 1024, MAY, "cpu threads")                                                  \
    X(STR, recompute, "--recompute", "MODE", "off", 0, 0, MAY,                                                         \
      "off, full, every:N, layers:i,j (bitwise the same results)")                                                     \
    X(INT, nproc, "--nproc", "N", 1, 1, 1024, FIXED,                                                                   \
      "data-parallel processes on this host (one per GPU); --batch is per process. Several hosts: one process per "    \
      "rank "                                                                                                          \
      "with KEEL_RANK, KEEL_WORLD_SIZE, KEEL_MASTER_ADDR, KEEL_MASTER_PORT set (as mpirun or srun would)")             \
    X(DBL, dist_timeout, "--dist-timeout", "S", 60, 1e-3, 1e9, RUN,                                                    \
      "seconds a rank waits for another before giving up")                                                             \
    X(STR, trace, "--trace", "FILE", NULL, 0, 0, RUN, "trace step --trace-step for keel diff")                         \
    X(INT, trace_step, "--trace-step", "N", 1, 1, INT32_MAX, RUN, "the step --trace traces")                           \
    X(BOOL, trace_data, "--trace-data", "", 0, 0, 0, RUN, "store each node's output in the trace (for --tolerance)")   \
    X(INT, trace_max_bytes, "--trace-max-bytes", "N", 256ll << 20, 0, INT64_MAX, RUN, "bytes of such data")            \
    X(INT, trace_sample, "--trace-sample", "N", 0, 1, INT64_MAX, RUN, "keep only N evenly spaced values of each node")

#define KEEL_OPT_FIELD_STR(f)  const char *f;
#define KEEL_OPT_FIELD_INT(f)  int64_t f;
#define KEEL_OPT_FIELD_DBL(f)  double f;
#define KEEL_OPT_FIELD_U64(f)  uint64_t f;
#define KEEL_OPT_FIELD_BOOL(f) bool f;
#define KEEL_OPT_FIELD_LIST(f)                                                                                         \
    const char *f[KEEL_TRAIN_MAX_DATA];                                                                                \
    int n_##f;
#define KEEL_OPT_FIELD(kind, field, ...) KEEL_OPT_FIELD_##kind(field)
#define KEEL_OPT_NONE(title)

// clang-format on
typedef struct {
    KEEL_TRAIN_OPTIONS(KEEL_OPT_FIELD, KEEL_OPT_NONE)
} keel_train_opts;

void keel_train_defaults(keel_train_opts *o);
/* Parses keel train's flags (argv[0] is "train") into o, starting from the defaults or, with
 * --resume, from the settings the checkpoint records. 0; 1 when --help printed the help; -1 with
 * a message naming the flag (unknown, out of range, or one a resumed run cannot change). */
int keel_train_parse(int argc, char **argv, keel_train_opts *o);
/* Frees the strings keel_train_parse allocated (the options that point at them are then invalid). */
void keel_train_opts_release(void);
/* keel train --help. backends: the names this build has. */
void keel_train_help(const char *backends);
/* The recorded options (FIXED and MAY) as a JSON object, for trainer_state.json; NULL when out of memory. */
struct cJSON *keel_train_opts_json(const keel_train_opts *o);

#endif
