/*
 * model_template.c — keel_model_chat_template: the chat template a GGUF
 * file carries (tokenizer.chat_template). Owns no state; the returned bytes
 * live in the model's mapping.
 */
#include "engine.h"

keel_status keel_model_chat_template(const keel_model *m, const char **source, size_t *len)
{
    if (!m || !source || !len) return KEEL_EINVAL;
    *source = NULL;
    *len = 0;
    return gguf_chat_template(m->g, source, len, NULL);
}
