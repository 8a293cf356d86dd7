/* libFuzzer target: session state files (forge_session_load's reading and checks) on arbitrary
 * bytes, for a small model with a sliding-window layer; no device (see ft_state_mem). */
#include "internal.h"
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ft_state_mem(data, size, NULL, 0);
    return 0;
}
