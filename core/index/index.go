// Package index tracks which block keys are resident on which server, in
// which storage tier, and answers longest-prefix queries.
//
// Two sources feed it. Engine events (vLLM BlockStored / BlockRemoved /
// AllBlocksCleared) are authoritative: they carry engine hashes, which a
// per-server bridge map ties to the router's own keys (blockhash package),
// because BlockRemoved and token-less lower-tier stores carry no tokens.
// Speculative entries, recorded when the router sends a prompt to a server,
// cover the gap before events arrive (GRPO siblings sent in one burst) and are
// the only source for servers without an event feed ("approximate" servers).
//
// Memory is bounded: every (server, key) pair is one 40-byte record (32 in
// a slab of fixed-size pages, 8 for its engine hash alongside), the slab is capped at Config.MaxEntries records with
// CLOCK (approximate LRU) eviction, and approximate servers additionally cap
// their own records, least recently used first, at their capacity.
package index

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"time"

	"github.com/kvc-router/kvc-router/core/blockhash"
)

// Tier is a storage tier of the KV cache. Lower is faster.
type Tier uint8

const (
	GPU Tier = iota
	CPU
	SSD
	// NumTiers is the number of tiers.
	NumTiers = 3
)

// String returns the tier's lower-case name.
func (t Tier) String() string {
	switch t {
	case GPU:
		return "gpu"
	case CPU:
		return "cpu"
	case SSD:
		return "ssd"
	}
	return fmt.Sprintf("tier(%d)", uint8(t))
}

// ServerID is a compact handle for a server inside the index.
type ServerID uint16

const (
	nilRec    = ^uint32(0)
	freeSrv   = ^uint16(0)
	maxServer = int(freeSrv) - 1
	tickDur   = 10 * time.Millisecond
)

// Errors returned by event operations. They are not fatal: callers count
// them and carry on.
var (
	ErrUnknownServer = errors.New("index: unknown server")
	ErrUnanchored    = errors.New("index: parent block hash not known for this server")
	ErrBadEvent      = errors.New("index: malformed event")
	ErrTooManyServer = errors.New("index: too many servers")
)

// Config sizes the index.
type Config struct {
	// MaxEntries caps (server, key) records across all servers; the least
	// recently stored or speculated record is evicted beyond it.
	MaxEntries int
	// SpecTTL is how long a speculative entry lives on a server with an
	// event feed (events normally confirm or remove it sooner).
	SpecTTL time.Duration
	// ApproxTTL is how long a speculative entry lives on a server without
	// an event feed.
	ApproxTTL time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Defaults for Config fields left zero.
const (
	DefaultMaxEntries = 4 << 20
	DefaultSpecTTL    = 5 * time.Second
	DefaultApproxTTL  = 10 * time.Minute
)

func (c Config) withDefaults() Config {
	if c.MaxEntries <= 0 {
		c.MaxEntries = DefaultMaxEntries
	}
	if c.SpecTTL <= 0 {
		c.SpecTTL = DefaultSpecTTL
	}
	if c.ApproxTTL <= 0 {
		c.ApproxTTL = DefaultApproxTTL
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// ServerOptions describe one server to the index.
type ServerOptions struct {
	// Approximate marks a server without an event feed: its residency is
	// presumed from routing decisions alone, with ApproxTTL.
	Approximate bool
	// Capacity caps this server's records (its num_gpu_blocks); 0 = no cap.
	// It matters for approximate servers, whose records nothing else removes.
	Capacity int
}

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

type server struct {
	name   string
	opts   ServerOptions
	bridge u64map // engine hash -> record
	head   uint32 // most recent record of this server
	tail   uint32
	n      int

	stored, removed, cleared, unanchored, unresolved uint64
}

// Index is safe for concurrent use.
type Index struct {
	mu      sync.RWMutex
	cfg     Config
	epoch   time.Time
	keys    u64table[keyVal] // block key -> its record chain
	pages   [][]rec          // fixed-size pages: growth never copies or over-allocates
	engines [][]uint64       // engine hash per record, pages parallel to pages
	nrecs   uint32           // records allocated (live + free)
	free    uint32
	nfree   int
	hand    uint32 // CLOCK hand
	servers []*server
	freeIDs []ServerID
	byName  map[string]ServerID

	evictedBudget, evictedCapacity uint64
	sink                           uint64 // keeps Stored's cache-warming loads alive
}

// New returns an empty index.
func New(cfg Config) *Index {
	cfg = cfg.withDefaults()
	return &Index{
		cfg:    cfg,
		epoch:  cfg.Now(),
		free:   nilRec,
		byName: make(map[string]ServerID),
	}
}

func (ix *Index) tick(t time.Time) uint32 {
	d := t.Sub(ix.epoch) / tickDur
	if d < 1 {
		return 1
	}
	if int64(d) >= int64(^uint32(0)) {
		return ^uint32(0) - 1
	}
	return uint32(d)
}

// AddServer registers a server (or updates its options) and returns its id.
func (ix *Index) AddServer(name string, opts ServerOptions) (ServerID, error) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if id, ok := ix.byName[name]; ok {
		s := ix.servers[id]
		s.opts = opts
		ix.enforceCapacity(s)
		return id, nil
	}
	s := &server{name: name, opts: opts, head: nilRec, tail: nilRec}
	var id ServerID
	if n := len(ix.freeIDs); n > 0 {
		id = ix.freeIDs[n-1]
		ix.freeIDs = ix.freeIDs[:n-1]
		ix.servers[id] = s
	} else {
		if len(ix.servers) > maxServer {
			return 0, ErrTooManyServer
		}
		id = ServerID(len(ix.servers))
		ix.servers = append(ix.servers, s)
	}
	ix.byName[name] = id
	return id, nil
}

// SetOptions changes a server's options; unknown ids are ignored.
func (ix *Index) SetOptions(id ServerID, opts ServerOptions) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if s := ix.srv(id); s != nil {
		s.opts = opts
		ix.enforceCapacity(s)
	}
}

// Lookup returns the id of a registered server.
func (ix *Index) Lookup(name string) (ServerID, bool) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	id, ok := ix.byName[name]
	return id, ok
}

