//go:build !amd64

package index

import "unsafe"

// prefetchSlots prefetches the home slot of each key in a key table whose
// slots start at slots.
func prefetchSlots(slots unsafe.Pointer, shift uint64, keys []uint64) {
	for _, k := range keys {
		prefetch(unsafe.Add(slots, ((k*fib)>>shift)*keySlotBytes))
	}
}
