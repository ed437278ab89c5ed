//go:build kvrdebug

package collector

import "sync/atomic"

var armed [numPanicPoints]atomic.Int64

// ArmPanic makes the next pass through point (PanicEvents, PanicScrape)
// panic, in any router of the process. Only the kvrdebug test build has
// it (cabi's kvr_debug_panic kinds 4 and 5): tests use it to prove that a
// collector goroutine survives a panic.
func ArmPanic(point int) bool {
	if point < 0 || point >= numPanicPoints {
		return false
	}
	armed[point].Add(1)
	return true
}

func debugPanic(point int) {
	a := &armed[point]
	for {
		n := a.Load()
		if n <= 0 {
			return
		}
		if a.CompareAndSwap(n, n-1) {
			panic("kvr_debug_panic: injected collector panic")
		}
	}
}
