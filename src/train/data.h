/* keel: training data. Text files, folders of them, and JSON Lines files (a "text" field, or
 * "prompt" and "completion": the loss then on the completion only) become documents; documents
 * become token ids (the model's tokenizer, or bytes when there is none) joined by the end-of-text
 * token, split into a training and a held-out stream by document,
 * and cached next to the output. Batches are windows of T tokens (and the next T as targets) in a
 * deterministic shuffled order: sample p of the run is always the same window for the same seed. */
#ifndef KEEL_TRAIN_DATA_H
#define KEEL_TRAIN_DATA_H

#include <stdbool.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

/* A target the loss leaves out (the cross-entropy op skips negative targets). */
#define KEEL_NO_TARGET (-100)

/* An example longer than the window: cut to the window, cut into window-long pieces (each trained
 * as an example of its own, from position 0), or left out. */
typedef enum { KEEL_OVERLONG_TRUNCATE, KEEL_OVERLONG_SPLIT, KEEL_OVERLONG_DROP } keel_overlong;

/* Windows that respect documents: each example (a document, a conversation, a prompt with its
 * completion: the tokens up to and including an end-of-text token) lies in one window with its
 * positions from 0, so the model's attention, convolution and recurrent state never cross into
 * another (model/qwen35.h). A window holds pieces of examples: piece i is the tokens start[i] ..
 * start[i] + len[i] - 1 as inputs and the next len[i] as targets; window w holds pieces first[w] ..
 * first[w+1] - 1 in order, then padding (end-of-text ids, no targets, positions from 0). */
typedef struct {
    int64_t n_windows, n_pieces;
    int64_t *first, *start;
    int32_t *len;
    int64_t n_examples, n_overlong, n_dropped; /* examples met; longer than the window; left out */
    int64_t n_slots;                           /* input positions holding an example's token */
    keel_overlong overlong;
} keel_packing;

typedef struct {
    int32_t *train, *eval;
    uint8_t *train_mask, *eval_mask; /* per token, 1: a target the loss counts; NULL: every token is */
    int64_t n_train, n_eval;
    int64_t n_docs, n_eval_docs;
    int64_t n_pc;        /* of the documents, prompt/completion examples */
    int64_t n_chat;      /* and conversations */
    int64_t n_bad_lines; /* JSON Lines skipped (--skip-bad-lines) */
    int64_t n_trained;   /* targets of the training stream the loss counts (packed: of its windows) */
    int64_t n_targets;   /* and all its targets (the stream's tokens but the first; packed: the windows') */
    int32_t eot;
    bool cached;                          /* loaded from the cache */
    bool jsonl;                           /* some file is JSON Lines (document boundaries are then on by default) */
    keel_packing *train_pack, *eval_pack; /* keel_dataset_pack's layouts (NULL: one token stream) */
} keel_dataset;

struct keel_chat_template;

typedef struct {
    const char *format;  /* of .jsonl files: "auto" (NULL: the same; detected per file), "text",
                          * "prompt-completion", "messages" */
    bool skip_bad_lines; /* count and skip a line that is not an example, instead of failing */
    bool train_on_all;   /* prompt/completion: the loss on the prompt's tokens too; messages: on every token */
    const struct keel_chat_template *chat; /* renders "messages" (NULL: such data is refused) */
    const char *bos_token, *eos_token;     /* the template's variables (NULL: undefined) */
    const char *chat_id;                   /* what the template is (its path), for the token cache's key */
} keel_data_opts;

/* tok NULL: bytes, with 0 as end-of-text. cache_path NULL: no cache. o NULL: the defaults. */
int keel_dataset_load(keel_dataset *d, const char *const *paths, int n_paths, keel_tokenizer *tok, double eval_fraction,
                      uint64_t seed, const char *cache_path, const keel_data_opts *o);
void keel_dataset_free(keel_dataset *d);

/* Packs both streams into windows of T tokens that respect documents (see keel_packing): the
 * training examples in an order drawn from seed, first fit (the first window with room), or with
 * pack false one example a window; the held-out examples in order. From then on the functions
 * below serve these windows. -1 with a message when no example fits. */
int keel_dataset_pack(keel_dataset *d, int64_t T, uint64_t seed, bool pack, keel_overlong overlong);

/* --doc-boundaries: "on" 1, "off" 0, "auto" (NULL too) on for JSON Lines data; -1 with a message. */
int keel_doc_boundaries(const char *flag, bool jsonl);
/* --overlong: truncate, split or drop; -1 with a message. */
int keel_overlong_parse(const char *flag, keel_overlong *out);
/* One line on stdout: examples, windows, how full, what was cut or left out. */
void keel_data_report_packing(const keel_dataset *d, int64_t T, bool pack);

/* Windows of the training stream: ids, targets and positions [T, B] for samples p .. p+B-1
 * (KEEL_NO_TARGET where the mask leaves a target out; positions 0..T-1 a window unless packed).
 * Returns the number of targets the loss counts. */
int64_t keel_dataset_windows(const keel_dataset *d, int64_t T);
int64_t keel_dataset_batch(const keel_dataset *d, int64_t T, int64_t B, uint64_t seed, int64_t p, int32_t *ids,
                           int32_t *tgt, int32_t *pos);
/* Windows of the held-out stream, and window w (in order, not shuffled) of either stream; returns
 * its counted targets. */
int64_t keel_dataset_eval_windows(const keel_dataset *d, int64_t T);
int64_t keel_dataset_window(const keel_dataset *d, bool eval, int64_t w, int64_t T, int32_t *ids, int32_t *tgt,
                            int32_t *pos);

/* The chat template "messages" data is rendered with: the file given (template_path), else the
 * "chat_template" of the tokenizer_config.json beside tokenizer_json (none: *out NULL, and such
 * data is refused when met); and its bos/eos tokens from that file. Fills o's chat fields. -1 with
 * a message. */
int keel_chat_setup(const char *template_path, const char *tokenizer_json, struct keel_chat_template **out,
                    keel_data_opts *o);

#endif
