// Package router decides which server serves each request. It owns the
// active server pool (in insertion order), sticky request bindings, and the
// glue between the block index, the load store and the scoring strategy.
//
// In default mode it reproduces verl's GlobalRequestLoadBalancer exactly:
// sticky LRU first (a read refreshes recency, a binding to a removed server is
// dropped lazily), then the fewest in-flight requests with ties to the server
// added first. In kvc_aware mode a sticky binding is honoured unless its
// server is overloaded or unhealthy, and new picks are scored by the
// configured strategies over prefix-cache hits and load.
package router

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/kvc-router/kvc-router/core/internal/blockhash"
	"github.com/kvc-router/kvc-router/core/internal/index"
	"github.com/kvc-router/kvc-router/core/internal/load"
	"github.com/kvc-router/kvc-router/core/internal/strategy"
)

// NoServersMessage is verl's exact empty-pool error text.
const NoServersMessage = "No available servers in load balancer"

// ErrNoServers is returned by Acquire when the pool is empty.
var ErrNoServers = errors.New(NoServersMessage)

// ErrPromptTooLong is returned for prompts over Config.MaxPromptTokens.
var ErrPromptTooLong = errors.New("router: prompt exceeds max_prompt_tokens")

// Reasons a decision gives.
const (
	ReasonSticky     = "sticky"
	ReasonScored     = "scored"
	ReasonPinned     = "pinned"
	ReasonRebalanced = "rebalanced"
)

// Request is one routing request.
type Request struct {
	ID     string
	Tokens []int32
	// Pin >= 0 selects server Pin mod len(pool) for a new binding
	// (verl's full_determinism; the caller computes the hash).
	Pin int
	// Lora names the adapter, part of the key namespace.
	Lora string
	// Probe neither reads nor writes a sticky binding (what-if queries,
	// tests). Every other request, even with an empty ID, is bound as
	// verl binds it.
	Probe bool
	// Hint is a caller's prediction of the output length in tokens (0 =
	// none); admission's longest-first order prefers it to what the
	// router learnt (LengthsSpec). Benchmarks' reference rows pass the
	// true length.
	Hint float64
}

// Decision explains one routing choice.
type Decision struct {
	Server string  `json:"server"`
	Reason string  `json:"reason"`
	Score  float64 `json:"score"`
	Load   float64 `json:"load"`
	// HitBlocks is the predicted prefix hit on Server, per tier.
	HitBlocks      [index.NumTiers]int `json:"hit_blocks"`
	HittableBlocks int                 `json:"hittable_blocks"`
	BlockSize      int                 `json:"block_size"`
	Candidates     int                 `json:"candidates"`
}

type server struct {
	id      string
	order   int // monotonically increasing insertion sequence
	pos     int // index in Router.pool (kept on removals)
	ix      index.ServerID
	spec    ServerSpec
	events  bool
	gpuBlks int
	// sessions counts sticky bindings to this id (shared with
	// Router.sessions, so a removed and re-added id keeps its count).
	sessions *int
	writer   *eventWriter // made on first EventWriter call
	// evBlock is the block size the server's BlockStored events carry (the
	// largest seen; 0 before the first). It keys prompts until metrics
	// report one: a server fed by events alone, or before its first
	// scrape, must be queried with the keys its events were indexed under.
	evBlock atomic.Int32
}

// Router is safe for concurrent use.
type Router struct {
	mu        sync.Mutex
	cfg       Config
	kvc       bool
	overload  bool
	speculate bool
	threshold float64
	strat     strategy.Strategy
	ix        *index.Index
	ld        *load.Store
	sticky    *simplelru.LRU[string, string]
	// sessions counts live sticky bindings per server id: +1 on bind, -1
	// on rebind, eviction, stale removal and purge (the LRU's eviction
	// callback), so a candidate's Sessions is a pointer read per decision.
	sessions map[string]*int
	bound    uint64 // new bindings made (sessions started)
	turns    strategy.Turns
	respToks int
	// promptMean is the running mean of the prompts placed (notePrompt),
	// over promptN of them.
	promptMean float64
	promptN    uint64
	pool       []*server
	byID       map[string]*server
	seq        int
	now        func() time.Time

	// Per-decision buffers, reused under mu.
	names   []string
	snaps   []load.Snapshot
	cands   []strategy.Candidate
	scores  []float64
	ids     []index.ServerID
	matches []index.Match
	scratch []int32
	bsizes  []int
	cpool   []*server
	members []int
	keys    map[int][]uint64
	memo    blockhash.Memo // keys of recent prompts: siblings and next turns hash only new blocks

	counters Counters

	moveSessions bool
	moveTokens   float64 // session_move_tokens (0: off)

	// Admission (admission.go): held requests.
	admit bool
	aq    admissionState

	latency latencyHist // acquireLocked's duration (latency.go)

	// The last decision, stage by stage (explain.go), and the room
	// filter's mask (pipeline.go).
	trace  trace
	masked []bool
	sreq   strategy.Request

	lens *lenState // response-length learning (lengths.go); nil when off

	// groups counts each prompt's placements per server this step
	// (groups.go); nil unless the strategy reads them (group_spread > 0).
	groups *simplelru.LRU[uint64, groupPlaced]
}

