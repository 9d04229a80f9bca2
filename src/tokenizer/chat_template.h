/* keel: chat templates. A checkpoint's chat template (tokenizer_config.json's "chat_template", a
 * Jinja template) rendered as Hugging Face transformers' apply_chat_template renders it: Jinja with
 * trim_blocks and lstrip_blocks, the variables messages, add_generation_prompt, bos_token,
 * eos_token (and tools left undefined). keel implements the part of Jinja chat templates use:
 * if/elif/else, for (with loop.index0, first, last, ...; an else branch; a filter), set (also
 * namespace attributes), expressions with + - * / // % ~, comparisons, and/or/not, in, is tests,
 * conditional expressions, slices, string methods (startswith, endswith, split, strip, lstrip,
 * rstrip, upper, lower, replace, title), filters (length, tojson, trim, upper, lower, string,
 * first, last, join, default, items, list, reverse, int, float, safe), namespace(), range() and
 * raise_exception(). A template using anything else is refused when it is compiled, naming the
 * construct and its line, never rendered approximately. */
#ifndef KEEL_CHAT_TEMPLATE_H
#define KEEL_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

struct cJSON;

typedef struct keel_chat_template keel_chat_template;

/* Compiles template source text; NULL with a message naming the construct and line. */
keel_chat_template *keel_chat_template_compile(const char *source, const char *label);
/* The "chat_template" of a tokenizer_config.json (a string, or the entry named "default" of a
 * list of {name, template}); NULL with a message. */
keel_chat_template *keel_chat_template_from_config(const char *tokenizer_config_path);
void keel_chat_template_free(keel_chat_template *t);

typedef struct {
    const struct cJSON *messages; /* a JSON array of {role, content, ...} */
    bool add_generation_prompt;
    const char *bos_token, *eos_token; /* NULL: undefined */
    const struct cJSON *extra;         /* more variables (an object: enable_thinking, ...), or NULL */
} keel_chat_vars;

/* The rendered text (malloc'ed, *len bytes), or NULL with a message (raise_exception's text, an
 * error naming the line). */
char *keel_chat_template_render(const keel_chat_template *t, const keel_chat_vars *v, size_t *len);

/* The template's source text. */
const char *keel_chat_template_source(const keel_chat_template *t);
/* A copy of s that lives as long as the template (NULL if out of memory). */
const char *keel_chat_template_keep(keel_chat_template *t, const char *s);

#endif