func (ix *Index) srv(id ServerID) *server {
	if int(id) >= len(ix.servers) {
		return nil
	}
	return ix.servers[id]
}

// RemoveServer drops a server and everything it holds.
func (ix *Index) RemoveServer(id ServerID) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	s := ix.srv(id)
	if s == nil {
		return
	}
	ix.clearServer(id, s)
	delete(ix.byName, s.name)
	ix.servers[id] = nil
	ix.freeIDs = append(ix.freeIDs, id)
}

// Cleared drops every record of a server (vLLM AllBlocksCleared, engine
// restart, or an event gap that replay could not close).
func (ix *Index) Cleared(id ServerID) error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	s := ix.srv(id)
	if s == nil {
		return ErrUnknownServer
	}
	s.cleared++
	ix.clearServer(id, s)
	return nil
}

// ClearAll drops every record of every server (a weight update).
func (ix *Index) ClearAll() {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for id, s := range ix.servers {
		if s != nil {
			s.cleared++
			ix.clearServer(ServerID(id), s)
		}
	}
}

func (ix *Index) clearServer(id ServerID, s *server) {
	for r := s.head; r != nilRec; {
		next := ix.at(r).snext
		ix.freeRec(r, s)
		r = next
	}
	s.bridge.Reset()
}

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
	defer keyPool.Put(kp)
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

