#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "unit.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"

/* A safetensors image: 8-byte length, header, data. */
static unsigned char *image(const char *header, const void *data, size_t n_data, size_t *size) {
    size_t hl = strlen(header);
    *size = 8 + hl + n_data;
    unsigned char *b = malloc(*size);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, header, hl);
    if (n_data) memcpy(b + 8 + hl, data, n_data);
    return b;
}

static void expect_error(const char *header, size_t n_data, const char *needle) {
    unsigned char data[64] = {0};
    size_t size;
    unsigned char *b = image(header, data, n_data, &size);
    keel_st_file f;
    assert_int_equal(keel_st_parse(b, size, "x.safetensors", &f), -1);
    const char *e = keel_last_error();
    if (!strstr(e, needle) || !strstr(e, "x.safetensors")) fail_msg("error '%s' lacks '%s'", e, needle);
    free(b);
}

static void malformed_headers(void **st) {
    (void)st;
    keel_st_file f;
    unsigned char tiny[4] = {1, 2, 3, 4};
    assert_int_equal(keel_st_parse(tiny, 4, "x.safetensors", &f), -1);
    assert_non_null(strstr(keel_last_error(), "too short"));
    unsigned char big[16] = {0xff, 0xff, 0, 0, 0, 0, 0, 0};
    assert_int_equal(keel_st_parse(big, 16, "x.safetensors", &f), -1);
    assert_non_null(strstr(keel_last_error(), "runs past the end"));
    expect_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]", 8, "not a JSON object");
    expect_error("{\"w\": {\"dtype\": \"F8\", \"shape\": [2], \"data_offsets\": [0, 2]}}", 2, "unknown dtype 'F8'");
    expect_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 8, "out of range");
    expect_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}", 8, "need 12 bytes");
    expect_error("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                 " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
                 16, "'a' and 'b' overlap");
    expect_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [-2], \"data_offsets\": [0, 8]}}", 8,
                 "not a non-negative integer");
    expect_error("{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 0]}}", 8, "end before they begin");
    expect_error("{\"w\": 3}", 0, "'w': entry needs");
    /* a good one, with metadata */
    float v[2] = {1.5f, -2.0f};
    size_t size;
    unsigned char *b = image("{\"__metadata__\": {\"format\": \"pt\"}, \"w\": {\"dtype\": \"F32\", \"shape\": [2], "
                             "\"data_offsets\": [0, 8]}}",
                             v, 8, &size);
    assert_int_equal(keel_st_parse(b, size, "ok", &f), 0);
    assert_int_equal(f.n, 1);
    const keel_st_tensor *t = keel_st_find(&f, "w");
    assert_non_null(t);
    assert_true(keel_st_get(t, 1) == -2.0);
    keel_st_release(&f);
    free(b);
}

static void write_read_truncate(void **st) {
    (void)st;
    char dir[] = "/tmp/keel_st_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof path, "%s/m.safetensors", dir);
    double a[6] = {1, -2.5, 3.25, 1e-3, 65504, -0.0}, b[3] = {7, 8, 9};
    keel_st_entry e[2] = {{.name = "a", .type = KEEL_BF16, .n_dims = 2, .shape = {2, 3}, .values = a},
                          {.name = "b", .type = KEEL_F32, .n_dims = 1, .shape = {3}, .values = b}};
    assert_int_equal(keel_st_write(path, e, 2), 0);
    keel_st_file *f = keel_st_open(path);
    assert_non_null(f);
    const keel_st_tensor *ta = keel_st_find(f, "a"), *tb = keel_st_find(f, "b");
    assert_string_equal(ta->dtype, "BF16");
    assert_int_equal(ta->shape[1], 3);
    for (int i = 0; i < 6; i++) assert_true(keel_st_get(ta, i) == keel_bf16_to_f32(keel_f32_to_bf16((float)a[i])));
    for (int i = 0; i < 3; i++) assert_true(keel_st_get(tb, i) == b[i]);
    keel_st_close(f);
    /* truncated by 4 bytes: the last tensor's offsets leave the file */
    struct stat sb;
    stat(path, &sb);
    assert_int_equal(truncate(path, sb.st_size - 4), 0);
    assert_null(keel_st_open(path));
    assert_non_null(strstr(keel_last_error(), path));
    assert_non_null(strstr(keel_last_error(), "'b'"));
    assert_non_null(strstr(keel_last_error(), "out of range"));
    /* a write into a folder that does not exist fails and leaves nothing */
    char bad[300];
    snprintf(bad, sizeof bad, "%s/nope/m.safetensors", dir);
    assert_int_equal(keel_st_write(bad, e, 2), -1);
    unlink(path);
    rmdir(dir);
}

/* Checkpoint folders: a missing tensor, an unexpected one, a wrong shape, unsupported configs. */
static const char *CONFIG =
    "{\"model_type\": \"qwen3_5_text\", \"vocab_size\": 11, \"hidden_size\": 8, \"num_hidden_layers\": 2,"
    " \"intermediate_size\": 12, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 4,"
    " \"linear_num_key_heads\": 1, \"linear_num_value_heads\": 2, \"linear_key_head_dim\": 4,"
    " \"linear_value_head_dim\": 4, \"linear_conv_kernel_dim\": 4, \"rms_norm_eps\": 1e-6,"
    " \"tie_word_embeddings\": true, \"layer_types\": [\"linear_attention\", \"full_attention\"],"
    " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0, \"partial_rotary_factor\": 0.5}%s}";

