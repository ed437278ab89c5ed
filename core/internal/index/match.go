// Longest-prefix match over the block-key table (the routing walk).

package index

import (
	"math/bits"
)

// Match is one server's answer to a prefix query.
type Match struct {
	// Blocks is the length of the longest run of leading keys resident.
	Blocks int
	// Tier counts those blocks by the best tier holding each.
	Tier [NumTiers]int
}

// MatchPrefix computes, for each server in ids, the longest run of leading
// keys resident on it, with a per-tier breakdown; out[i] answers ids[i].
// scratch may be nil; passing a reused slice avoids an allocation.
func (ix *Index) MatchPrefix(keys []uint64, ids []ServerID, out []Match, scratch []int32) []int32 {
	return ix.MatchPrefixPrefetch(keys, len(keys), ids, out, scratch)
}

// MatchPrefixPrefetch is MatchPrefix that first requests the table slots
// of keys[prefetchFrom:], keys not looked up recently (the blocks of a
// prompt the key memo did not know): their cache misses then overlap one
// another instead of stalling the walk one probe at a time. Prefetching
// keys already in cache costs more than it saves.
func (ix *Index) MatchPrefixPrefetch(keys []uint64, prefetchFrom int, ids []ServerID, out []Match, scratch []int32) []int32 {
	prefetchFrom = max(0, prefetchFrom)
	for i := range out[:len(ids)] {
		out[i] = Match{}
	}
	if len(keys) == 0 || len(ids) == 0 {
		return scratch
	}
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	now := ix.tick(ix.cfg.Now())
	out = out[:len(ids)]
	if len(ids) <= 64 {
		var m masked
		pos := ix.newMasked(&m, ids, out, scratch, now)
		if prefetchFrom < len(keys) {
			ix.prefetchKeys(keys[prefetchFrom:])
		}
		if m.walk(keys) {
			m.finish()
		}
		return pos
	}
	pos := ix.candidatePos(ids, scratch)
	// The walk below is the general case (over 64 candidates): pages and
	// pos are hoisted into locals and the record is addressed inline, so
	// each chain step is one dependent load with no calls or repeated
	// bounds checks.
	pages := ix.pages
	for b, k := range keys {
		kv, ok := ix.keys.Get(k)
		if !ok {
			break
		}
		r := kv.head
		advanced := false
		for r != nilRec {
			rc := &pages[r>>pageShift][r&(pageSize-1)]
			r = rc.next
			p := int(pos[rc.server])
			if p == 0 {
				continue
			}
			m := &out[p-1]
			if m.Blocks != b {
				continue
			}
			// A block counts on the best tier holding it; unexpired
			// speculation counts as GPU (masked.step applies the same rule).
			var t Tier
			switch {
			case rc.cnt[GPU] > 0 || rc.spec > now:
				t = GPU
			case rc.cnt[CPU] > 0:
				t = CPU
			case rc.cnt[SSD] > 0:
				t = SSD
			default:
				continue
			}
			m.Blocks++
			m.Tier[t]++
			advanced = true
		}
		if !advanced {
			break
		}
	}
	return pos
}

// candidatePos maps server ids to their 1-based position in ids (0 for a
// server that is not a candidate), in scratch grown to the server table.
// The caller holds the lock.
func (ix *Index) candidatePos(ids []ServerID, scratch []int32) []int32 {
	if cap(scratch) < len(ix.servers) {
		scratch = make([]int32, len(ix.servers))
	}
	pos := scratch[:len(ix.servers)]
	for i := range pos {
		pos[i] = 0
	}
	for i, id := range ids {
		if int(id) < len(pos) {
			pos[id] = int32(i + 1)
		}
	}
	return pos
}

