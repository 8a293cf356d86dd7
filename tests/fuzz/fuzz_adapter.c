/* libFuzzer target: LoRA adapter files (adapter_config.json + safetensors, PEFT or mlx-lm) on
 * arbitrary bytes, read for a small model and, when they read, written back in both formats. */
#include "internal.h"
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ft_adapter_mem(data, size);
    return 0;
}
