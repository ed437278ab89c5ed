package bench

import (
	"math"
	"sort"
)

// Record is one request as the bounds see it: the chained keys of every
// full block of prompt+output (at the engine block size) and how many of
// them belong to the prompt.
type Record struct {
	Phase        int
	At           float64
	Seq          int
	PromptLen    int
	PromptBlocks int
	Keys         []uint64
}

func sortRecords(recs []Record) []Record {
	out := append([]Record(nil), recs...)
	sort.SliceStable(out, func(a, b int) bool {
		if out[a].Phase != out[b].Phase {
			return out[a].Phase < out[b].Phase
		}
		if out[a].At != out[b].At {
			return out[a].At < out[b].At
		}
		return out[a].Seq < out[b].Seq
	})
	return out
}

// Oracle is the infinite-cache, perfect-routing token hit rate (an upper
// bound on any policy's hit rate): requests in arrival order; a request whose first k prompt blocks
// were seen before (in the same phase: a weight update invalidates every
// cache) scores min(blockSize·k, prompt length). Every block of the
// request's prompt and output is then remembered.
func Oracle(recs []Record, blockSize int) float64 {
	var hit, total float64
	seen := map[uint64]struct{}{}
	phase := math.MinInt
	for _, r := range sortRecords(recs) {
		if r.Phase != phase {
			clear(seen)
			phase = r.Phase
		}
		k := 0
		for k < r.PromptBlocks {
			if _, ok := seen[r.Keys[k]]; !ok {
				break
			}
			k++
		}
		hit += math.Min(float64(blockSize*k), float64(r.PromptLen))
		total += float64(r.PromptLen)
		for _, key := range r.Keys {
			seen[key] = struct{}{}
		}
	}
	if total == 0 {
		return 0
	}
	return hit / total
}

// PooledLRU is a reference, not a bound: the token hit rate of one LRU
// cache of capacity blocks (all engines' GPU capacity pooled), requests in arrival order, cleared at
// phase changes. Hits are the longest resident prompt prefix; then every
// block of the request is touched tail first, so that, as in vLLM (which
// frees a request's blocks in reverse order), a prefix outlives its tail.
// In-flight pinning is ignored, and LRU is not the optimal replacement,
// so a routing policy can exceed it.
func PooledLRU(recs []Record, blockSize, capacity int) float64 {
	if capacity <= 0 {
		return 0
	}
	l := newLRU(capacity)
	var hit, total float64
	phase := math.MinInt
	for _, r := range sortRecords(recs) {
		if r.Phase != phase {
			l = newLRU(capacity)
			phase = r.Phase
		}
		k := 0
		for k < r.PromptBlocks && l.has(r.Keys[k]) {
			k++
		}
		hit += math.Min(float64(blockSize*k), float64(r.PromptLen))
		total += float64(r.PromptLen)
		for i := len(r.Keys) - 1; i >= 0; i-- {
			l.touch(r.Keys[i])
		}
	}
	if total == 0 {
		return 0
	}
	return hit / total
}

// lru is a fixed-capacity LRU set of keys on index-linked nodes.
type lru struct {
	cap        int
	pos        map[uint64]int32
	key        []uint64
	prev, next []int32
	head, tail int32 // head = most recent
}

func newLRU(capacity int) *lru {
	return &lru{cap: capacity, pos: make(map[uint64]int32, capacity), head: -1, tail: -1}
}

func (l *lru) has(k uint64) bool { _, ok := l.pos[k]; return ok }

func (l *lru) unlink(i int32) {
	p, n := l.prev[i], l.next[i]
	if p >= 0 {
		l.next[p] = n
	} else {
		l.head = n
	}
	if n >= 0 {
		l.prev[n] = p
	} else {
		l.tail = p
	}
}

func (l *lru) pushFront(i int32) {
	l.prev[i], l.next[i] = -1, l.head
	if l.head >= 0 {
		l.prev[l.head] = i
	}
	l.head = i
	if l.tail < 0 {
		l.tail = i
	}
}

func (l *lru) touch(k uint64) {
	if i, ok := l.pos[k]; ok {
		if i != l.head {
			l.unlink(i)
			l.pushFront(i)
		}
		return
	}
	var i int32
	if len(l.key) < l.cap {
		i = int32(len(l.key))
		l.key = append(l.key, k)
		l.prev = append(l.prev, -1)
		l.next = append(l.next, -1)
	} else {
		i = l.tail
		l.unlink(i)
		delete(l.pos, l.key[i])
		l.key[i] = k
	}
	l.pos[k] = i
	l.pushFront(i)
}
