//go:build kvrdebug

package main

/*
#include <stdint.h>
*/
import "C"

import "github.com/kvc-router/kvc-router/core/kvcrouter"

var sink map[string]int

// kvr_debug_panic exists only in the test build of the library
// (go build -tags kvrdebug, `make testlib`): the release .so does not export
// it. Tests use it to prove that a panic is recovered, reported as
// KVR_INTERNAL and poisons the handle (kinds 0-3), and that a panic in a
// collector goroutine is recovered there without ending the process or
// poisoning anything (kind 4: the next KV-event batch a subscriber applies
// panics; kind 5: the next /metrics scrape panics; both return KVR_OK).
//
//export kvr_debug_panic
func kvr_debug_panic(h C.uint64_t, kind C.int32_t, errOut **C.char) (code C.int32_t) {
	defer recoverExport("kvr_debug_panic", h, &code, errOut)
	clearOut(errOut)
	if h != 0 {
		if _, err := lookup(uint64(h)); err != nil {
			return fail(errOut, err)
		}
	}
	switch kind {
	case 0:
		panic("kvr_debug_panic: requested panic")
	case 1:
		sink["x"] = 1 // write to a nil map
	case 2:
		var p *instance
		_ = p.maxTokens // nil dereference
	case 3:
		var a []int
		i := int(kind)
		_ = a[i] // index out of range
	case 4:
		kvcrouter.ArmCollectorPanic(kvcrouter.PanicEvents)
		return codeOK
	case 5:
		kvcrouter.ArmCollectorPanic(kvcrouter.PanicScrape)
		return codeOK
	}
	return fail(errOut, errf(codeInvalidArgument, "kvr_debug_panic: unknown kind %d (allowed: 0..5)", int32(kind)))
}
