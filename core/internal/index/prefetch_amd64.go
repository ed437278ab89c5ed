package index

import "unsafe"

// prefetchSlots prefetches the home slot of each key in a key table whose
// slots start at slots. A prefetch retires at once, unlike a load, so a
// miss does not hold up the instructions behind it; Go exposes no
// prefetch to user code, hence the assembly (one loop, no call per key).
//
//go:noescape
func prefetchSlots(slots unsafe.Pointer, shift uint64, keys []uint64)