// Counters are cumulative decision statistics.
type Counters struct {
	Acquires      uint64 `json:"acquires"`
	Releases      uint64 `json:"releases"`
	StickyHits    uint64 `json:"sticky_hits"`
	StickyBroken  uint64 `json:"sticky_broken"`
	StickyStale   uint64 `json:"sticky_stale"`
	Scored        uint64 `json:"scored"`
	Pinned        uint64 `json:"pinned"`
	NoServers     uint64 `json:"no_servers"`
	Rejected      uint64 `json:"rejected"`
	PromptTokens  uint64 `json:"prompt_tokens"`
	PredictedHits uint64 `json:"predicted_hit_tokens"`
	// The predicted hit per tier (their sum is PredictedHits).
	PredictedHitsGPU uint64 `json:"predicted_hit_tokens_gpu"`
	PredictedHitsCPU uint64 `json:"predicted_hit_tokens_cpu"`
	PredictedHitsSSD uint64 `json:"predicted_hit_tokens_ssd"`
	// SessionMoves counts multi-turn sessions moved at a turn boundary
	// off a server bound to far more sessions than another (sessionMove).
	SessionMoves uint64 `json:"session_moves"`
	// SessionMovesTokens counts the moves among them made by in-flight
	// context (session_move_tokens).
	SessionMovesTokens uint64 `json:"session_moves_tokens"`
}

// New builds a router from a normalised or raw config.
func New(cfg Config) (*Router, error) {
	if err := cfg.normalise(); err != nil {
		return nil, err
	}
	strat, threshold, err := cfg.buildStrategy()
	if err != nil {
		return nil, err
	}
	kvc := cfg.Mode == ModeKVCAware
	now := cfg.Now
	if now == nil {
		now = time.Now
	}
	r := &Router{
		cfg:          cfg,
		kvc:          kvc,
		overload:     kvc && boolOr(cfg.StickyOverload, true),
		speculate:    kvc && boolOr(cfg.Speculate, true),
		threshold:    threshold,
		strat:        strat,
		ix:           index.New(cfg.indexConfig()),
		ld:           load.New(cfg.loadConfig()),
		sessions:     make(map[string]*int),
		byID:         make(map[string]*server),
		keys:         make(map[int][]uint64),
		now:          now,
		admit:        kvc && cfg.Admission.Enabled,
		moveSessions: kvc && boolOr(cfg.SessionMoves, true),
		moveTokens:   cfg.sessionMoveTokens(),
		turns:        turnsOf(cfg.Turns),
		respToks:     cfg.ResponseTokens,
		aq:           newAdmissionState(),
		lens:         newLenState(cfg.Lengths),
	}
	sticky, err := simplelru.NewLRU[string, string](cfg.StickyMaxSize, r.unbound)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	r.sticky = sticky
	if kvc && strategy.ReadsSiblings(strat) {
		r.groups = newGroups()
	}
	if kvc && strategy.ReadsWork(strat) {
		if r.lens == nil {
			return nil, configErr("strategies", "kvc_aware's work_weight reads the lengths the router learns: set lengths.enabled true, or work_weight 0")
		}
		r.lens.work = map[string]workSum{}
	}
	if kvc && r.lens == nil && strategy.ReadsLengthCorr(strat) {
		r.lens = newCorrLearner()
	}
	return r, nil
}

// sessionCount is the binding counter of a server id, created on first use.
func (r *Router) sessionCount(id string) *int {
	p := r.sessions[id]
	if p == nil {
		p = new(int)
		r.sessions[id] = p
	}
	return p
}

// unbound is the sticky LRU's eviction callback (eviction, Remove, Purge);
// it runs under r.mu, inside the LRU call.
func (r *Router) unbound(_ string, server string) {
	if p := r.sessions[server]; p != nil && *p > 0 {
		*p--
	}
}

// Config returns the normalised configuration.
func (r *Router) Config() Config { return r.cfg }

