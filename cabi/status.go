package main

/*
#include <stdint.h>
#include <stdlib.h>
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"sync/atomic"
	"unsafe"

	"github.com/kvc-router/kvc-router/core/collector"
	"github.com/kvc-router/kvc-router/core/index"
	"github.com/kvc-router/kvc-router/core/kvcrouter"
	"github.com/kvc-router/kvc-router/core/kvevents"
	"github.com/kvc-router/kvc-router/core/metrics"
	"github.com/kvc-router/kvc-router/core/router"
)

// Status codes returned by every export. kvcrouter.h is their definition;
// TestHeaderMatchesGo checks these values (and abiVersion) against it.
const (
	codeOK              = 0
	codeInvalidArgument = 1
	codeNotFound        = 2
	codeInvalidState    = 3
	codeInternal        = 4 // a recovered Go panic, or an error no case below classifies
	codePoisoned        = 5 // the handle saw an earlier panic
	codeNoServers       = 6
	codeInvalidConfig   = 7
	codeHeld            = 8 // kvr_acquire_with with submit: held by admission (not an error)
	codeQueueFull       = 9 // admission.max_queue requests are already held
)

// kvrError carries a status code with its message.
type kvrError struct {
	code int32
	msg  string
}

func (e *kvrError) Error() string { return e.msg }

func errf(code int32, format string, args ...any) error {
	return &kvrError{code: code, msg: fmt.Sprintf(format, args...)}
}

// codeOf maps a Go error to a status code.
func codeOf(err error) int32 {
	var ke *kvrError
	switch {
	case err == nil:
		return codeOK
	case errors.As(err, &ke):
		return ke.code
	case errors.Is(err, router.ErrBadServerID):
		return codeInvalidArgument
	case errors.Is(err, router.ErrNoServers):
		return codeNoServers
	case errors.Is(err, router.ErrQueueFull):
		return codeQueueFull
	case errors.Is(err, router.ErrConfig):
		return codeInvalidConfig
	case errors.Is(err, router.ErrPromptTooLong):
		return codeInvalidArgument
	case errors.Is(err, collector.ErrConfig), errors.Is(err, kvcrouter.ErrConfig):
		return codeInvalidConfig
	case errors.Is(err, collector.ErrUnknownServer), errors.Is(err, index.ErrUnknownServer):
		return codeNotFound
	case errors.Is(err, metrics.ErrMalformed), errors.Is(err, metrics.ErrTooLarge), errors.Is(err, metrics.ErrNoMetrics),
		errors.Is(err, kvevents.ErrMalformed), errors.Is(err, index.ErrBadEvent), errors.Is(err, index.ErrTooManyServer):
		return codeInvalidArgument
	}
	// Every error a caller can cause is classified above; anything else is
	// a bug in the library, not in the caller's input.
	return codeInternal
}

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
