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
	"math"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/kvc-router/kvc-router/core/blockhash"
	"github.com/kvc-router/kvc-router/core/index"
	"github.com/kvc-router/kvc-router/core/load"
	"github.com/kvc-router/kvc-router/core/strategy"
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
	ix      index.ServerID
	spec    ServerSpec
	events  bool
	gpuBlks int
	// sessions counts sticky bindings to this id (shared with
	// Router.sessions, so a removed and re-added id keeps its count).
	sessions *int
	writer   *eventWriter // made on first EventWriter call
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
	pool     []*server
	byID     map[string]*server
	seq      int
	now      func() time.Time

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

	// Admission (admission.go): held requests, oldest first.
	admit    bool
	queue    []held
	adm      AdmissionStatus
	pickMemo map[uint64]uint8

	latency latencyHist // acquireLocked's duration (latency.go)
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
		pickMemo:     map[uint64]uint8{},
	}
	sticky, err := simplelru.NewLRU[string, string](cfg.StickyMaxSize, r.unbound)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	r.sticky = sticky
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
		r.pool = append(r.pool, s)
		r.byID[id] = s
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
		for i, p := range r.pool {
			if p == s {
				r.pool = append(r.pool[:i], r.pool[i+1:]...)
				break
			}
		}
		r.ix.RemoveServer(s.ix)
		r.ld.Remove(id)
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
	if !ok {
		return false
	}
	return r.ld.Update(id, m)
}

