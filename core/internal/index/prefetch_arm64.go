package index

import "unsafe"

// prefetch asks the CPU to bring p's cache line in without waiting for it.
// Unlike a load, a prefetch retires at once, so a miss does not hold up
// the instructions behind it (Go exposes no prefetch to user code).
//
//go:noescape
func prefetch(p unsafe.Pointer)
