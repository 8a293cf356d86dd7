package forge

/*
#include <stdint.h>
#include "forge.h"

// Defined by callback.go's //export.
extern int goForgeDiscover(uintptr_t handle, forge_discovered_model *model);

static int forge_go_on_model(void *user_data, const forge_discovered_model *model) {
	return goForgeDiscover((uintptr_t)user_data, (forge_discovered_model *)model);
}

static forge_status forge_go_discover(const char *dir, const forge_discover_params *params, uintptr_t handle,
                                      char *errmsg, size_t errmsg_size) {
	return forge_discover(dir, params, forge_go_on_model, (void *)handle, errmsg, errmsg_size);
}
*/
import "C"

import "runtime/cgo"

// DiscoveredModel is one model Discover found (forge_discovered_model).
type DiscoveredModel struct {
	Path         string // the model directory or .gguf file
	Format       string // "safetensors" or "gguf"
	Architecture string // as the config writes it, supported or not ("mamba"); "" when unknown
	WeightDType  string // dominant storage type of the matrices ("f32", "bf16", "q4_k+", "mlx4")
	QuantBits    int    // that type's nominal bits; 0 when unknown
	NumParams    uint64 // parameters; 0 when no header could be read
	NumFiles     int    // weight files
	Bytes        uint64 // their size on disk
	DeviceBytes  uint64 // device memory LoadModel plans for the weights (0 with quick or when not loadable)
	Loadable     bool   // LoadModel should succeed (given the memory and a readable tokenizer)
	Err          error  // when not loadable: the *Error LoadModel would return
}

func discovered(m *C.forge_discovered_model) DiscoveredModel {
	d := DiscoveredModel{
		Path: C.GoString(m.path), Format: C.GoString(m.format_name), Architecture: C.GoString(m.architecture),
		WeightDType: C.GoString(m.weight_dtype), QuantBits: int(m.quant_bits), NumParams: uint64(m.n_params),
		NumFiles: int(m.n_files), Bytes: uint64(m.bytes), DeviceBytes: uint64(m.device_bytes), Loadable: m.loadable != 0,
	}
	if !d.Loadable {
		d.Err = newError(m.status, m.reason)
		if d.Err == nil {
			d.Err = &Error{Status: StatusUnsupported, Message: C.GoString(m.reason)}
		}
	}
	return d
}

// Discover searches the directory tree under dir (at most maxDepth levels below it; forge's
// default is 8) for models, as go-mlx's Discover does: a directory holding config.json and
// *.safetensors is one model, each .gguf file is one. Nothing is loaded and no device is
// needed: headers are read, the config parsed and the tensors checked as LoadModel does
// (quick: headers and config only), so a model that cannot load is reported with its Err.
// Models come in path order. It fails with StatusIO when dir is not a readable directory.
func Discover(dir string, maxDepth int, quick bool) ([]DiscoveredModel, error) {
	if abiErr != nil {
		return nil, abiErr
	}
	var a cmem
	defer a.free()
	p := (*C.forge_discover_params)(a.alloc(C.sizeof_forge_discover_params))
	*p = C.forge_discover_default_params()
	p.max_depth = C.int(maxDepth)
	p.quick = cbool(quick)
	var found []DiscoveredModel
	h := cgo.NewHandle(&found)
	defer h.Delete()
	errbuf := (*C.char)(a.alloc(512))
	st := C.forge_go_discover(a.str(dir), p, C.uintptr_t(h), errbuf, 512)
	if st != C.FORGE_OK {
		return nil, newError(st, errbuf)
	}
	return found, nil
}
