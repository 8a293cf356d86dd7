package forge

// An internal test: it reads abiErr, which the package keeps to itself.

import "testing"

// The package's structs are the linked library's (forge_struct_size), and its version is the
// header's: LoadModel would refuse to run otherwise.
func TestStructsMatchTheLibrary(t *testing.T) {
	if abiErr != nil {
		t.Fatal(abiErr)
	}
	if got, want := VersionNumber(), 1000000*0+1000*1+0; got != want || Version() != "0.1.0" {
		t.Fatalf("VersionNumber() = %d, Version() = %q; want %d, 0.1.0", got, Version(), want)
	}
}
