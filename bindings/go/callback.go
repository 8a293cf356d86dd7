package forge

// The callbacks forge calls into Go: generation's tokens, Discover's models and Prewarm's
// progress. They live in their own file because a file with //export may only declare C
// functions in its preamble; the C trampolines that forge calls (forge_go_on_token,
// forge_go_on_prewarm, forge_go_on_model) are defined in session.go's and discover.go's preambles.

/*
#include <stddef.h>
#include <stdint.h>
#include "forge.h"
*/
import "C"

import "runtime/cgo"

// tokenSink receives the tokens of one generate, chat or batch item.
type tokenSink interface {
	// onToken gets a token id (-1 for the text held back at the end) and its text; it
	// returns non-zero to stop generation.
	onToken(id int32, text string) C.int
}

//export goForgeToken
func goForgeToken(handle C.uintptr_t, token C.int32_t, text *C.char, textLen C.size_t) C.int {
	sink, ok := cgo.Handle(handle).Value().(tokenSink)
	if !ok {
		return 1
	}
	var s string
	if textLen > 0 {
		s = C.GoStringN(text, C.int(textLen))
	}
	return sink.onToken(int32(token), s)
}

//export goForgeDiscover
func goForgeDiscover(handle C.uintptr_t, model *C.forge_discovered_model) C.int {
	found, ok := cgo.Handle(handle).Value().(*[]DiscoveredModel)
	if !ok {
		return 1
	}
	*found = append(*found, discovered(model))
	return 0
}

//export goForgePrewarm
func goForgePrewarm(handle C.uintptr_t, done, total C.int, kernel *C.char) {
	if sink, ok := cgo.Handle(handle).Value().(*prewarmSink); ok {
		sink.onKernel(int(done), int(total), C.GoString(kernel)) // "" for NULL, the end call
	}
}
