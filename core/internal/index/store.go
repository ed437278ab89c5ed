// Record storage and eviction: the slab of (server, key) records, the
// block-key summary, the per-server LRU lists, and the CLOCK budget.

package index

// rec is one (server, key) residency record: 32 bytes. The global budget is
// enforced with a CLOCK sweep over the slab (one "referenced" bit per
// record) rather than a doubly linked LRU list, which would cost 8 bytes
// more per record and two pointer rewrites per touch.
type rec struct {
	key    uint64
	next   uint32 // next record with the same key
	sprev  uint32 // per-server LRU, towards most recent
	snext  uint32 // per-server LRU, towards least recent
	spec   uint32 // speculative expiry in ticks since epoch; 0 = none
	server uint16 // freeSrv when the slot is free
	cnt    [NumTiers]uint8
	ref    uint8 // CLOCK referenced bit
}

// empty reports whether no tier holds a copy.
func (rc *rec) empty() bool { return rc.cnt == [NumTiers]uint8{} }

// keyVal is the block-key table's value: the head of the key's record
// chain and a summary of the chain. The summary lets the routing walk skip
// the chain in the common case (every copy of the block confirmed on GPU
// by events, on servers numbered below 64): the walk then needs the key's
// table slot alone, and a cold prompt's blocks cost one cache miss each
// instead of one per record.
type keyVal struct {
	head uint32
	// loose counts the chain's records that hold the block in a way gpu
	// does not capture (a lower tier only, speculation, server >= 64);
	// the walk reads the chain when it is not zero.
	loose uint32
	// gpu has bit s set when server s (< 64) holds the block on GPU.
	gpu uint64
}

// Record classes for the key summary (keyVal).
const (
	classNone  = iota // holds nothing: invisible to a match
	classGPU          // in keyVal.gpu
	classLoose        // counted in keyVal.loose
)

// class is how the key summary counts rc.
func (rc *rec) class() uint8 {
	switch {
	case rc.cnt[GPU] > 0 && rc.server < 64:
		return classGPU
	case rc.cnt[GPU] > 0 || rc.cnt[CPU] > 0 || rc.cnt[SSD] > 0 || rc.spec != 0:
		return classLoose
	}
	return classNone
}

// addClass adds (delta 1) or removes (delta -1) rc's class c to kv.
func (kv *keyVal) addClass(rc *rec, c uint8, delta int) {
	switch c {
	case classGPU:
		if delta > 0 {
			kv.gpu |= 1 << rc.server
		} else {
			kv.gpu &^= 1 << rc.server
		}
	case classLoose:
		kv.loose += uint32(delta)
	}
}

// reclass updates rc's key summary after rc changed from class was.
func (ix *Index) reclass(rc *rec, was uint8) {
	now := rc.class()
	if now == was {
		return
	}
	if kv := ix.keys.ref(rc.key); kv != nil {
		kv.addClass(rc, was, -1)
		kv.addClass(rc, now, 1)
	}
}

const (
	pageShift = 14
	pageSize  = 1 << pageShift
)

func (ix *Index) at(r uint32) *rec { return &ix.pages[r>>pageShift][r&(pageSize-1)] }

// eng is the engine hash last bridged to record r (0 = none). It lives in
// pages parallel to the records, out of the routing walk's way: a record
// is then 32 bytes, two per cache line, none straddling one.
func (ix *Index) eng(r uint32) *uint64 { return &ix.engines[r>>pageShift][r&(pageSize-1)] }

func (ix *Index) incr(r uint32, t Tier) {
	rc := ix.at(r)
	if c := &rc.cnt[t]; *c < ^uint8(0) {
		was := rc.class()
		*c++
		ix.reclass(rc, was)
	}
}