// Release counts one request finished on a server; unknown ids and zero
// counts are silent no-ops, as in verl.
func (r *Router) Release(id string) bool {
	ok := r.ld.Release(id)
	if ok {
		r.mu.Lock()
		r.counters.Releases++
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
// prefix). Sticky bindings and in-flight counts are unchanged.
func (r *Router) ResetCache() { r.ix.ClearAll() }

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
	c := &r.counters
	c.PromptTokens += uint64(len(req.Tokens))
	gpu, cpu, ssd := uint64(d.HitBlocks[index.GPU]*d.BlockSize), uint64(d.HitBlocks[index.CPU]*d.BlockSize),
		uint64(d.HitBlocks[index.SSD]*d.BlockSize)
	c.PredictedHits += gpu + cpu + ssd
	c.PredictedHitsGPU += gpu
	c.PredictedHitsCPU += cpu
	c.PredictedHitsSSD += ssd
}

func (r *Router) decide(req *Request) (Decision, error) {
	for k := range r.keys {
		r.keys[k] = r.keys[k][:0]
	}
	var bound *server
	if !req.Probe && r.sticky.Contains(req.ID) {
		sid, _ := r.sticky.Get(req.ID) // a read refreshes recency, as cachetools does
		if s, ok := r.byID[sid]; ok {
			bound = s
		} else {
			r.sticky.Remove(req.ID)
			r.counters.StickyStale++
		}
	}
	if len(r.pool) == 0 {
		r.counters.NoServers++
		return Decision{}, ErrNoServers
	}
	if bound != nil && !r.kvc {
		r.counters.StickyHits++
		return Decision{Server: bound.id, Reason: ReasonSticky, Candidates: len(r.pool)}, nil
	}
	if bound == nil && req.Pin >= 0 {
		s := r.pool[req.Pin%len(r.pool)]
		r.bind(req, s.id)
		r.counters.Pinned++
		if r.speculate {
			r.speculateOn(s, req, 0)
		}
		return Decision{Server: s.id, Reason: ReasonPinned, Candidates: len(r.pool)}, nil
	}

	n := r.fillCandidates(req)
	if bound != nil {
		for i := 0; i < n; i++ {
			c := &r.cands[i]
			if c.ID != bound.id {
				continue
			}
			if !r.overload || (c.Healthy && strategy.EffectiveLoad(r.strat, c) <= r.threshold) {
				if j := r.sessionMove(req, i, n); j >= 0 {
					r.counters.StickyBroken++
					r.counters.SessionMoves++
					d := r.decision(j, ReasonRebalanced, n)
					r.bind(req, d.Server)
					r.speculateOn(r.cpool[j], req, r.cands[j].Hit.Blocks)
					return d, nil
				}
				r.counters.StickyHits++
				d := r.decision(i, ReasonSticky, n)
				r.speculateOn(bound, req, c.Hit.Blocks)
				return d, nil
			}
			break
		}
	}
	r.strat.Score(&strategy.Request{ID: req.ID, Tokens: req.Tokens, SessionsBound: r.bound,
		LaterTurns: r.counters.StickyHits + r.counters.StickyBroken}, r.cands[:n], r.scores[:n])
	if r.admit {
		// Never send a new binding to a full server while one has room.
		room := false
		for i := 0; i < n; i++ {
			if r.hasRoom(r.cpool[i]) {
				room = true
				break
			}
		}
		for i := 0; room && i < n; i++ {
			if !r.hasRoom(r.cpool[i]) {
				r.scores[i] = math.Inf(-1)
			}
		}
	}
	best := strategy.Pick(r.cands[:n], r.scores[:n])
	reason := ReasonScored
	if bound != nil {
		reason = ReasonRebalanced
		r.counters.StickyBroken++
	} else {
		r.counters.Scored++
	}
	d := r.decision(best, reason, n)
	r.bind(req, d.Server)
	r.speculateOn(r.byID[d.Server], req, r.cands[best].Hit.Blocks)
	return d, nil
}

// sessionMove decides whether a multi-turn session bound to candidate i
// leaves it at this turn, and for which candidate (-1: it stays).
//
// Placement cannot tell, at a session's first request, whether it will
// send more: kvc_aware keeps siblings (requests sharing a whole prompt)
// together, which suits GRPO samples but piles an agent task's
// trajectories onto one server — with fewer tasks than servers, some
// servers then idle for the whole step. Once the router has seen later
// turns (strategy.MultiTurn), a session whose server is bound to at
// least max(2, mean/2) sessions more than the least-bound healthy server
// moves there: one prefill of its context buys every later turn a server
// of its own. Sessions bound to one server in that excess are moved one
// per turn boundary, so the counts level out.
func (r *Router) sessionMove(req *Request, i, n int) int {
	if !r.moveSessions || n < 2 {
		return -1
	}
	if strategy.MultiTurn(&strategy.Request{SessionsBound: r.bound, LaterTurns: r.counters.StickyHits + r.counters.StickyBroken}) < 0.5 {
		return -1
	}
	total, j := 0, -1
	for k := 0; k < n; k++ {
		c := &r.cands[k]
		total += c.Sessions
		if k == i || !c.Healthy || strategy.EffectiveLoad(r.strat, c) > r.threshold || (r.admit && !r.hasRoom(r.cpool[k])) {
			continue
		}
		if j < 0 || c.Sessions < r.cands[j].Sessions ||
			(c.Sessions == r.cands[j].Sessions && c.Inflight < r.cands[j].Inflight) {
			j = k
		}
	}
	if j < 0 {
		return -1
	}
	mean := float64(total) / float64(n)
	if float64(r.cands[i].Sessions-r.cands[j].Sessions) < max(2, mean/2) {
		return -1
	}
	return j
}

func (r *Router) bind(req *Request, server string) {
	if req.Probe {
		return
	}
	// Add on a present key replaces the value without the eviction
	// callback, so a rebind moves the count here.
	old, rebind := r.sticky.Peek(req.ID)
	if rebind {
		if old == server {
			r.sticky.Add(req.ID, server)
			return
		}
		r.unbound(req.ID, old)
	}
	r.sticky.Add(req.ID, server)
	*r.sessionCount(server)++
	if !rebind {
		r.bound++
	}
}

func (r *Router) decision(i int, reason string, n int) Decision {
	c := &r.cands[i]
	return Decision{
		Server: c.ID, Reason: reason, Score: r.scores[i], Load: c.Load,
		HitBlocks: c.Hit.Tier, HittableBlocks: c.HittableBlocks, BlockSize: r.bsizes[i], Candidates: n,
	}
}

func (r *Router) blockSize(s *server) int {
	sn, _ := r.ld.Get(s.id)
	return blockSizeOf(s, &sn, r.cfg.BlockSize)
}

// fillCandidates snapshots load for every pool member, drops unhealthy ones
// while a healthy one remains, and (kvc_aware) matches the prompt's prefix.
func (r *Router) fillCandidates(req *Request) int {
	np := len(r.pool)
	r.names = r.names[:0]
	for _, s := range r.pool {
		r.names = append(r.names, s.id)
	}
	r.snaps = grow(r.snaps, np)
	r.ld.GetMany(r.names, r.snaps)
	healthy := 0
	for i := range r.snaps[:np] {
		if r.snaps[i].Healthy {
			healthy++
		}
	}
	r.cands = grow(r.cands, np)
	r.scores = grow(r.scores, np)
	r.bsizes = grow(r.bsizes, np)
	r.cpool = grow(r.cpool, np)
	n := 0
	for i, s := range r.pool {
		sn := &r.snaps[i]
		if healthy > 0 && !sn.Healthy {
			continue
		}
		r.cands[n] = candidateOf(s, sn)
		r.bsizes[n] = blockSizeOf(s, sn, r.cfg.BlockSize)
		r.cpool[n] = s
		n++
	}
	if !r.kvc || len(req.Tokens) == 0 {
		return n
	}
	// One key chain per distinct block size among the candidates.
	ns := blockhash.Namespace(r.cfg.Model, req.Lora)
	for first := 0; first < n; {
		bs := r.bsizes[first]
		r.ids = r.ids[:0]
		r.members = r.members[:0]
		next := n
		for i := first; i < n; i++ {
			switch {
			case r.bsizes[i] == bs:
				r.members = append(r.members, i)
				r.ids = append(r.ids, r.cpool[i].ix)
				r.bsizes[i] = -bs // processed
			case r.bsizes[i] > 0 && i < next:
				next = i
			}
		}
		// Every key is hashed before the index is read (outside its
		// lock): speculation needs the keys beyond the matched prefix
		// and the memo keeps them all, so stopping at the end of the
		// match would save nothing.
		keys := r.memo.AppendKeys(r.keys[bs][:0], req.Tokens, bs, ns)
		r.keys[bs] = keys
		hittable := blockhash.HittableBlocks(len(req.Tokens), bs)
		r.matches = grow(r.matches, len(r.members))
		r.scratch = r.ix.MatchPrefixPrefetch(keys[:hittable], r.memo.Reused(), r.ids, r.matches, r.scratch)
		for j, i := range r.members {
			r.cands[i].Hit = r.matches[j]
			r.cands[i].HittableBlocks = hittable
		}
		first = next
	}
	for i := 0; i < n; i++ {
		r.bsizes[i] = -r.bsizes[i]
	}
	return n
}

// candidateOf is what a strategy sees of s before prefix matching.
func candidateOf(s *server, sn *load.Snapshot) strategy.Candidate {
	return strategy.Candidate{
		ID: s.id, Order: s.order, Inflight: sn.Inflight, InflightTokens: sn.InflightTokens,
		Load: sn.Load, Fresh: sn.Fresh, Healthy: sn.Healthy, KVCapacityTokens: kvCapacity(sn),
		Sessions: *s.sessions,
	}
}

// kvCapacity is a server's GPU KV capacity in tokens, from its metrics.
func kvCapacity(sn *load.Snapshot) int {
	if !sn.HasMetric {
		return 0
	}
	if m := sn.Metrics; m.NumGPUBlocks > 0 && m.BlockSize > 0 {
		return m.NumGPUBlocks * m.BlockSize
	}
	return sn.Metrics.KVCacheSizeTokens
}

func blockSizeOf(s *server, sn *load.Snapshot, def int) int {
	if sn.HasMetric && sn.Metrics.BlockSize > 0 {
		return sn.Metrics.BlockSize
	}
	if s.spec.BlockSize > 0 {
		return s.spec.BlockSize
	}
	return def
}

// speculateOn records the prompt's blocks beyond the matched prefix as
// presumed resident on s, so siblings routed before any event arrives find
// them.
func (r *Router) speculateOn(s *server, req *Request, matched int) {
	if !r.speculate || s == nil || len(req.Tokens) == 0 {
		return
	}
	bs := r.blockSize(s)
	keys, ok := r.keys[bs]
	if !ok || len(keys) != blockhash.FullBlocks(len(req.Tokens), bs) {
		keys = r.memo.AppendKeys(r.keys[bs][:0], req.Tokens, bs, blockhash.Namespace(r.cfg.Model, req.Lora))
		r.keys[bs] = keys
	}
	if matched < len(keys) {
		r.ix.Speculate(s.ix, keys[matched:])
	}
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n, n+n/2)
	}
	return s[:n]
}