// AddServers appends new servers to the pool; re-adding a present server
// keeps its position and resets its in-flight count to zero.
func (r *Router) AddServers(ids []string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, id := range ids {
		if err := CheckServerID(id); err != nil {
			return fmt.Errorf("router: server id %d: %w", i, err)
		}
	}
	for _, id := range ids {
		r.ld.Add(id)
		if _, ok := r.byID[id]; ok {
			r.resetWork(id)
			continue
		}
		spec := r.cfg.Servers[id]
		s := &server{id: id, order: r.seq, spec: spec, events: boolOr(spec.Events, r.cfg.EventsDefault), sessions: r.sessionCount(id)}
		r.seq++
		ixID, err := r.ix.AddServer(id, r.indexOptions(s))
		if err != nil {
			return err
		}
		s.ix = ixID
		s.pos = len(r.pool)
		r.pool = append(r.pool, s)
		r.byID[id] = s
		r.resetWork(id)
	}
	if len(r.pool) > 0 {
		r.aq.emptySince = time.Time{}
	}
	return nil
}

// indexOptions caps an approximate server's records at its KV capacity
// (nothing else removes them). An event-fed server is not capped: its
// events say what it holds, and a cap would let speculative records evict
// confirmed ones (and their bridges, orphaning later runs as unanchored).
func (r *Router) indexOptions(s *server) index.ServerOptions {
	capacity := s.spec.Capacity
	if capacity == 0 && !s.events {
		capacity = s.gpuBlks
	}
	return index.ServerOptions{Approximate: !s.events, Capacity: capacity}
}

// RemoveServers drops servers from the pool and their residency from the
// index. Sticky bindings to them are dropped lazily on next use. Unknown ids
// are ignored.
func (r *Router) RemoveServers(ids []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range ids {
		s, ok := r.byID[id]
		if !ok {
			continue
		}
		delete(r.byID, id)
		if r.lens != nil {
			delete(r.lens.work, id) // a nil map (work not read) deletes nothing
		}
		for i, p := range r.pool {
			if p == s {
				r.pool = append(r.pool[:i], r.pool[i+1:]...)
				for _, q := range r.pool[i:] {
					q.pos--
				}
				break
			}
		}
		r.ix.RemoveServer(s.ix)
		r.ld.Remove(id)
		delete(r.aq.recon, id)
	}
	if len(r.pool) == 0 && r.aq.emptySince.IsZero() {
		r.aq.emptySince = r.now()
	}
}

// Servers lists the active pool in insertion order.
func (r *Router) Servers() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, len(r.pool))
	for i, s := range r.pool {
		out[i] = s.id
	}
	return out
}

// Position is id's index in the pool (Servers' order), -1 when absent. The
// C ABI answers acquires with it; the router's pool is the only copy.
func (r *Router) Position(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s, ok := r.byID[id]; ok {
		return s.pos
	}
	return -1
}

// SetEventFeed declares whether a server's residency comes from KV events
// (authoritative) or from routing decisions alone (approximate).
func (r *Router) SetEventFeed(id string, on bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.byID[id]
	if !ok {
		return false
	}
	s.events = on
	r.ix.SetOptions(s.ix, r.indexOptions(s))
	return true
}

// UpdateMetrics stores a metrics snapshot for a server. It returns false for
// a server not in the pool.
func (r *Router) UpdateMetrics(id string, m load.Metrics) bool {
	r.mu.Lock()
	s, ok := r.byID[id]
	blocks := m.NumGPUBlocks
	if blocks == 0 && m.KVCacheSizeTokens > 0 {
		bs := m.BlockSize
		if bs <= 0 {
			bs = r.cfg.BlockSize
		}
		blocks = m.KVCacheSizeTokens / bs
	}
	if ok && blocks > 0 && blocks != s.gpuBlks {
		s.gpuBlks = blocks
		r.ix.SetOptions(s.ix, r.indexOptions(s))
	}
	r.mu.Unlock()
	if !ok || !r.ld.Update(id, m) {
		return false
	}
	if r.admit {
		r.mu.Lock()
		if r.byID[id] == s {
			r.reconcile(id, &m)
		}
		r.mu.Unlock()
	}
	return true
}

// Release counts one request finished on a server; unknown ids and zero
// counts are silent no-ops, as in verl.
func (r *Router) Release(id string) bool {
	ok := r.ld.Release(id)
	if ok {
		r.mu.Lock()
		r.counters.Releases++
		r.workIdle(id)
		r.mu.Unlock()
	}
	return ok
}

