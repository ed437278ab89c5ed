package index

import "unsafe"

// prefetchKeys starts loading the key-table slots of keys.
func (ix *Index) prefetchKeys(keys []uint64) {
	if len(ix.keys.slots) == 0 || len(keys) == 0 {
		return
	}
	prefetchSlots(unsafe.Pointer(&ix.keys.slots[0]), uint64(ix.keys.shift&63), keys)
}

// keySlotBytes is the key table's slot size, which prefetchSlots'
// assembly multiplies by (the array lengths below fail to compile if it
// changes).
const keySlotBytes = 24

var (
	_ [keySlotBytes - unsafe.Sizeof(u64slot[keyVal]{})]struct{}
	_ [unsafe.Sizeof(u64slot[keyVal]{}) - keySlotBytes]struct{}
)
