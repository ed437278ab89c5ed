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
	"sync"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/memtrim"
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

// WithDefaults fills the fields left zero with their defaults.
func (c Config) WithDefaults() Config {
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

type server struct {
	name   string
	opts   ServerOptions
	bridge u64map // engine hash -> record
	head   uint32 // most recent record of this server
	tail   uint32
	n      int
	win    *window // sliding-window group of a hybrid model; nil when none
	// reset is set by ClearAll (a weight sync) until the server's next
	// Cleared: that clear is the engine's own reset, reported late.
	reset bool

	stored, removed, cleared, unanchored, unresolved uint64
	resetClears, keptSpec                            uint64
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
	cfg = cfg.WithDefaults()
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
	ix.clearServer(id, s, false)
	delete(ix.byName, s.name)
	ix.servers[id] = nil
	ix.freeIDs = append(ix.freeIDs, id)
}

// Cleared applies an engine's AllBlocksCleared: it drops every record of
// the server.
//
// The first Cleared after ClearAll is the weight sync's engine reset
// arriving late: vLLM queues AllBlocksCleared at /reset_prefix_cache and
// publishes it with the engine's next step, which is the next rollout's
// first. By then the router has placed that rollout's first requests
// there, and vLLM resets only an idle cache, so their speculation is newer
// than the reset the event reports: that clear drops the confirmed copies
// (old blocks whose events arrived after the router's reset) and keeps the
// live speculation. Dropping it would send those requests' siblings
// elsewhere until the prefills' BlockStored events arrive.
func (ix *Index) Cleared(id ServerID) error { return ix.clear(id, true) }

// Forget drops every record of a server for a reason of the collector's
// own (an event gap replay could not close, an engine restart). A pending
// weight sync stays pending: the engine's own late reset is still to come
// (Cleared).
func (ix *Index) Forget(id ServerID) error { return ix.clear(id, false) }

// clear is Cleared (engine true: the engine's event) and Forget.
func (ix *Index) clear(id ServerID, engine bool) error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	s := ix.srv(id)
	if s == nil {
		return ErrUnknownServer
	}
	s.cleared++
	keep := engine && s.reset
	if keep {
		s.reset = false
		s.resetClears++
	}
	ix.clearServer(id, s, keep)
	return nil
}

// ClearAll drops every record of every server (a weight update). Each
// server's next Cleared is then taken for its engine's reset (Cleared).
func (ix *Index) ClearAll() {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for id, s := range ix.servers {
		if s != nil {
			s.cleared++
			ix.clearServer(ServerID(id), s, false)
			s.reset = true
		}
	}
}

// clearServer drops a server's records; with keepLive, the live
// speculative ones stay, their copies and engine hashes dropped (a weight
// sync's late reset: Cleared).
func (ix *Index) clearServer(id ServerID, s *server, keepLive bool) {
	now := uint32(0)
	if keepLive {
		now = ix.tick(ix.cfg.Now())
	}
	freed := 0
	for r := s.head; r != nilRec; {
		rc := ix.at(r)
		next := rc.snext
		if keepLive && rc.spec > now {
			was := rc.class()
			rc.cnt = [NumTiers]uint8{}
			ix.reclass(rc, was)
			*ix.eng(r) = 0
			s.keptSpec++
		} else {
			ix.freeRec(r, s)
			freed++
		}
		r = next
	}
	s.bridge.Reset()
	if s.win != nil {
		clear(s.win.held)
	}
	// Clearing a large index leaves its bridges and keys to the GC; on
	// an idle router no GC cycle would come to return that memory.
	memtrim.Note(freed * bytesPerRecord)
}

// bytesPerRecord approximates a record's share of the index's memory
// (record, key map and bridge entries; ~130 B measured per budgeted entry).
const bytesPerRecord = 128