// Inflight returns a server's in-flight count (0 if unknown).
func (r *Router) Inflight(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.byID[id]; !ok {
		return 0
	}
	return r.ld.Inflight(id)
}

// ServerLoad is one pool member's in-flight count.
type ServerLoad struct {
	ID       string `json:"id"`
	Inflight int    `json:"inflight"`
}

// Loads returns the in-flight count of every pool member, in pool order.
func (r *Router) Loads() []ServerLoad {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.loadsLocked()
}

func (r *Router) loadsLocked() []ServerLoad {
	out := make([]ServerLoad, len(r.pool))
	for i, s := range r.pool {
		out[i] = ServerLoad{ID: s.id, Inflight: r.ld.Inflight(s.id)}
	}
	return out
}

// TotalInflight sums in-flight counts over the pool.
func (r *Router) TotalInflight() int {
	total := 0
	for _, l := range r.Loads() {
		total += l.Inflight
	}
	return total
}

// ClearSticky drops every binding; in-flight counts are unchanged.
func (r *Router) ClearSticky() (int, []ServerLoad) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := r.sticky.Len()
	r.sticky.Purge()
	return n, r.loadsLocked()
}

// ResetCache forgets all residency (a weight update invalidates every cached
// prefix). Sticky bindings and in-flight counts are unchanged; the length
// learner keeps its history and starts a new step.
func (r *Router) ResetCache() {
	r.ix.ClearAll()
	r.mu.Lock()
	r.lenNextStep()
	if r.groups != nil {
		r.groups.Purge()
	}
	r.mu.Unlock()
}

// Acquire routes one request and counts it in flight on the chosen server.
func (r *Router) Acquire(req Request) (Decision, error) {
	if len(req.Tokens) > r.cfg.MaxPromptTokens {
		r.mu.Lock()
		r.counters.Rejected++
		r.mu.Unlock()
		return Decision{}, fmt.Errorf("%w: %d tokens > %d", ErrPromptTooLong, len(req.Tokens), r.cfg.MaxPromptTokens)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.acquireLocked(&req)
}

// acquireLocked is Acquire under r.mu.
func (r *Router) acquireLocked(req *Request) (Decision, error) {
	start := time.Now()
	r.counters.Acquires++
	r.notePrompt(len(req.Tokens))
	d, err := r.decide(req)
	if err != nil {
		r.latency.observe(time.Since(start))
		return d, err
	}
	r.charge(req, &d)
	r.latency.observe(time.Since(start))
	return d, nil
}

// charge counts a decided request in flight on its server and in the
// prompt and predicted-hit counters; r.mu held.
func (r *Router) charge(req *Request, d *Decision) {
	r.ld.Acquire(d.Server, len(req.Tokens))
	r.lenTrack(req, d.Server)
	c := &r.counters
	c.PromptTokens += uint64(len(req.Tokens))
	gpu, cpu, ssd := uint64(d.HitBlocks[index.GPU]*d.BlockSize), uint64(d.HitBlocks[index.CPU]*d.BlockSize),
		uint64(d.HitBlocks[index.SSD]*d.BlockSize)
	c.PredictedHits += gpu + cpu + ssd
	c.PredictedHitsGPU += gpu
	c.PredictedHitsCPU += cpu
	c.PredictedHitsSSD += ssd
}

func (r *Router) blockSize(s *server) int {
	sn, _ := r.ld.Get(s.id)
	return blockSizeOf(s, &sn, r.cfg.BlockSize)
}

// kvCapacity is a server's GPU KV capacity in tokens, from its metrics.
func kvCapacity(sn *load.Snapshot) int {
	if !sn.HasMetric {
		return 0
	}
	// kv_cache_size_tokens first: a hybrid model's num_gpu_blocks counts
	// the blocks of every KV-cache group (vLLM 0.32: twice the tokens).
	if m := sn.Metrics; m.KVCacheSizeTokens > 0 {
		return m.KVCacheSizeTokens
	}
	if m := sn.Metrics; m.NumGPUBlocks > 0 && m.BlockSize > 0 {
		return m.NumGPUBlocks * m.BlockSize
	}
	return 0
}

func blockSizeOf(s *server, sn *load.Snapshot, def int) int {
	if sn.HasMetric && sn.Metrics.BlockSize > 0 {
		return sn.Metrics.BlockSize
	}
	if bs := s.evBlock.Load(); bs > 0 {
		return int(bs)
	}
	if s.spec.BlockSize > 0 {
		return s.spec.BlockSize
	}
	return def
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n, n+n/2)
	}
	return s[:n]
}
