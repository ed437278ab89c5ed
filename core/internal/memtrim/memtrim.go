// Package memtrim returns memory to the operating system after an input far
// larger than usual (a multi-megabyte KV-event batch) has been processed.
//
// Go keeps freed heap pages mapped and its background scavenger only
// releases them down to the heap goal of the next GC cycle; an idle router
// runs no GC cycle, so after one 4M-token event the process kept ~40 MiB
// of freed heap (and its decode buffers, now dropped) indefinitely. Note
// arms one debug.FreeOSMemory (a forced GC that releases every free page)
// shortly after a large input, at most once per MinInterval: a flood of
// large inputs costs one forced GC per interval, not one per input.
package memtrim

import (
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/clock"
)

// Defaults (see Configure).
const (
	// DefaultThreshold is the input size that arms a trim.
	DefaultThreshold = 4 << 20
	// DefaultDelay lets a burst of large inputs finish first.
	DefaultDelay = time.Second
	// DefaultMinInterval bounds forced GCs under a flood of large inputs.
	DefaultMinInterval = 10 * time.Second
)

var (
	mu          sync.Mutex
	threshold   = DefaultThreshold
	delay       = DefaultDelay
	minInterval = DefaultMinInterval
	armed       bool
	last        time.Time
	// clk schedules trims (tests substitute a clock.Fake).
	clk clock.Clock = clock.Real{}

	trims atomic.Uint64
	noted atomic.Uint64
)

// Configure replaces the defaults (tests); zero keeps a value.
func Configure(thresholdBytes int, wait, interval time.Duration) {
	mu.Lock()
	defer mu.Unlock()
	if thresholdBytes > 0 {
		threshold = thresholdBytes
	}
	if wait > 0 {
		delay = wait
	}
	if interval > 0 {
		minInterval = interval
	}
}

// Note reports a processed input of n bytes; from the threshold on it arms
// one trim (unless one is already pending). Cheap when n is small.
func Note(n int) {
	mu.Lock()
	defer mu.Unlock()
	if n < threshold {
		return
	}
	noted.Add(1)
	if armed {
		return
	}
	armed = true
	wait := delay
	if next := last.Add(minInterval).Sub(clk.Now()); next > wait {
		wait = next
	}
	clk.AfterFunc(wait, trim)
}

func trim() {
	debug.FreeOSMemory()
	mu.Lock()
	armed, last = false, clk.Now()
	mu.Unlock()
	trims.Add(1)
}

// Stats is what status reports.
type Stats struct {
	// LargeInputs counts inputs at or above the threshold.
	LargeInputs uint64 `json:"large_inputs"`
	// Trims counts memory returns (debug.FreeOSMemory calls).
	Trims uint64 `json:"trims"`
}

// Snapshot reads the counters.
func Snapshot() Stats { return Stats{LargeInputs: noted.Load(), Trims: trims.Load()} }

// UseClock makes trims schedule on c, with no trim pending and none done in
// its time, until the returned restore is called (tests).
func UseClock(c clock.Clock) (restore func()) {
	mu.Lock()
	defer mu.Unlock()
	oldClk, oldArmed, oldLast := clk, armed, last
	clk, armed, last = c, false, time.Time{}
	return func() {
		mu.Lock()
		defer mu.Unlock()
		clk, armed, last = oldClk, oldArmed, oldLast
	}
}
