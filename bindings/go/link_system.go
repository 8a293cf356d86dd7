//go:build forge_system

package forge

// With the forge_system build tag the package links the libforge that `make install` put on
// the system, found through pkg-config (forge.pc).

/*
#cgo pkg-config: forge
*/
import "C"
