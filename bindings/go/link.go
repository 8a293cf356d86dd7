//go:build !forge_system

package forge

// By default the package links the static library that `make lib` builds in the checkout's
// build/ directory, so programs and tests need no LD_LIBRARY_PATH. Build with
// `-tags forge_system` to link an installed libforge (`make install`) through pkg-config.

/*
#cgo CFLAGS: -I${SRCDIR}/../..
#cgo LDFLAGS: ${SRCDIR}/../../build/libforge.a -lcjson -lpcre2-8 -lutf8proc -lpthread -ldl -lm
*/
import "C"
