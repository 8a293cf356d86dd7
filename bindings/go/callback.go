package forge

// The token callback forge calls during generation. It lives in its own file because a file
// with //export may only declare C functions in its preamble; the C trampoline that forge
// calls (forge_go_on_token) is defined in forge.go's preamble.

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