func chainKeys(dst []uint64, key uint64, tokens []int32, bs, n int) []uint64 {
	dst = slices.Grow(dst, n)
	blockhash.ChainInto(key, tokens, bs, dst[len(dst):len(dst)+n])
	return dst[:len(dst)+n]
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

// Speculate records keys as presumed resident on a server's GPU tier because
// the router just sent them there. The entries expire after SpecTTL (event
// feed) or ApproxTTL (approximate server).
func (ix *Index) Speculate(id ServerID, keys []uint64) {
	if len(keys) == 0 {
		return
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	s := ix.srv(id)
	if s == nil {
		return
	}
	ttl := ix.cfg.SpecTTL
	if s.opts.Approximate {
		ttl = ix.cfg.ApproxTTL
	}
	now := ix.cfg.Now()
	exp := ix.tick(now.Add(ttl))
	for _, k := range keys {
		r := ix.findOrCreate(id, s, k)
		if rc := ix.at(r); rc.spec < exp {
			was := rc.class()
			rc.spec = exp
			ix.reclass(rc, was)
		}
		ix.touch(r, s)
	}
	ix.sweepExpired(s, ix.tick(now))
	ix.enforceCapacity(s)
	ix.enforceBudget()
}

// sweepExpired frees speculative-only records at the cold end of a server's
// list once they have expired, so that unconfirmed speculation does not
// crowd the budget.
func (ix *Index) sweepExpired(s *server, now uint32) {
	for i := 0; i < 64 && s.tail != nilRec; i++ {
		rc := ix.at(s.tail)
		if !rc.empty() || rc.spec > now {
			return
		}
		ix.freeRec(s.tail, s)
	}
}

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

// ServerStatus reports one server's share of the index.
type ServerStatus struct {
	Name        string `json:"name"`
	Entries     int    `json:"entries"`
	Bridged     int    `json:"bridged"`
	Approximate bool   `json:"approximate"`
	Capacity    int    `json:"capacity"`
	Stored      uint64 `json:"stored_blocks"`
	Removed     uint64 `json:"removed_blocks"`
	Cleared     uint64 `json:"cleared"`
	Unanchored  uint64 `json:"unanchored_blocks"`
	Unresolved  uint64 `json:"unresolved_hashes"`
}

// Status summarises the index.
type Status struct {
	Entries         int            `json:"entries"`
	Keys            int            `json:"keys"`
	MaxEntries      int            `json:"max_entries"`
	Bytes           int64          `json:"bytes_estimate"`
	EvictedBudget   uint64         `json:"evicted_budget"`
	EvictedCapacity uint64         `json:"evicted_capacity"`
	Servers         []ServerStatus `json:"servers"`
}

// recBytes is the size of rec plus its engine-hash slot (checked by a test
// with unsafe.Sizeof).
const recBytes = 32 + 8

// Status returns counts and the index's memory: slab pages plus hash
// tables, counted exactly rather than estimated.
func (ix *Index) Status() Status {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	st := Status{
		Entries:         int(ix.nrecs) - ix.nfree,
		Keys:            ix.keys.Len(),
		MaxEntries:      ix.cfg.MaxEntries,
		EvictedBudget:   ix.evictedBudget,
		EvictedCapacity: ix.evictedCapacity,
	}
	bytes := int64(len(ix.pages))*pageSize*recBytes + ix.keys.Bytes()
	for _, s := range ix.servers {
		if s == nil {
			continue
		}
		bytes += s.bridge.Bytes()
		st.Servers = append(st.Servers, ServerStatus{
			Name: s.name, Entries: s.n, Bridged: s.bridge.Len(), Approximate: s.opts.Approximate,
			Capacity: s.opts.Capacity, Stored: s.stored, Removed: s.removed, Cleared: s.cleared,
			Unanchored: s.unanchored, Unresolved: s.unresolved,
		})
	}
	// The slab pages and the hash tables are the index; everything else
	// (server structs, names) is a few hundred bytes per server.
	st.Bytes = bytes
	return st
}

// Residency is one record as Snapshot reports it.
type Residency struct {
	Key uint64
	// Engine is the engine hash bridged to the record (0 = speculative only).
	Engine uint64
	// Copies counts resident copies per tier.
	Copies [NumTiers]int
	// Speculative is true while an unexpired speculative entry exists.
	Speculative bool
}

// Snapshot lists a server's records, for inspection and end-to-end checks
// against an engine's true cache contents. It is O(records of the server).
func (ix *Index) Snapshot(id ServerID) []Residency {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	s := ix.srv(id)
	if s == nil {
		return nil
	}
	now := ix.tick(ix.cfg.Now())
	out := make([]Residency, 0, s.n)
	for r := s.head; r != nilRec; r = ix.at(r).snext {
		rc := ix.at(r)
		out = append(out, Residency{Key: rc.key, Engine: *ix.eng(r), Speculative: rc.spec > now,
			Copies: [NumTiers]int{int(rc.cnt[0]), int(rc.cnt[1]), int(rc.cnt[2])}})
	}
	return out
}
