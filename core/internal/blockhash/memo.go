package blockhash

import (
	"bytes"
	"slices"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// Memo remembers the keys of recent prompts so that a prompt sharing a
// prefix with one of them (a GRPO sibling, the next turn of a trajectory,
// a retry) hashes only its new blocks. Reused keys are the keys of
// byte-identical token blocks under the same namespace and block size, so
// AppendKeys through a Memo returns exactly what AppendKeys returns.
//
// Why: chained keys are inherently serial (each block's hash depends on the
// previous key), about 20 ns per 16-token block, 10 us for an 8k prompt and
// the largest single cost of a kvc_aware decision; comparing the tokens
// against a remembered prompt runs at memory speed instead.
//
// A Memo is not safe for concurrent use (the router calls it under its own
// lock). Memory is bounded by MemoMaxTokens tokens plus their keys.
type Memo struct {
	entries []memoEntry
	tokens  int
	clock   uint64
	reused  int // see Reused
}

type memoEntry struct {
	ns     uint64
	bs     int
	first  uint64  // key of block 0: a cheap filter before comparing tokens
	last   uint64  // plain hash of the last block: finds an identical prompt
	tokens []int32 // the prompt's full blocks
	keys   []uint64
	used   uint64
}

// Memo bounds.
const (
	// MemoMaxEntries is how many distinct prompts a Memo keeps.
	MemoMaxEntries = 64
	// MemoMaxTokens bounds the tokens kept over all entries (4 MiB).
	MemoMaxTokens = 1 << 20
	// memoChunk is the compare granularity in blocks before narrowing.
	memoChunk = 32
	// memoCompare is how many candidate entries a lookup compares.
	memoCompare = 2
)

// AppendKeys appends the keys of every full block of tokens to dst, as the
// package-level AppendKeys does, reusing remembered keys for the longest
// remembered prefix, and remembers this prompt.
func (m *Memo) AppendKeys(dst []uint64, tokens []int32, blockSize int, namespace uint64) []uint64 {
	start := len(dst)
	dst, hit := m.lookup(dst, tokens, blockSize, namespace)
	m.reused = 0
	if hit.best >= 0 && hit.ok {
		m.reused = hit.common
	}
	dst = appendMore(dst, start, tokens, blockSize, namespace)
	m.keep(hit, tokens, dst[start:])
	return dst
}

// Reused returns how many leading keys the last AppendKeys took from a
// remembered prompt rather than hashed: blocks the router has looked up
// recently, whose index entries are likely still in cache.
func (m *Memo) Reused() int { return m.reused }

// appendMore completes dst[start:], the keys of tokens' leading blocks, to
// the keys of every full block, hashing from the last key present (or
// from the root when there is none).
func appendMore(dst []uint64, start int, tokens []int32, blockSize int, namespace uint64) []uint64 {
	nb := FullBlocks(len(tokens), blockSize)
	have := len(dst) - start
	if have >= nb {
		return dst
	}
	parent := Root(namespace, blockSize)
	if have > 0 {
		parent = dst[len(dst)-1]
	}
	dst = slices.Grow(dst, nb-have)
	ChainInto(parent, tokens[have*blockSize:], blockSize, dst[len(dst):len(dst)+nb-have])
	return dst[:len(dst)+nb-have]
}

// memoHit is what lookup found; keep takes it back with the prompt's keys.
type memoHit struct {
	best, common, nb int
	bs               int
	ns, first, last  uint64
	ok               bool // false: nothing to remember
}

// lookup appends the keys of tokens' longest remembered leading blocks to
// dst (at least block 0's, when tokens holds a full block) and returns what
// keep needs once the caller has completed the keys.
func (m *Memo) lookup(dst []uint64, tokens []int32, blockSize int, namespace uint64) ([]uint64, memoHit) {
	nb := FullBlocks(len(tokens), blockSize)
	if nb == 0 || !littleEndian {
		dst = AppendKeys(dst, tokens, blockSize, namespace)
		return dst, memoHit{common: nb}
	}
	m.clock++
	first := Chain(Root(namespace, blockSize), tokens[:blockSize])
	// Compare against the memoCompare most recently used entries that
	// start with the same block: a GRPO group's siblings all share their
	// first block, and comparing each of them would cost more than the
	// hashing saved.
	// An entry of the same length ending in the same block is very likely
	// the same prompt (a sibling's retry, the bench's repeat) and is tried
	// first.
	var cand [memoCompare + 1]int
	nc := 0
	tb := tokenBytes(tokens[:nb*blockSize])
	w := 4 * blockSize
	last := xxhash.Sum64(tb[(nb-1)*w:])
	same := -1
	for i := range m.entries {
		e := &m.entries[i]
		if e.first != first || e.ns != namespace || e.bs != blockSize {
			continue
		}
		if same < 0 && e.last == last && len(e.keys) == nb {
			same = i
			continue
		}
		j := nc
		if nc < memoCompare {
			nc++
		} else if e.used <= m.entries[cand[nc-1]].used {
			continue
		} else {
			j = nc - 1
		}
		for ; j > 0 && m.entries[cand[j-1]].used < e.used; j-- {
			cand[j] = cand[j-1]
		}
		cand[j] = i
	}
	if same >= 0 {
		copy(cand[1:], cand[:nc])
		cand[0] = same
		nc++
	}
	best, common := -1, 0
	for _, i := range cand[:nc] {
		if c := commonBlocks(m.entries[i].tokens, tokens[:nb*blockSize], blockSize); c > common {
			best, common = i, c
			if c == nb {
				break
			}
		}
	}
	if best >= 0 {
		e := &m.entries[best]
		e.used = m.clock
		dst = append(dst, e.keys[:common]...)
	} else {
		dst = append(dst, first)
		common = 1
	}
	return dst, memoHit{best: best, common: common, nb: nb, bs: blockSize, ns: namespace, first: first, last: last, ok: true}
}

// keep remembers tokens with keys, the keys of all its full blocks, as
// found by the lookup that returned h.
func (m *Memo) keep(h memoHit, tokens []int32, keys []uint64) {
	if !h.ok || len(keys) != h.nb {
		return
	}
	m.remember(h.best, h.common, h.nb, tokens[:h.nb*h.bs], keys, h.bs, h.ns, h.first, h.last)
}

// commonBlocks counts the leading whole blocks a and b share.
func commonBlocks(a, b []int32, bs int) int {
	n := min(len(a), len(b)) / bs
	ab, bb := tokenBytes(a), tokenBytes(b)
	w := 4 * bs
	c := 0
	// Whole chunks first (one memcmp each), then block by block.
	for c+memoChunk <= n && bytes.Equal(ab[c*w:(c+memoChunk)*w], bb[c*w:(c+memoChunk)*w]) {
		c += memoChunk
	}
	for c < n && bytes.Equal(ab[c*w:(c+1)*w], bb[c*w:(c+1)*w]) {
		c++
	}
	return c
}

func (m *Memo) remember(best, common, nb int, tokens []int32, keys []uint64, bs int, ns, first, last uint64) {
	if best >= 0 {
		e := &m.entries[best]
		if common == nb {
			return // already known (the same prompt, or a prefix of one)
		}
		if common == len(e.keys) && m.tokens+len(tokens)-len(e.tokens) <= MemoMaxTokens {
			// This prompt extends the remembered one (the next turn):
			// grow the entry instead of keeping both.
			m.tokens += len(tokens) - len(e.tokens)
			e.last = last
			e.tokens = appendTokens(e.tokens, tokens[len(e.tokens):])
			e.keys = append(e.keys, keys[len(e.keys):]...)
			return
		}
	}
	if len(tokens) > MemoMaxTokens/4 {
		return // one huge prompt would flush everything else
	}
	// Evicted entries' buffers are reused: a prompt's copy is a large
	// allocation (32 KiB at 8k tokens) that would otherwise come back from
	// the OS zeroed, page by page, once per new prompt.
	var spare memoEntry
	for len(m.entries) >= MemoMaxEntries || (len(m.entries) > 0 && m.tokens+len(tokens) > MemoMaxTokens) {
		if e := m.evict(); cap(e.tokens) > cap(spare.tokens) {
			spare = e
		}
	}
	m.tokens += len(tokens)
	m.entries = append(m.entries, memoEntry{
		ns: ns, bs: bs, first: first, last: last, used: m.clock,
		tokens: appendTokens(spare.tokens[:0], tokens), keys: append(spare.keys[:0], keys...),
	})
}

// appendTokens is append(dst, src...) for a remembered prompt. Large copies
// use non-temporal stores: a memo entry is read again only when a later
// prompt shares its prefix, and 32 KiB (an 8k prompt) written through the
// cache per cold prompt evicts the index's table slots and the next
// prompts' tokens, which cost more than the copy itself.
func appendTokens(dst, src []int32) []int32 {
	n := len(dst)
	dst = slices.Grow(dst, len(src))[:n+len(src)]
	to := dst[n:]
	bulk := 0
	if haveStreamCopy && len(src) >= 1024 && uintptr(unsafe.Pointer(&to[0]))%16 == 0 {
		bulk = len(src) &^ 15 // whole 64-byte lines
		streamCopy(unsafe.Pointer(&to[0]), unsafe.Pointer(&src[0]), 4*bulk)
	}
	copy(to[bulk:], src[bulk:])
	return dst
}

// evict drops the least recently used entry and returns it.
func (m *Memo) evict() memoEntry {
	lru := 0
	for i := range m.entries {
		if m.entries[i].used < m.entries[lru].used {
			lru = i
		}
	}
	e := m.entries[lru]
	m.tokens -= len(e.tokens)
	last := len(m.entries) - 1
	m.entries[lru] = m.entries[last]
	m.entries[last] = memoEntry{}
	m.entries = m.entries[:last]
	return e
}

// Reset forgets every prompt.
func (m *Memo) Reset() { *m = Memo{} }
