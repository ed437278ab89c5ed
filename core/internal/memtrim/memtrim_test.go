package memtrim

import (
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/clock"
)

// useFakeClock makes memtrim schedule on a fake clock with a fresh state
// (no trim pending, none done) for one test.
func useFakeClock(t *testing.T) *clock.Fake {
	t.Helper()
	fc := clock.NewFake(time.Unix(1_700_000_000, 0))
	restore := UseClock(fc)
	t.Cleanup(func() {
		restore()
		Configure(DefaultThreshold, DefaultDelay, DefaultMinInterval)
	})
	return fc
}

// Small inputs never trim; a burst of large ones trims once, Delay after
// the first; a large input within MinInterval of that trim is deferred to
// the interval's end, not dropped.
func TestNoteArmsOneTrimPerInterval(t *testing.T) {
	fc := useFakeClock(t)
	const delay, interval = 20 * time.Millisecond, 300 * time.Millisecond
	Configure(1000, delay, interval)
	s0 := Snapshot()
	expect := func(step string, trims, large uint64, pending int) {
		t.Helper()
		if got := Snapshot(); got.Trims != s0.Trims+trims || got.LargeInputs != s0.LargeInputs+large || fc.Pending() != pending {
			t.Fatalf("%s: %+v (from %+v), %d trims pending; want +%d trims, +%d large, %d pending",
				step, got, s0, fc.Pending(), trims, large, pending)
		}
	}
	for i := 0; i < 100; i++ {
		Note(999)
	}
	fc.Advance(time.Hour)
	expect("small inputs", 0, 0, 0)

	for i := 0; i < 50; i++ {
		Note(1000)
	}
	expect("burst armed", 0, 50, 1)
	fc.Advance(delay - time.Nanosecond)
	expect("burst before its delay", 0, 50, 1)
	fc.Advance(time.Nanosecond)
	expect("burst after its delay", 1, 50, 0)

	fc.Advance(interval / 2)
	Note(5000) // within the interval: deferred to its end
	expect("second armed", 1, 51, 1)
	fc.Advance(interval/2 - time.Nanosecond)
	expect("second before the interval ends", 1, 51, 1)
	fc.Advance(time.Nanosecond)
	expect("second at the interval's end", 2, 51, 0)

	fc.Advance(2 * interval)
	Note(5000) // long after: only the delay
	fc.Advance(delay)
	expect("third after its delay", 3, 52, 0)
}