// masked is the state of MatchPrefix for up to 64 candidates, the common
// case.
// Each block yields bitmasks of the candidates holding it per best tier, so
// a block costs its chain walk plus a few word operations rather than a
// read-modify-write of every advancing candidate's Match: candidates drop
// out of the alive mask, and blocks on which every alive candidate is on
// GPU (almost all of them) are counted once for all.
//
// When every candidate's server id is below 64 (fast), a candidate's bit is
// its server id, so a key whose summary has no loose records answers from
// keyVal.gpu without reading its chain. Otherwise a candidate's bit is its
// position in ids.
type masked struct {
	keys   *u64table[keyVal]
	pages  [][]rec
	pos    []int32 // server -> its bit + 1, 0 for a non-candidate
	out    []Match
	outOf  [64]uint8 // bit -> index in out
	fast   bool
	now    uint32
	alive  uint64
	allGPU int // blocks so far on which every alive candidate was on GPU
	b      int // blocks stepped so far
}

// newMasked prepares a match of up to 64 candidates, pos in scratch. The
// caller holds the read lock and has zeroed out.
func (ix *Index) newMasked(m *masked, ids []ServerID, out []Match, scratch []int32, now uint32) []int32 {
	if cap(scratch) < len(ix.servers) {
		scratch = make([]int32, len(ix.servers))
	}
	pos := scratch[:len(ix.servers)]
	for i := range pos {
		pos[i] = 0
	}
	*m = masked{keys: &ix.keys, pages: ix.pages, pos: pos, out: out, now: now, fast: true}
	for _, id := range ids {
		if int(id) < len(pos) && id >= 64 {
			m.fast = false
		}
	}
	for i, id := range ids {
		if int(id) >= len(pos) {
			continue // unknown: its answer stays zero
		}
		bit := i
		if m.fast {
			bit = int(id)
		}
		// A repeated id answers at its last position, as MatchPrefix's
		// general walk does; the earlier ones stay zero.
		pos[id] = int32(bit + 1)
		m.outOf[bit] = uint8(i)
		m.alive |= 1 << bit
	}
	return pos
}

// drop ends the candidates in mask at blocks matched.
func (m *masked) drop(mask uint64, blocks int) {
	for ; mask != 0; mask &= mask - 1 {
		o := &m.out[m.outOf[bits.TrailingZeros64(mask)]]
		o.Blocks = blocks
		o.Tier[GPU] += m.allGPU
	}
}

// walk matches the next len(keys) blocks and reports whether any
// candidate still holds every block so far; after false the answer is
// final. It alternates two call-free loops: Go keeps no register across a
// call, so a call per block would spill and reload the loop's state each
// time.
func (m *masked) walk(keys []uint64) bool {
	for len(keys) > 0 {
		keys = keys[m.walkGPU(keys):]
		if len(keys) == 0 {
			break
		}
		n, live := m.walkChains(keys)
		if !live {
			return false
		}
		keys = keys[n:]
		if len(keys) > 0 && keys[0] == 0 {
			// Key 0 lives outside the table's slots.
			if !m.stepKV(m.keys.ref(0)) {
				return false
			}
			keys = keys[1:]
		}
	}
	return true
}

// walkChains matches leading keys by their record chains, up to a key
// walkGPU can take (or key 0), and returns how many it matched and whether
// a candidate is still alive. It is stepKV's body in a loop.
func (m *masked) walkChains(keys []uint64) (int, bool) {
	slots := m.keys.slots
	if len(slots) == 0 { // no key but 0 can be present
		if keys[0] == 0 {
			return 0, true
		}
		m.drop(m.alive, m.b)
		m.alive = 0
		return 0, false
	}
	// Few locals: the loop is register-starved, and what does not fit is
	// spilled and reloaded on every block. The rarely used state (out,
	// the GPU run count) stays in m.
	shift, mask := m.keys.shift&63, uint64(len(slots)-1)
	alive := m.alive
	n := 0
	for ; n < len(keys); n++ {
		k := keys[n]
		if k == 0 {
			break
		}
		var kv *keyVal
		for i := (k * fib) >> shift; ; i = (i + 1) & mask {
			sl := &slots[i&mask]
			if sl.k == k {
				kv = &sl.v
				break
			}
			if sl.k == 0 {
				break
			}
		}
		if kv == nil {
			m.drop(alive, m.b)
			alive = 0
			break
		}
		if m.fast && kv.loose == 0 && kv.gpu&alive == alive {
			break // walkGPU's
		}
		var g, c, sd uint64
		if m.fast && kv.loose == 0 {
			g = kv.gpu
		} else {
			g, c, sd = m.recordMasks(kv)
		}
		g, c, sd = g&alive, c&alive, sd&alive
		next := g | c | sd
		if gone := alive &^ next; gone != 0 {
			m.drop(gone, m.b)
		}
		alive = next
		m.b++
		if alive == 0 {
			break
		}
		if g == alive {
			m.allGPU++
			continue
		}
		m.countTiers(g, c, sd)
	}
	m.alive = alive
	return n, alive != 0
}

