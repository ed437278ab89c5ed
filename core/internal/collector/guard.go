package collector

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"
)

// Every collector goroutine runs its work through guard: a panic (a decoder
// or index bug reached by network input) must not end the host process,
// which is a Ray actor serving every rollout. The goroutine counts it,
// marks itself failed in status, and restarts after a backoff while
// routing goes on with what the router already knows.

// panics counts panics recovered in collector goroutines, process-wide.
var panics atomic.Uint64

// Panics returns how many panics collector goroutines have recovered.
func Panics() uint64 { return panics.Load() }

// PanicError is a recovered panic with the stack it unwound.
type PanicError struct {
	Value any
	Stack string
}

func (e *PanicError) Error() string { return fmt.Sprintf("recovered panic: %v", e.Value) }

// guard runs fn; a panic in it is recovered, counted and returned.
func guard(fn func()) (perr *PanicError) {
	defer func() {
		if v := recover(); v != nil {
			if pe, ok := v.(*PanicError); ok {
				perr = pe // re-raised (replayRange): counted where first recovered
				return
			}
			panics.Add(1)
			perr = &PanicError{Value: v, Stack: string(debug.Stack())}
		}
	}()
	fn()
	return nil
}

// maxPanicBackoff caps the restart delay after repeated panics.
const maxPanicBackoff = 30 * time.Second

// panicBackoff is the restart delay after the n-th consecutive panic
// (n >= 1): base, doubling, at most maxPanicBackoff.
func panicBackoff(base time.Duration, n int) time.Duration {
	if base <= 0 {
		base = 100 * time.Millisecond
	}
	return min(base<<min(n-1, 16), maxPanicBackoff)
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Points where the kvrdebug build can inject a panic (debug_on.go).
const (
	// PanicEvents: the next KV-event batch a subscriber applies.
	PanicEvents = iota
	// PanicScrape: the next /metrics scrape.
	PanicScrape
	numPanicPoints
)
