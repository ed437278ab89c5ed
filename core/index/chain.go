package index

import (
	"slices"
	"unsafe"

	"github.com/kvc-router/kvc-router/core/blockhash"
)

// MatchPrefixChain is MatchPrefix for a prompt whose block keys are not all
// known yet. keys holds the keys of the prompt's leading blocks (any
// number, possibly none); the rest are chained from the last of them, or
// from blockhash.Root(namespace, blockSize) when keys is empty, exactly as
// blockhash.AppendKeys derives them. It returns keys completed to every
// full block of tokens, and scratch; out answers ids over the first
// hittable keys, as MatchPrefix(keys[:hittable], ...) would.
//
// Why: the chained hash is a serial chain of multiplies (about 60 cycles a
// block) and the prefix walk is a chain of dependent loads; run one after
// the other they add up, but when block i+1 is hashed in the same loop
// iteration that walks block i, the CPU overlaps the two (neither waits on
// the other), and the hash of an 8k prompt costs little beyond the walk.
// Hashing continues past the end of the match because the callers need
// every key (speculation records the blocks beyond the matched prefix, the
// key memo keeps them for siblings).
func (ix *Index) MatchPrefixChain(keys []uint64, tokens []int32, blockSize int, namespace uint64, hittable int, ids []ServerID, out []Match, scratch []int32) ([]uint64, []int32) {
	nb := blockhash.FullBlocks(len(tokens), blockSize)
	hittable = max(0, min(hittable, nb))
	if len(ids) > 64 || len(ids) == 0 || hittable == 0 || len(keys) >= hittable {
		// Nothing to overlap: the known keys cover the match (a memo
		// hit), or the general walk is needed.
		keys = blockhash.AppendMore(keys, 0, tokens, blockSize, namespace)
		return keys, ix.MatchPrefix(keys[:hittable], ids, out, scratch)
	}
	for i := range out[:len(ids)] {
		out[i] = Match{}
	}
	parent := blockhash.Root(namespace, blockSize)
	if len(keys) > 0 {
		parent = keys[len(keys)-1]
	}
	ix.mu.RLock()
	var m masked
	pos := ix.newMasked(&m, ids, out[:len(ids)], scratch, ix.tick(ix.cfg.Now()))
	// Keys already known: walk only.
	live := m.walk(keys)
	if live {
		// Then in batches: hash the next batch of blocks and prefetch
		// their table slots, and walk the batch hashed before. A slot
		// requested a batch ahead is in cache when the walk reaches it,
		// so a cold prompt's misses overlap the hashing instead of
		// stalling the walk; batching keeps the per-block calls (the
		// hash, the prefetch) in tight loops with little state to spill.
		b := len(keys)
		for live && b < hittable {
			from, to := len(keys), min(len(keys)+matchBatch, nb)
			keys = slices.Grow(keys, to-from)[:to]
			parent = blockhash.ChainInto(parent, tokens[from*blockSize:], blockSize, keys[from:to])
			ix.prefetchKeys(keys[from:to])
			if from == b {
				continue // the first batch: nothing hashed ahead yet
			}
			end := min(from, hittable)
			live = m.walk(keys[b:end])
			b = end
		}
		if live {
			m.finish()
		}
	}
	ix.mu.RUnlock()
	// The rest is hashed outside the lock: event ingest may write meanwhile.
	keys = blockhash.AppendMore(keys, 0, tokens, blockSize, namespace)
	return keys, pos
}

// matchBatch is how many blocks MatchPrefixChain hashes ahead of its walk:
// at about 20 ns a block, 8 blocks cover a slot's miss to memory.
const matchBatch = 8

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
