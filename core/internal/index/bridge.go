// Engine events and the engine-hash bridge: BlockStored / BlockRemoved
// applied through the per-server map from engine hash to record.

package index

import (
	"fmt"
	"slices"
	"sync"

	"github.com/kvc-router/kvc-router/core/internal/blockhash"
)

// Stored applies a BlockStored event. parent is the engine hash of the block
// before the run (hasParent false when the run starts at block 0). When
// tokens are present they are cut into blocks of blockSize and keyed in
// namespace; token-less events (lower-tier placeholders) add the tier to the
// records their engine hashes already bridge to.
func (ix *Index) Stored(id ServerID, tier Tier, hasParent bool, parent uint64, engineHashes []uint64, tokens []int32, blockSize int, namespace uint64) error {
	if tier >= NumTiers {
		return fmt.Errorf("%w: tier %d", ErrBadEvent, tier)
	}
	if len(tokens) == 0 {
		return ix.storedTokenless(id, tier, engineHashes)
	}
	if blockSize <= 0 {
		return fmt.Errorf("%w: block_size %d with %d tokens", ErrBadEvent, blockSize, len(tokens))
	}
	n := min(len(engineHashes), len(tokens)/blockSize)
	// Keys are hashed before the write lock is taken (they depend only on
	// the parent's key), so routing calls wait for the apply alone.
	start, known := blockhash.Root(namespace, blockSize), true
	if hasParent {
		ix.mu.RLock()
		start, known = ix.parentKey(id, parent)
		ix.mu.RUnlock()
	}
	kp := keyPool.Get().(*[]uint64)
	defer putKeys(kp)
	keys := chainKeys((*kp)[:0], start, tokens, blockSize, n)
	*kp = keys

	ix.mu.Lock()
	defer ix.mu.Unlock()
	s := ix.srv(id)
	if s == nil {
		return ErrUnknownServer
	}
	if hasParent {
		r, ok := ix.bridged(s, id, parent)
		if !ok {
			s.unanchored += uint64(len(engineHashes))
			return ErrUnanchored
		}
		if k := ix.at(r).key; !known || k != start {
			// The parent changed between the two locks: rehash.
			keys = chainKeys(keys[:0], k, tokens, blockSize, n)
			*kp = keys
		}
	}
	// Touch every slot the loop below will probe first: the loads are
	// independent, so their cache misses overlap instead of queueing one
	// behind the other inside the dependent apply loop.
	var sink uint64
	for i, k := range keys {
		sink += ix.keys.peek(k) + s.bridge.peek(engineHashes[i])
	}
	ix.sink = sink
	for i, key := range keys {
		r := ix.findOrCreate(id, s, key)
		if e := ix.eng(r); *e != 0 && *e != engineHashes[i] {
			// Another engine hash already names this block; keep one
			// bridge per record so a freed slot never aliases.
			s.bridge.Delete(*e)
		}
		*ix.eng(r) = engineHashes[i]
		s.bridge.Put(engineHashes[i], r)
		ix.incr(r, tier)
		ix.touch(r, s)
	}
	s.stored += uint64(n)
	if s.opts.Approximate {
		// Nothing else bounds an approximate server's records (a first
		// pushed batch lands before the server is marked event-fed).
		ix.enforceCapacity(s)
	}
	ix.enforceBudget()
	return nil
}

var keyPool = sync.Pool{New: func() any { return new([]uint64) }}

// maxPooledKeys: a giant event's key buffer (262,144 keys for a 4M-token
// event) is left to the GC rather than pooled.
const maxPooledKeys = 1 << 14

func putKeys(kp *[]uint64) {
	if cap(*kp) <= maxPooledKeys {
		keyPool.Put(kp)
	}
}

func chainKeys(dst []uint64, key uint64, tokens []int32, bs, n int) []uint64 {
	dst = slices.Grow(dst, n)
	blockhash.ChainInto(key, tokens, bs, dst[len(dst):len(dst)+n])
	return dst[:len(dst)+n]
}

// KeyOf is the key of the record engine hash e names on server id (false
// when it names none).
func (ix *Index) KeyOf(id ServerID, e uint64) (uint64, bool) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	return ix.parentKey(id, e)
}

// parentKey reads the key an engine hash bridges to, without repairing
// stale bridges (the caller holds only the read lock).
func (ix *Index) parentKey(id ServerID, e uint64) (uint64, bool) {
	s := ix.srv(id)
	if s == nil {
		return 0, false
	}
	r, ok := s.bridge.Get(e)
	if !ok {
		return 0, false
	}
	if ix.at(r).server == uint16(id) && *ix.eng(r) == e {
		return ix.at(r).key, true
	}
	return 0, false
}

// storedTokenless applies a token-less BlockStored (a lower-tier copy of
// blocks the engine hashes already bridge to).
func (ix *Index) storedTokenless(id ServerID, tier Tier, engineHashes []uint64) error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	s := ix.srv(id)
	if s == nil {
		return ErrUnknownServer
	}
	var miss int
	for _, e := range engineHashes {
		r, ok := ix.bridged(s, id, e)
		if !ok {
			miss++
			continue
		}
		ix.incr(r, tier)
		ix.touch(r, s)
	}
	s.stored += uint64(len(engineHashes) - miss)
	if miss > 0 {
		s.unresolved += uint64(miss)
	}
	return nil
}

// Removed applies a BlockRemoved event: one copy per engine hash leaves tier.
func (ix *Index) Removed(id ServerID, tier Tier, engineHashes []uint64) error {
	if tier >= NumTiers {
		return fmt.Errorf("%w: tier %d", ErrBadEvent, tier)
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	s := ix.srv(id)
	if s == nil {
		return ErrUnknownServer
	}
	for _, e := range engineHashes {
		r, ok := ix.bridged(s, id, e)
		if !ok {
			s.unresolved++
			continue
		}
		rc := ix.at(r)
		if rc.cnt[tier] > 0 {
			was := rc.class()
			rc.cnt[tier]--
			ix.reclass(rc, was)
		}
		s.removed++
		if rc.empty() {
			// The engine no longer holds the block anywhere: any
			// speculation about it is contradicted too.
			ix.freeRec(r, s)
		}
	}
	return nil
}

// bridged resolves an engine hash to its live record, dropping a stale
// bridge entry on the way.
func (ix *Index) bridged(s *server, id ServerID, e uint64) (uint32, bool) {
	r, ok := s.bridge.Get(e)
	if !ok {
		return 0, false
	}
	if ix.at(r).server != uint16(id) || *ix.eng(r) != e {
		s.bridge.Delete(e)
		return 0, false
	}
	return r, true
}
