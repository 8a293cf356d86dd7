package forge

/*
#include <stdlib.h>
#include "forge.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// The structs this package hands to forge, as forge.h declared them when the package was
// built, against the linked library's own (forge_struct_size). They differ only when an
// installed libforge (-tags forge_system) is not the one whose forge.h the package was
// compiled with; LoadModel and Devices then fail with this error instead of passing structs
// of the wrong size.
var abiErr = checkABI()

func checkABI() error {
	mirrors := []struct {
		name string
		size C.size_t
	}{
		{"forge_device_info", C.sizeof_forge_device_info},
		{"forge_model_params", C.sizeof_forge_model_params},
		{"forge_memory_stats", C.sizeof_forge_memory_stats},
		{"forge_model_info", C.sizeof_forge_model_info},
		{"forge_discover_params", C.sizeof_forge_discover_params},
		{"forge_discovered_model", C.sizeof_forge_discovered_model},
		{"forge_session_params", C.sizeof_forge_session_params},
		{"forge_special_tokens", C.sizeof_forge_special_tokens},
		{"forge_generate_params", C.sizeof_forge_generate_params},
		{"forge_metrics", C.sizeof_forge_metrics},
		{"forge_batch_item", C.sizeof_forge_batch_item},
		{"forge_batch_result", C.sizeof_forge_batch_result},
		{"forge_chat_message", C.sizeof_forge_chat_message},
		{"forge_tool_call", C.sizeof_forge_tool_call},
		{"forge_tool", C.sizeof_forge_tool},
		{"forge_chat_reply", C.sizeof_forge_chat_reply},
		{"forge_constraint", C.sizeof_forge_constraint},
		{"forge_classify_prompt", C.sizeof_forge_classify_prompt},
		{"forge_classify_params", C.sizeof_forge_classify_params},
		{"forge_classify_result", C.sizeof_forge_classify_result},
		{"forge_embed_params", C.sizeof_forge_embed_params},
		{"forge_embed_info", C.sizeof_forge_embed_info},
		{"forge_rerank_params", C.sizeof_forge_rerank_params},
		{"forge_train_params", C.sizeof_forge_train_params},
		{"forge_train_batch", C.sizeof_forge_train_batch},
		{"forge_train_stats", C.sizeof_forge_train_stats},
	}
	for _, m := range mirrors {
		name := C.CString(m.name)
		got := C.forge_struct_size(name)
		C.free(unsafe.Pointer(name))
		if got != m.size {
			return &Error{Status: StatusUnsupported, Message: fmt.Sprintf(
				"the linked libforge %s has %s of %d bytes; this package was built with forge.h %d.%d.%d, where it is %d bytes",
				Version(), m.name, int(got), C.FORGE_VERSION_MAJOR, C.FORGE_VERSION_MINOR, C.FORGE_VERSION_PATCH, int(m.size))}
		}
	}
	return nil
}

// VersionNumber returns the linked libforge's version as MAJOR*1000000 + MINOR*1000 + PATCH.
func VersionNumber() int { return int(C.forge_version_number()) }