// countTiers adds one block to each candidate in g, c and sd (bitmasks of
// candidates holding it on GPU, CPU and SSD at best).
func (m *masked) countTiers(g, c, sd uint64) {
	out, outOf := m.out, &m.outOf
	for x := g; x != 0; x &= x - 1 {
		out[outOf[bits.TrailingZeros64(x)]].Tier[GPU]++
	}
	for x := c; x != 0; x &= x - 1 {
		out[outOf[bits.TrailingZeros64(x)]].Tier[CPU]++
	}
	for x := sd; x != 0; x &= x - 1 {
		out[outOf[bits.TrailingZeros64(x)]].Tier[SSD]++
	}
}

// walkGPU consumes the leading keys whose summaries say every alive
// candidate holds the block on GPU (almost every block of a cached
// prefix) and returns how many: such a block costs its table probe alone.
func (m *masked) walkGPU(keys []uint64) int {
	slots := m.keys.slots
	if !m.fast || len(slots) == 0 {
		return 0
	}
	shift, mask, alive := m.keys.shift&63, uint64(len(slots)-1), m.alive
	n := 0
	for ; n < len(keys); n++ {
		k := keys[n]
		if k == 0 {
			break // kept outside the slots
		}
		var kv *keyVal
		for i := (k * fib) >> shift; ; i = (i + 1) & mask {
			sl := &slots[i&mask]
			if sl.k == k {
				kv = &sl.v
				break
			}
			if sl.k == 0 {
				break
			}
		}
		if kv == nil || kv.loose != 0 || kv.gpu&alive != alive {
			break
		}
	}
	m.b += n
	m.allGPU += n
	return n
}

// recordMasks reads kv's records (the path its summary cannot answer): the
// candidates holding the block on GPU (or speculatively), else CPU, else SSD.
func (m *masked) recordMasks(kv *keyVal) (g, c, sd uint64) {
	pages, pos, now := m.pages, m.pos, m.now
	for r := kv.head; r != nilRec; {
		rc := &pages[r>>pageShift][r&(pageSize-1)]
		r = rc.next
		p := pos[rc.server]
		if p == 0 {
			continue
		}
		bit := uint64(1) << (p - 1)
		switch {
		case rc.cnt[GPU] > 0 || rc.spec > now:
			g |= bit
		case rc.cnt[CPU] > 0:
			c |= bit
		case rc.cnt[SSD] > 0:
			sd |= bit
		}
	}
	return g, c, sd
}

// stepKV matches the next block, whose key's table value is kv (nil: no
// server holds it).
func (m *masked) stepKV(kv *keyVal) bool {
	b := m.b
	m.b++
	if kv == nil {
		m.drop(m.alive, b)
		m.alive = 0
		return false
	}
	var g, c, sd uint64
	if m.fast && kv.loose == 0 {
		g = kv.gpu
	} else {
		g, c, sd = m.recordMasks(kv)
	}
	alive := m.alive
	g, c, sd = g&alive, c&alive, sd&alive
	next := g | c | sd
	m.drop(alive&^next, b)
	m.alive = next
	if next == 0 {
		return false
	}
	if g == next {
		m.allGPU++
		return true
	}
	m.countTiers(g, c, sd)
	return true
}

// finish settles the candidates still alive after the last key.
func (m *masked) finish() {
	m.drop(m.alive, m.b)
	m.alive = 0
}
