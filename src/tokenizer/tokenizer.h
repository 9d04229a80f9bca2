/* keel: byte-level BPE tokenizers of the Hugging Face tokenizer.json family (Qwen2/3/3.5,
 * Llama-3, GPT-2 style), and GPT-2's original encoder.json + vocab.bpe pair. Encoding matches
 * Hugging Face tokenizers: added tokens first (longest match, never split), then NFC (when the
 * file asks), the pre-tokenizer's regex (compiled verbatim by PCRE2 in UTF + UCP mode), the byte
 * map and merges by rank. */
#ifndef KEEL_TOKENIZER_H
#define KEEL_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct keel_tokenizer keel_tokenizer;

/* path: a tokenizer.json, or a folder holding encoder.json and vocab.bpe (GPT-2). */
keel_tokenizer *keel_tokenizer_load(const char *path);
keel_tokenizer *keel_tokenizer_load_gpt2(const char *encoder_json, const char *vocab_bpe);
void keel_tokenizer_free(keel_tokenizer *t);
/* The tokenizer to use with a model: `given` when set, else model_dir/tokenizer.json when it
 * exists, else none (NULL with *failed false: bytes). *failed is set when one should load but
 * cannot (the error says why). */
keel_tokenizer *keel_tokenizer_for(const char *given, const char *model_dir, bool *failed);

/* Encodes len bytes of UTF-8 text; *ids is malloc'd. -1 with a message (invalid UTF-8 names the
 * byte offset). */
int keel_tokenizer_encode(keel_tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n_ids);
/* Decodes ids to UTF-8 (malloc'd, NUL-terminated). */
int keel_tokenizer_decode(const keel_tokenizer *t, const int32_t *ids, size_t n_ids, char **text, size_t *len);
/* The token's string as stored in the vocabulary (byte-mapped), or NULL. */
const char *keel_tokenizer_token(const keel_tokenizer *t, int32_t id);
int32_t keel_tokenizer_vocab_size(const keel_tokenizer *t);
/* The id of an added token's text (e.g. "<|endoftext|>"), or -1. */
int32_t keel_tokenizer_added_id(const keel_tokenizer *t, const char *content);
/* NFC of text when the tokenizer normalises (what decode(encode(text)) returns); malloc'd. */
char *keel_tokenizer_normalize(const keel_tokenizer *t, const char *text, size_t len, size_t *out_len);
/* The byte-level BPE alphabet (GPT-2's): writes the UTF-8 of the character that stands for byte
 * b in a token's stored string (printable Latin-1 bytes stand for themselves, the others for
 * U+0100, U+0101, ...) and returns its length. */
int keel_tokenizer_byte_char(uint8_t b, char out[4]);
/* A hash of the vocabulary, merges and rules, for caches of encoded data. */
uint64_t keel_tokenizer_hash(const keel_tokenizer *t);

#endif
