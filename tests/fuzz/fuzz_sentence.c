/* libFuzzer target: a checkpoint's sentence-transformers files (modules.json, the Pooling and
 * Dense modules' config.json, the Dense weights' safetensors, config_sentence_transformers.json,
 * sentence_bert_config.json), as forge_embed reads them at load. */
#include "internal.h"
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ft_sentence_mem(data, size);
    return 0;
}
