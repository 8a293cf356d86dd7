/* libFuzzer target: config.json (HF) on arbitrary bytes. */
#include "internal.h"
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ft_config_mem(data, size);
    return 0;
}
