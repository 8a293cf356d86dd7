/* libFuzzer target: the safetensors header parser on arbitrary bytes. */
#include "internal.h"
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ft_safetensors_mem(data, size);
    return 0;
}
