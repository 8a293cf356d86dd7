/* libFuzzer target: the GGUF parser, then the config and vocabulary readers on what it accepts. */
#include "internal.h"
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ft_gguf_mem(data, size);
    return 0;
}
