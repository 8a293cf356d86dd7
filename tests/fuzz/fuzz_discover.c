/* libFuzzer target: forge_discover over a directory holding the bytes as a GGUF file or as a
 * safetensors model directory (config.json + model.safetensors): the header-only reads (a
 * GGUF's grown from 64 bytes), the parsers, the config and the loader's plan without a device. */
#include "internal.h"
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ft_discover_mem(data, size);
    return 0;
}