static void write_text(const char *path, const char *s) {
    FILE *f = fopen(path, "w");
    fputs(s, f);
    fclose(f);
}

static int make_ckpt(const char *dir, const char *extra_cfg, int drop, const char *extra_tensor, int bad_shape) {
    char p[512], cfg[4096];
    snprintf(cfg, sizeof cfg, CONFIG, extra_cfg);
    snprintf(p, sizeof p, "%s/config.json", dir);
    write_text(p, cfg);
    keel_qwen35_config c;
    bool mm;
    if (keel_hf_config_read(dir, &c, &mm)) return -1;
    keel_ctx *ctx = keel_ctx_new();
    keel_qwen35 *m = keel_qwen35_new(ctx, &c, KEEL_F32);
    double **v = keel_qwen35_init_values(m, 3);
    keel_st_entry e[64];
    int n = 0;
    for (int i = 0; i < m->n_params; i++) {
        if (i == drop) continue;
        keel_tensor *t = m->params[i];
        e[n] = (keel_st_entry){.name = t->name, .type = KEEL_F32, .n_dims = t->ne[1] > 1 ? 2 : 1, .values = v[i]};
        if (t->ne[1] > 1 && i == bad_shape)
            e[n].shape[0] = t->ne[0], e[n].shape[1] = t->ne[1]; /* transposed */
        else if (t->ne[1] > 1)
            e[n].shape[0] = t->ne[1], e[n].shape[1] = t->ne[0];
        else
            e[n].shape[0] = t->ne[0];
        n++;
    }
    if (extra_tensor)
        e[n++] = (keel_st_entry){.name = extra_tensor, .type = KEEL_F32, .n_dims = 1, .shape = {2}, .values = v[0]};
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    int rc = keel_st_write(p, e, n);
    for (int i = 0; i < m->n_params; i++) free(v[i]);
    free(v);
    keel_qwen35_free(m);
    keel_ctx_free(ctx);
    return rc;
}

static int try_load(const char *dir) {
    keel_checkpoint *ck = keel_checkpoint_open(dir);
    if (!ck) return -1;
    keel_ctx *ctx = keel_ctx_new();
    keel_qwen35 *m = keel_qwen35_new(ctx, &ck->cfg, KEEL_F32);
    keel_graph *g = keel_graph_build(ctx, m->params, m->n_params);
    keel_backend *be = keel_backend_new("cpu", 1);
    keel_session *s = keel_session_new(be, g, NULL);
    int rc = keel_checkpoint_load(ck, m, be);
    keel_session_free(s);
    keel_backend_free(be);
    keel_graph_free(g);
    keel_qwen35_free(m);
    keel_ctx_free(ctx);
    keel_checkpoint_close(ck);
    return rc;
}

static void checkpoint_errors(void **st) {
    (void)st;
    char dir[] = "/tmp/keel_ck_XXXXXX";
    assert_non_null(mkdtemp(dir));
    assert_int_equal(make_ckpt(dir, "", -1, NULL, -1), 0);
    assert_int_equal(try_load(dir), 0);
    assert_int_equal(make_ckpt(dir, "", 3, NULL, -1), 0);
    assert_int_equal(try_load(dir), -1);
    assert_non_null(strstr(keel_last_error(), "is missing"));
    assert_int_equal(make_ckpt(dir, "", -1, "model.layers.0.mlp.extra.weight", -1), 0);
    assert_int_equal(try_load(dir), -1);
    assert_non_null(strstr(keel_last_error(), "unexpected tensor 'model.layers.0.mlp.extra.weight'"));
    assert_int_equal(make_ckpt(dir, "", -1, "model.visual.blocks.0.w", -1), 0); /* ignored */
    assert_int_equal(try_load(dir), 0);
    assert_int_equal(make_ckpt(dir, "", -1, NULL, 2), 0);
    assert_int_equal(try_load(dir), -1);
    assert_non_null(strstr(keel_last_error(), "has shape"));
    assert_int_equal(make_ckpt(dir, ", \"num_experts\": 8", -1, NULL, -1), -1);
    assert_non_null(strstr(keel_last_error(), "num_experts"));
    char p[512];
    snprintf(p, sizeof p, "%s/config.json", dir);
    write_text(p, "{\"hidden_size\": 8}");
    keel_qwen35_config c;
    bool mm;
    assert_int_equal(keel_hf_config_read(dir, &c, &mm), -1);
    assert_non_null(strstr(keel_last_error(), "\"vocab_size\" is missing"));
    write_text(p, "{\"vocab_size\": 8,");
    assert_int_equal(keel_hf_config_read(dir, &c, &mm), -1);
    assert_non_null(strstr(keel_last_error(), "invalid JSON"));
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/config.json", dir);
    unlink(p);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(malformed_headers),
        cmocka_unit_test(write_read_truncate),
        cmocka_unit_test(checkpoint_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
