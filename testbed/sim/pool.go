package sim

// gpuBlock is one physical KV block of the GPU pool.
type gpuBlock struct {
	hash  uint64 // internal chained hash, valid when cached
	ehash uint64 // engine (event) hash, valid when cached
	ref   int32  // number of running requests holding the block
	// prev/next link the free queue (LRU order); -1 when not queued.
	prev, next int32
	// same links blocks that carry the same hash (vLLM does not deduplicate).
	same   int32
	cached bool
}

// gpuPool is vLLM's block pool: ref-counted blocks, a free queue in LRU order
// (head evicted first) that also holds cached-but-unreferenced blocks, and a
// hash -> block map for prefix lookups. Index n is the free-queue sentinel.
type gpuPool struct {
	b       []gpuBlock
	n       int32
	numFree int
	cached  int
	byHash  map[uint64]int32
}

func newGPUPool(n int) *gpuPool {
	p := &gpuPool{b: make([]gpuBlock, n+1), n: int32(n), byHash: make(map[uint64]int32, n)}
	s := p.n
	p.b[s].prev, p.b[s].next = s, s
	for i := int32(0); i < p.n; i++ {
		p.b[i].same = -1
		p.b[i].prev, p.b[i].next = -1, -1
		p.pushTail(i)
	}
	return p
}

func (p *gpuPool) pushTail(id int32) {
	s := p.n
	last := p.b[s].prev
	p.b[id].prev, p.b[id].next = last, s
	p.b[last].next = id
	p.b[s].prev = id
	p.numFree++
}

func (p *gpuPool) unlink(id int32) {
	b := &p.b[id]
	p.b[b.prev].next = b.next
	p.b[b.next].prev = b.prev
	b.prev, b.next = -1, -1
	p.numFree--
}

// lookup returns a cached block with the hash, or -1.
func (p *gpuPool) lookup(h uint64) int32 {
	if id, ok := p.byHash[h]; ok {
		return id
	}
	return -1
}

// touch takes a reference on a (cached) block, pulling it out of the free queue.
func (p *gpuPool) touch(id int32) {
	if p.b[id].ref == 0 {
		p.unlink(id)
	}
	p.b[id].ref++
}

// release drops a reference; an unreferenced block joins the free queue tail.
func (p *gpuPool) release(id int32) {
	b := &p.b[id]
	b.ref--
	if b.ref == 0 {
		p.pushTail(id)
	} else if b.ref < 0 {
		panic("sim: block refcount below zero")
	}
}

// popFree takes the LRU free block. If it was cached it is uncached and
// evicted reports its hashes. The caller guarantees numFree > 0.
func (p *gpuPool) popFree() (id int32, evicted bool, h, eh uint64) {
	id = p.b[p.n].next
	p.unlink(id)
	b := &p.b[id]
	if b.cached {
		evicted, h, eh = true, b.hash, b.ehash
		p.uncache(id)
	}
	b.ref = 1
	return id, evicted, h, eh
}

// cache registers a block under a hash (duplicates allowed; newest first).
func (p *gpuPool) cache(id int32, h, eh uint64) {
	b := &p.b[id]
	if b.cached {
		panic("sim: caching an already cached block")
	}
	b.cached, b.hash, b.ehash = true, h, eh
	if head, ok := p.byHash[h]; ok {
		b.same = head
	} else {
		b.same = -1
	}
	p.byHash[h] = id
	p.cached++
}

func (p *gpuPool) uncache(id int32) {
	b := &p.b[id]
	head := p.byHash[b.hash]
	if head == id {
		if b.same >= 0 {
			p.byHash[b.hash] = b.same
		} else {
			delete(p.byHash, b.hash)
		}
	} else {
		for cur := head; cur >= 0; cur = p.b[cur].same {
			if p.b[cur].same == id {
				p.b[cur].same = b.same
				break
			}
		}
	}
	b.same = -1
	b.cached = false
	p.cached--
}

// tierEntry is one block resident in a CPU or SSD tier.
type tierEntry struct {
	hash, ehash uint64
	prev, next  int32
	pinned      bool
}

// tier is an LRU set of block hashes with fixed capacity (one medium).
type tier struct {
	medium string
	e      []tierEntry // index cap is the sentinel
	sent   int32
	free   []int32
	m      map[uint64]int32
}

func newTier(medium string, capacity int) *tier {
	t := &tier{medium: medium, e: make([]tierEntry, capacity+1), sent: int32(capacity), m: make(map[uint64]int32, capacity)}
	t.e[t.sent].prev, t.e[t.sent].next = t.sent, t.sent
	t.free = make([]int32, 0, capacity)
	for i := int32(capacity) - 1; i >= 0; i-- {
		t.free = append(t.free, i)
	}
	return t
}

func (t *tier) len() int { return len(t.m) }

func (t *tier) link(i int32) {
	last := t.e[t.sent].prev
	t.e[i].prev, t.e[i].next = last, t.sent
	t.e[last].next = i
	t.e[t.sent].prev = i
}

func (t *tier) unlink(i int32) {
	e := &t.e[i]
	t.e[e.prev].next = e.next
	t.e[e.next].prev = e.prev
}

func (t *tier) has(h uint64) bool {
	_, ok := t.m[h]
	return ok
}

// touch moves an entry to the MRU end.
func (t *tier) touch(h uint64) {
	if i, ok := t.m[h]; ok {
		t.unlink(i)
		t.link(i)
	}
}

func (t *tier) setPinned(h uint64, v bool) {
	if i, ok := t.m[h]; ok {
		t.e[i].pinned = v
	}
}

// insert stores a hash at the MRU end. An already-present hash is touched
// (stored=false). When full the LRU unpinned entry is evicted and returned;
// when every entry is pinned the insert is dropped.
func (t *tier) insert(h, eh uint64) (stored, evicted bool, vh, veh uint64) {
	if i, ok := t.m[h]; ok {
		t.unlink(i)
		t.link(i)
		return false, false, 0, 0
	}
	if len(t.free) == 0 {
		v := t.e[t.sent].next
		for v != t.sent && t.e[v].pinned {
			v = t.e[v].next
		}
		if v == t.sent {
			return false, false, 0, 0
		}
		evicted, vh, veh = true, t.e[v].hash, t.e[v].ehash
		t.unlink(v)
		delete(t.m, vh)
		t.free = append(t.free, v)
	}
	i := t.free[len(t.free)-1]
	t.free = t.free[:len(t.free)-1]
	t.e[i] = tierEntry{hash: h, ehash: eh}
	t.link(i)
	t.m[h] = i
	return true, evicted, vh, veh
}

// clear drops every entry.
func (t *tier) clear() {
	for h, i := range t.m {
		t.unlink(i)
		t.free = append(t.free, i)
		delete(t.m, h)
	}
}
