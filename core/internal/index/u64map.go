package index

import "unsafe"

// u64table maps uint64 keys to values of type V with open addressing
// (linear probing, backward-shift deletion); u64map is its uint32 form
// (bridges), the block-key table stores a keyVal. It replaces Go maps on the index's
// hot paths because:
//   - a hit touches one 16-byte slot, where a Go map reads a directory, a
//     control word and a slot group (ingest spent half its time in map
//     probing);
//   - its memory is exact (len(slots) * 16), so Status.Bytes is a count,
//     not a guess about the runtime's table layout;
//   - it never allocates except when it doubles.
//
// Keys are spread with Fibonacci hashing: block keys are already uniform,
// but engine hashes need not be (test engines number blocks 1, 2, 3...).
// Key 0 marks an empty slot, so it is kept aside.
type u64table[V any] struct {
	slots []u64slot[V]
	shift uint8 // 64 - log2(len(slots))
	n     int   // keys stored in slots (key 0 excluded)
	zero  bool
	zval  V
}

type u64slot[V any] struct {
	k uint64
	v V
}

// u64map maps uint64 keys to uint32 values.
type u64map = u64table[uint32]

const (
	u64mapMinSlots = 8
	fib            = 0x9E3779B97F4A7C15
	// u64slotBytes is the size of one u64map slot (12 bytes of data,
	// padded).
	u64slotBytes = 16
)

func (m *u64table[V]) home(k uint64) uint64 { return (k * fib) >> m.shift }

// Len returns the number of keys.
func (m *u64table[V]) Len() int {
	if m.zero {
		return m.n + 1
	}
	return m.n
}

// Bytes returns the memory held by the table.
func (m *u64table[V]) Bytes() int64 { return int64(len(m.slots)) * int64(unsafe.Sizeof(u64slot[V]{})) }

// Get returns the value stored under k.
func (m *u64table[V]) Get(k uint64) (V, bool) {
	var none V
	if k == 0 {
		return m.zval, m.zero
	}
	if m.n == 0 {
		return none, false
	}
	mask := uint64(len(m.slots) - 1)
	for i := m.home(k); ; i = (i + 1) & mask {
		s := &m.slots[i]
		if s.k == k {
			return s.v, true
		}
		if s.k == 0 {
			return none, false
		}
	}
}

// ref returns a pointer to k's value, nil when k is absent. It is valid
// until the next Put or Delete.
func (m *u64table[V]) ref(k uint64) *V {
	if k == 0 {
		if m.zero {
			return &m.zval
		}
		return nil
	}
	if m.n == 0 {
		return nil
	}
	mask := uint64(len(m.slots) - 1)
	for i := m.home(k); ; i = (i + 1) & mask {
		s := &m.slots[i]
		if s.k == k {
			return &s.v
		}
		if s.k == 0 {
			return nil
		}
	}
}

// peek loads k's home slot and returns its key: a cache-warming read whose
// result only needs to be used somewhere.
func (m *u64table[V]) peek(k uint64) uint64 {
	if len(m.slots) == 0 {
		return 0
	}
	return m.slots[m.home(k)].k
}

// Put stores v under k.
func (m *u64table[V]) Put(k uint64, v V) {
	if k == 0 {
		m.zero, m.zval = true, v
		return
	}
	// Grow at 3/4 full: linear probing stays short (about 2.5 probes
	// for a hit, 8.5 for a miss at the worst).
	if (m.n+1)*4 > len(m.slots)*3 {
		m.grow()
	}
	mask := uint64(len(m.slots) - 1)
	for i := m.home(k); ; i = (i + 1) & mask {
		s := &m.slots[i]
		if s.k == k {
			s.v = v
			return
		}
		if s.k == 0 {
			s.k, s.v = k, v
			m.n++
			return
		}
	}
}

// Delete removes k if present.
func (m *u64table[V]) Delete(k uint64) {
	if k == 0 {
		var none V
		m.zero, m.zval = false, none
		return
	}
	if m.n == 0 {
		return
	}
	mask := uint64(len(m.slots) - 1)
	i := m.home(k)
	for {
		s := &m.slots[i]
		if s.k == k {
			break
		}
		if s.k == 0 {
			return
		}
		i = (i + 1) & mask
	}
	// Backward shift: pull later members of the probe run into the hole
	// unless their home lies cyclically in (hole, j].
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := m.slots[j]
		if s.k == 0 {
			break
		}
		h := m.home(s.k)
		if (j-h)&mask >= (j-i)&mask {
			m.slots[i] = s
			i = j
		}
	}
	m.slots[i] = u64slot[V]{}
	m.n--
	if m.n == 0 && len(m.slots) > 1024 {
		// Release a big table once emptied (a cleared server).
		*m = u64table[V]{zero: m.zero, zval: m.zval}
	}
}

// Reset drops every key and the table's memory.
func (m *u64table[V]) Reset() { *m = u64table[V]{} }

func (m *u64table[V]) grow() {
	size := u64mapMinSlots
	if len(m.slots) > 0 {
		size = 2 * len(m.slots)
	}
	old := m.slots
	m.slots = make([]u64slot[V], size)
	m.shift = uint8(64 - log2(size))
	m.n = 0
	mask := uint64(size - 1)
	for _, s := range old {
		if s.k == 0 {
			continue
		}
		i := m.home(s.k)
		for m.slots[i].k != 0 {
			i = (i + 1) & mask
		}
		m.slots[i] = s
		m.n++
	}
}

func log2(n int) int {
	l := 0
	for 1<<l < n {
		l++
	}
	return l
}
