/* keel: GGUF files (version 3, the format llama.cpp, Ollama and LM Studio read). A writer only:
 * key/value metadata, then tensor descriptions, then the tensors' bytes, each aligned. Tensor
 * bytes are produced one tensor at a time by a callback while the file is written, so exporting
 * a model needs memory for one tensor, not for the whole model. The file is written to a
 * temporary name beside the output, fsynced and renamed: never a half-written output. */
#ifndef KEEL_GGUF_H
#define KEEL_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ggml's type numbers for the tensor types keel writes. */
typedef enum { KEEL_GGML_F32 = 0, KEEL_GGML_F16 = 1, KEEL_GGML_Q8_0 = 8, KEEL_GGML_BF16 = 30 } keel_ggml_type;

#define KEEL_GGUF_ALIGNMENT 32
#define KEEL_Q8_0_BLOCK     32 /* values per q8_0 block: a float16 scale, then 32 int8 */

typedef struct keel_gguf keel_gguf;

/* Fills buf (nbytes, as keel_ggml_nbytes gives for the tensor) with tensor i's bytes. */
typedef int (*keel_gguf_fill)(void *ud, int i, void *buf, size_t nbytes);

keel_gguf *keel_gguf_new(void);
void keel_gguf_free(keel_gguf *g);

/* Metadata; every call copies what it is given. -1 when out of memory. */
int keel_gguf_u32(keel_gguf *g, const char *key, uint32_t v);
int keel_gguf_f32(keel_gguf *g, const char *key, float v);
int keel_gguf_bool(keel_gguf *g, const char *key, bool v);
int keel_gguf_str(keel_gguf *g, const char *key, const char *v);
int keel_gguf_arr_i32(keel_gguf *g, const char *key, const int32_t *v, size_t n);
int keel_gguf_arr_bool(keel_gguf *g, const char *key, const bool *v, size_t n);
/* An array of n strings (lengths given, so strings may hold any bytes). */
int keel_gguf_arr_str(keel_gguf *g, const char *key, const char *const *v, const size_t *len, size_t n);

/* Declares tensor number i (in call order, from 0): ne[0] is the fastest dimension. */
int keel_gguf_tensor(keel_gguf *g, const char *name, keel_ggml_type type, int n_dims, const int64_t *ne);
int keel_gguf_n_tensors(const keel_gguf *g);

/* Bytes of a tensor of n elements per row-major layout; 0 when q8_0 rows (ne0) are not a
 * multiple of its block. */
size_t keel_ggml_nbytes(keel_ggml_type type, int64_t ne0, int64_t n_elements);
const char *keel_ggml_type_name(keel_ggml_type type);

/* Encodes n float values (a multiple of the block for q8_0) as `type`; q8_0 as ggml's reference
 * quantizer does: per block of 32, d = max|x| / 127 stored as float16, q = round(x / d). */
void keel_ggml_encode(keel_ggml_type type, const float *x, int64_t n, void *out);

/* Writes the file: header, metadata, tensor descriptions, then fill(ud, i, ...) for each tensor
 * in order. progress (may be NULL) is called after each tensor. -1 with a message naming the file. */
int keel_gguf_write(const keel_gguf *g, const char *path, keel_gguf_fill fill, void *ud,
                    void (*progress)(void *ud, int done, int total));

#endif
