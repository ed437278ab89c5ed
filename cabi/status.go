package main

/*
#include <stdint.h>
#include <stdlib.h>
*/
import "C"

import (
	"fmt"
	"os"
	"runtime/debug"
	"sync/atomic"
	"unsafe"

	"github.com/kvc-router/kvc-router/core/kvcrouter"
)

// Status codes returned by every export. kvcrouter.h is their definition;
// TestHeaderMatchesGo checks these values (and abiVersion) against it. The
// library decides them (kvcrouter.Code); this shell only adds its own for
// bad pointers and lengths.
const (
	codeOK              = kvcrouter.CodeOK
	codeInvalidArgument = kvcrouter.CodeInvalidArgument
	codeNotFound        = kvcrouter.CodeNotFound
	codeInvalidState    = kvcrouter.CodeInvalidState
	codeInternal        = kvcrouter.CodeInternal
	codePoisoned        = kvcrouter.CodePoisoned
	codeNoServers       = kvcrouter.CodeNoServers
	codeInvalidConfig   = kvcrouter.CodeInvalidConfig
	codeHeld            = kvcrouter.CodeHeld
	codeQueueFull       = kvcrouter.CodeQueueFull
)

// errf makes an error that carries its status code.
func errf(code int32, format string, args ...any) error {
	return &kvcrouter.CodedError{Code: kvcrouter.Code(code), Msg: fmt.Sprintf(format, args...)}
}

// codeOf maps a Go error to a status code.
func codeOf(err error) int32 { return int32(kvcrouter.ErrorCode(err)) }

// setErr stores a C copy of msg in *out when the caller asked for messages.
func setErr(out **C.char, msg string) {
	if out != nil {
		*out = C.CString(msg)
	}
}

// fail reports err through out and returns its status code.
func fail(out **C.char, err error) C.int32_t {
	setErr(out, err.Error())
	return C.int32_t(codeOf(err))
}

// clearOut resets an optional output string so callers never see garbage.
func clearOut(out **C.char) {
	if out != nil {
		*out = nil
	}
}

var panics atomic.Uint64

// recoverExport is deferred by every export. It turns a panic into
// KVR_INTERNAL, poisons the handle involved (if any), and prints the stack
// to stderr once per panic. It must be deferred directly so recover works.
func recoverExport(name string, h C.uint64_t, code *C.int32_t, errOut **C.char) {
	p := recover()
	if p == nil {
		return
	}
	panics.Add(1)
	msg := fmt.Sprintf("internal error: Go panic in %s: %v", name, p)
	fmt.Fprintf(os.Stderr, "kvc-router: %s\n%s\n", msg, debug.Stack())
	if inst, err := lookup(uint64(h)); err == nil {
		inst.poison(msg)
		msg += "; the router handle is poisoned: close it and create a new one"
	}
	if errOut != nil {
		if *errOut != nil {
			C.free(unsafe.Pointer(*errOut))
		}
		*errOut = C.CString(msg)
	}
	*code = codeInternal
}
