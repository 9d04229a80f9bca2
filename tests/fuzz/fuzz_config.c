/* libFuzzer target: config.json. Every input is read or refused without a crash; an accepted
 * config passes keel's shape checks, builds the model's tensors (no overflow in any shape) and
 * writes back as JSON. */
#include "fuzz_util.h"

#include "io/checkpoint.h"
#include "model/qwen35.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    keel_qwen35_config cfg;
    bool mm;
    const char *path = fuzz_file("config.json", data, size);
    if (keel_hf_config_read_file(path, &cfg, &mm) != 0) return 0;
    if (keel_qwen35_config_check(&cfg) != 0) abort(); /* read_file checks it: an accepted config is valid */
    keel_ctx *ctx = keel_ctx_new();
    keel_qwen35 *m = keel_qwen35_new(ctx, &cfg, KEEL_F32);
    if (!m) abort();
    keel_qwen35_free(m);
    keel_ctx_free(ctx);
    free(keel_hf_config_json(&cfg, KEEL_BF16));
    return 0;
}
