/* libFuzzer target: tokenizer.json on arbitrary bytes; a file that loads is also run. */
#include "internal.h"
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ft_tokenizer_json_mem(data, size);
    return 0;
}