func (ix *Index) findOrCreate(id ServerID, s *server, key uint64) uint32 {
	head := nilRec
	kv := ix.keys.ref(key)
	if kv != nil {
		head = kv.head
		for r := head; r != nilRec; r = ix.at(r).next {
			if ix.at(r).server == uint16(id) {
				return r
			}
		}
	}
	var r uint32
	if ix.free != nilRec {
		r = ix.free
		ix.free = ix.at(r).next
		ix.nfree--
	} else {
		r = ix.nrecs
		if int(r>>pageShift) == len(ix.pages) {
			ix.pages = append(ix.pages, make([]rec, pageSize))
			ix.engines = append(ix.engines, make([]uint64, pageSize))
		}
		ix.nrecs++
	}
	*ix.at(r) = rec{key: key, next: head, server: uint16(id), sprev: nilRec, snext: s.head, ref: 1}
	*ix.eng(r) = 0
	// The new record holds nothing yet (classNone): the summary stands.
	if kv != nil {
		kv.head = r // no Put or Delete since ref
	} else {
		ix.keys.Put(key, keyVal{head: r})
	}
	if s.head != nilRec {
		ix.at(s.head).sprev = r
	}
	s.head = r
	if s.tail == nilRec {
		s.tail = r
	}
	s.n++
	return r
}

// touch marks a record recently used: referenced for the CLOCK sweep and
// moved to the most-recent end of its server's list.
func (ix *Index) touch(r uint32, s *server) {
	rc := ix.at(r)
	rc.ref = 1
	if s.head != r {
		ix.at(rc.sprev).snext = rc.snext
		if rc.snext != nilRec {
			ix.at(rc.snext).sprev = rc.sprev
		} else {
			s.tail = rc.sprev
		}
		rc.sprev = nilRec
		rc.snext = s.head
		ix.at(s.head).sprev = r
		s.head = r
	}
}

func (ix *Index) freeRec(r uint32, s *server) {
	rc := ix.at(r)
	// Unlink from the key chain and its summary (a live record is always
	// linked under its key).
	kv := ix.keys.ref(rc.key)
	kv.addClass(rc, rc.class(), -1)
	if kv.head == r {
		if rc.next == nilRec {
			ix.keys.Delete(rc.key)
		} else {
			kv.head = rc.next
		}
	} else {
		for p := kv.head; p != nilRec; p = ix.at(p).next {
			if ix.at(p).next == r {
				ix.at(p).next = rc.next
				break
			}
		}
	}
	// Server LRU.
	if rc.sprev != nilRec {
		ix.at(rc.sprev).snext = rc.snext
	} else {
		s.head = rc.snext
	}
	if rc.snext != nilRec {
		ix.at(rc.snext).sprev = rc.sprev
	} else {
		s.tail = rc.sprev
	}
	s.n--
	if e := ix.eng(r); *e != 0 {
		if b, ok := s.bridge.Get(*e); ok && b == r {
			s.bridge.Delete(*e)
		}
	}
	*rc = rec{server: freeSrv, next: ix.free}
	*ix.eng(r) = 0
	ix.free = r
	ix.nfree++
}

// enforceBudget evicts records with the CLOCK algorithm until the budget
// holds: the hand sweeps the slab, sparing (and clearing) referenced
// records once, evicting the first unreferenced one.
func (ix *Index) enforceBudget() {
	for int(ix.nrecs)-ix.nfree > ix.cfg.MaxEntries {
		if ix.hand >= ix.nrecs {
			ix.hand = 0
		}
		r := ix.hand
		ix.hand++
		rc := ix.at(r)
		if rc.server == freeSrv {
			continue
		}
		if rc.ref != 0 {
			rc.ref = 0
			continue
		}
		ix.freeRec(r, ix.servers[rc.server])
		ix.evictedBudget++
	}
}

func (ix *Index) enforceCapacity(s *server) {
	if s.opts.Capacity <= 0 {
		return
	}
	for s.n > s.opts.Capacity && s.tail != nilRec {
		ix.freeRec(s.tail, s)
		ix.evictedCapacity++
	}
}
