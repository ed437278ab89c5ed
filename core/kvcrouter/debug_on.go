//go:build kvrdebug

package kvcrouter

import "github.com/kvc-router/kvc-router/core/internal/collector"

// Collector panic points the kvrdebug test build can arm (cabi's
// kvr_debug_panic kinds 4 and 5).
const (
	PanicEvents = collector.PanicEvents
	PanicScrape = collector.PanicScrape
)

// ArmCollectorPanic makes the next pass through point panic, in any router
// of the process: tests use it to prove a collector goroutine survives.
func ArmCollectorPanic(point int) bool { return collector.ArmPanic(point) }
