package index

import "unsafe"

// prefetchSlots prefetches the home slot of each key in a key table whose
// slots start at slots: prefetchKeys' loop in assembly, without a call and
// a register reload per key.
//
//go:noescape
func prefetchSlots(slots unsafe.Pointer, shift uint64, keys []uint64)
