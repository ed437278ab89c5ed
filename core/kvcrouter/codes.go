package kvcrouter

import (
	"errors"

	"github.com/kvc-router/kvc-router/core/internal/collector"
	"github.com/kvc-router/kvc-router/core/internal/index"
	"github.com/kvc-router/kvc-router/core/internal/kvevents"
	"github.com/kvc-router/kvc-router/core/internal/metrics"
	"github.com/kvc-router/kvc-router/core/internal/router"
)

// Code is the status a C caller sees for an error (kvcrouter.h's KVR_*).
// The constants are untyped so the C shell can return them as C ints.
// It is decided here, at the package boundary, because only this package
// knows which internal failures are the caller's input and which are bugs;
// the C shell maps nothing itself.
type Code int32

const (
	CodeOK              = 0
	CodeInvalidArgument = 1
	CodeNotFound        = 2
	CodeInvalidState    = 3
	CodeInternal        = 4 // a recovered Go panic, or an error no case classifies
	CodePoisoned        = 5 // the handle saw an earlier panic
	CodeNoServers       = 6
	CodeInvalidConfig   = 7
	CodeHeld            = 8 // held by admission (not an error)
	CodeQueueFull       = 9 // admission.max_queue requests are already held
)

// CodedError is an error that carries its own Code.
type CodedError struct {
	Code Code
	Msg  string
}

func (e *CodedError) Error() string { return e.Msg }

// ErrorCode classifies err. Every error a caller can cause maps to a
// specific code; anything else is a library bug (CodeInternal).
func ErrorCode(err error) Code {
	var ce *CodedError
	switch {
	case err == nil:
		return CodeOK
	case errors.As(err, &ce):
		return ce.Code
	case errors.Is(err, ErrClosed):
		return CodeInvalidState
	case errors.Is(err, router.ErrBadServerID), errors.Is(err, router.ErrPromptTooLong), errors.Is(err, router.ErrTicketHeld):
		return CodeInvalidArgument
	case errors.Is(err, router.ErrNoServers):
		return CodeNoServers
	case errors.Is(err, router.ErrQueueFull):
		return CodeQueueFull
	case errors.Is(err, router.ErrConfig), errors.Is(err, collector.ErrConfig), errors.Is(err, ErrConfig):
		return CodeInvalidConfig
	case errors.Is(err, collector.ErrUnknownServer), errors.Is(err, index.ErrUnknownServer):
		return CodeNotFound
	case errors.Is(err, metrics.ErrMalformed), errors.Is(err, metrics.ErrTooLarge), errors.Is(err, metrics.ErrNoMetrics),
		errors.Is(err, kvevents.ErrMalformed), errors.Is(err, index.ErrBadEvent), errors.Is(err, index.ErrTooManyServer):
		return CodeInvalidArgument
	}
	return CodeInternal
}
