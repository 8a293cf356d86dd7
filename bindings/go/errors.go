package forge

/*
#include "forge.h"
*/
import "C"

import "errors"

// Status is a forge_status: what a forge call returned. Like syscall.Errno it is itself an
// error, so errors.Is(err, forge.StatusIO) tells whether err is an *Error with that status.
type Status int

// The forge_status codes of forge.h.
const (
	StatusOK              Status = 0  // success
	StatusInvalidArgument Status = 1  // a NULL pointer, an out-of-range value, a misuse of the API
	StatusIO              Status = 2  // a file is missing, unreadable or cannot be mapped
	StatusFormat          Status = 3  // a file is malformed
	StatusUnsupported     Status = 4  // well-formed but not supported (architecture, dtype, no chat format)
	StatusModel           Status = 5  // tensors and config disagree, or state saved from another model
	StatusDevice          Status = 6  // no usable Vulkan device, or a Vulkan call failed
	StatusOutOfMemory     Status = 7  // host or device memory could not be allocated
	StatusLimit           Status = 8  // a planned limit was exceeded (context length, batch)
	StatusBufferTooSmall  Status = 9  // a caller buffer is too small (a bug in these bindings)
	StatusCancelled       Status = 10 // the call was cancelled
)

// String returns the status's C name, as forge_status_name gives it ("FORGE_ERR_IO").
func (s Status) String() string {
	return C.GoString(C.forge_status_name(C.forge_status(s)))
}

// Error returns the status's C name, so that a Status can be the target of errors.Is.
func (s Status) Error() string { return s.String() }

// Error is a failed forge call: its status and the message forge left on the object the call
// was made on (forge_model_errmsg, forge_session_errmsg), which names the file, tensor, field
// or limit at fault.
type Error struct {
	Status  Status // the forge_status the call returned
	Message string // forge's explanation; may be empty
}

// Error returns the message followed by the status's C name.
func (e *Error) Error() string {
	if e.Message == "" {
		return "forge: " + e.Status.String()
	}
	return "forge: " + e.Message + " (" + e.Status.String() + ")"
}

// Is reports whether target is e's Status, so errors.Is(err, forge.StatusUnsupported) works.
func (e *Error) Is(target error) bool {
	s, ok := target.(Status)
	return ok && s == e.Status
}

// ErrClosed is returned by calls on a Model, Session or Trainer that has been closed.
var ErrClosed = errors.New("forge: use of a closed model, session or trainer")

// ErrBusy is returned when a Session or Trainer is used while another call is running on it
// (each belongs to one goroutine at a time; a Model hands each concurrent call its own session).
var ErrBusy = errors.New("forge: session or trainer in use by another call")

func newError(status C.forge_status, msg *C.char) error {
	if status == C.FORGE_OK {
		return nil
	}
	e := &Error{Status: Status(status)}
	if msg != nil {
		e.Message = C.GoString(msg)
	}
	return e
}
