/* libFuzzer target: chat templates (tokenizer_config.json's "chat_template" is input keel did not
 * write). Every template is compiled or refused with a message, and a compiled one renders a fixed
 * conversation or fails with a message: never a crash, a hang (loops run over finite lists, nesting
 * is bounded) or a sanitizer report. */
#include <cjson/cJSON.h>

#include "fuzz_util.h"
#include "tokenizer/chat_template.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *src = malloc(size + 1);
    if (!src) return 0;
    memcpy(src, data, size);
    src[size] = 0;
    keel_chat_template *t = keel_chat_template_compile(src, "fuzz");
    free(src);
    if (!t) return 0;
    static cJSON *msgs;
    if (!msgs)
        msgs = cJSON_Parse(
            "[{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"u <|im_end|>\"},"
            " {\"role\": \"assistant\", \"content\": \"<think>\\nr\\n</think>\\n\\na\"}]");
    keel_chat_vars v = {.messages = msgs, .add_generation_prompt = true, .eos_token = "<|im_end|>"};
    size_t len;
    free(keel_chat_template_render(t, &v, &len));
    keel_chat_template_free(t);
    return 0;
}
