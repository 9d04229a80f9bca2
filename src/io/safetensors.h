/* keel: safetensors files. Reading maps the file and checks every header entry (dtype, shape,
 * offsets inside the data and not overlapping) before anything is used; errors name the file and
 * the tensor. Writing goes to a temporary file, fsync, rename: never a half-written output. */
#ifndef KEEL_SAFETENSORS_H
#define KEEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "tensor/tensor.h"

#define KEEL_ST_MAX_DIMS 8

typedef struct {
    char *name;
    char dtype[8]; /* "F32", "BF16", ... as in the header */
    int type;      /* keel_type, or -1 for a dtype keel does not compute in (I64, U8, ...) */
    int n_dims;
    int64_t shape[KEEL_ST_MAX_DIMS];
    const void *data;
    size_t nbytes;
} keel_st_tensor;

typedef struct {
    char *path;
    void *map;
    size_t size;
    keel_st_tensor *t;
    int n;
} keel_st_file;

/* Parse a safetensors image held in memory (the file reader and the fuzz target share this).
 * `label` names the source in errors. The tensors point into buf. */
int keel_st_parse(const void *buf, size_t size, const char *label, keel_st_file *out);
keel_st_file *keel_st_open(const char *path);
void keel_st_close(keel_st_file *f);
void keel_st_release(keel_st_file *f); /* frees what keel_st_parse allocated */
const keel_st_tensor *keel_st_find(const keel_st_file *f, const char *name);
/* Element i of a tensor as float64 (F32, F16, BF16, F64, I32, I64). */
double keel_st_get(const keel_st_tensor *t, int64_t i);
int64_t keel_st_numel(const keel_st_tensor *t);

typedef struct {
    const char *name;
    keel_type type; /* stored type */
    int n_dims;
    int64_t shape[KEEL_ST_MAX_DIMS];
    const double *values;  /* converted to `type` on write, or: */
    const void *raw;       /* bytes already in the stored dtype (values == NULL) */
    const char *raw_dtype; /* the stored dtype of raw ("F32", "BF16", "I64", ...) */
} keel_st_entry;

int keel_st_write(const char *path, const keel_st_entry *e, int n);

#endif
