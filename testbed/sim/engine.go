// Package sim is a deterministic model of a vLLM V1 engine: continuous
// batching with chunked prefill and recompute preemption, a block-level
// prefix cache with vLLM's semantics, optional CPU/SSD offload tiers, KV
// events as vLLM emits them, and a step-time profile. The model owns no
// goroutines and reads no clock: callers pass time in (float64 seconds), so
// the same engine serves the HTTP simulator (wall clock) and trace replay
// (virtual clock). An Engine is not safe for concurrent use.
package sim

import (
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/kvc-router/kvc-router/core/kvcrouter"
	"sort"

	"github.com/cespare/xxhash/v2"
)

// Medium names as used in KV events.
const (
	MediumGPU     = "GPU"
	MediumCPU     = "CPU"
	MediumStorage = "STORAGE"
)

// FinishLength is the only finish reason the simulator produces: every
// request generates exactly MaxTokens tokens (no EOS).
const FinishLength = "length"

// Request is one generation request.
type Request struct {
	ID     string
	Prompt []int32
	// MaxTokens is the exact number of tokens generated (>= 1).
	MaxTokens int
	// Arrival is the submit time (seconds, same clock as Step).
	Arrival float64
	// SamplingSeed varies the generated tokens of identical prompts (like
	// OpenAI's `seed`; use distinct values for the n samples of a group).
	SamplingSeed uint64
}

// TokenOut is one generated token, reported at the end of the step that
// produced it.
type TokenOut struct {
	ID    string
	Token int32
	// Index is the position in the output (0 = first token).
	Index int
	// Finished is set on the last token.
	Finished     bool
	PromptTokens int
	// CachedTokens is the prefix-cache hit of the request's first
	// scheduling (GPU plus tier hits).
	CachedTokens int
}

// Completion describes a finished request.
type Completion struct {
	ID           string
	PromptTokens int
	CachedTokens int
	// OutputTokens is owned by the receiver.
	OutputTokens   []int32
	FinishReason   string
	Arrival        float64
	FirstTokenTime float64
	FinishTime     float64
	Preemptions    int
}

// StepResult is the outcome of one engine step. Tokens and Finished are
// reused by the next Step; Events is freshly allocated.
type StepResult struct {
	Start    float64
	Duration float64
	Events   []kvcrouter.Event
	Tokens   []TokenOut
	Finished []Completion
	// Scheduled counts requests in the batch; PrefillTokens and DecodeTokens
	// split the computed tokens; LoadedBlocks counts tier loads.
	Scheduled     int
	PrefillTokens int
	DecodeTokens  int
	LoadedBlocks  int
	Preempted     int
}

// Stats is a snapshot of the engine's gauges and counters. Token counters
// follow vLLM: PrefixQueries += prompt tokens and PrefixHits += GPU-cached
// tokens at a request's first scheduling; External* do the same for the
// CPU/SSD tiers (queries = tokens not hit on GPU; only when tiers are on).
type Stats struct {
	Running, Waiting int
	// KVUsage is 1 - free/total GPU blocks (cached unreferenced blocks count
	// as free), in [0,1].
	KVUsage         float64
	NumGPUBlocks    int
	FreeGPUBlocks   int
	CachedGPUBlocks int
	CPUBlocks       int // resident in the CPU tier
	SSDBlocks       int // resident in the SSD tier

	PrefixQueries, PrefixHits     int64
	ExternalQueries, ExternalHits int64
	GPUHitTokens, CPUHitTokens    int64
	SSDHitTokens                  int64
	Preemptions                   int64
	PromptTokens                  int64
	GenerationTokens              int64
	Submitted, Finished, Aborted  int64
	Steps                         int64
	BusyTime                      float64
}

// CachedBlock identifies a resident block by engine hash and medium.
type CachedBlock struct {
	Hash   uint64
	Medium string
}

// Errors returned by Submit.
var (
	ErrDuplicateID = errors.New("sim: duplicate request id")
	ErrBadRequest  = errors.New("sim: invalid request")
	ErrTooLong     = errors.New("sim: request does not fit in the KV cache")
)

type request struct {
	id        string
	tokens    []int32 // prompt then outputs; cap = prompt+max
	promptLen int
	maxTokens int
	arrival   float64
	sampleKey uint64

	computed  int     // tokens whose KV is computed (or scheduled this step)
	blocks    []int32 // GPU blocks held
	numCached int     // leading blocks registered in the cache
	hashes    []uint64
	ehashes   []uint64

	cachedTokens int // -1 until first scheduled
	firstAt      float64
	preemptions  int
	running      bool
	done         bool
}

type scheduled struct {
	r        *request
	n        int
	isDecode bool
}

// Engine is the simulated engine core.
type Engine struct {
	cfg   Config
	bs    int
	pool  *gpuPool
	cpu   *tier
	ssd   *tier
	reqs  map[string]*request
	wait  deque
	run   []*request
	sched []scheduled

	hits    []int32
	hashBuf []byte
	events  []kvcrouter.Event
	// pendingEvents go out with the next Step (LazyClearEvent).
	pendingEvents []kvcrouter.Event
	res           StepResult
	loadCPU       int
	loadSSD       int
	arena         []uint64

	st Stats
}

// New builds an engine; zero config fields take defaults.
func New(cfg Config) (*Engine, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	e := &Engine{
		cfg:     cfg,
		bs:      cfg.BlockSize,
		pool:    newGPUPool(cfg.NumGPUBlocks),
		reqs:    make(map[string]*request),
		hashBuf: make([]byte, 8+4*cfg.BlockSize),
	}
	if cfg.CPUBlocks > 0 {
		e.cpu = newTier(MediumCPU, cfg.CPUBlocks)
	}
	if cfg.SSDBlocks > 0 {
		e.ssd = newTier(MediumStorage, cfg.SSDBlocks)
	}
	e.st.NumGPUBlocks = cfg.NumGPUBlocks
	return e, nil
}

// Config returns the effective configuration (defaults applied).
func (e *Engine) Config() Config { return e.cfg }

// HasWork reports whether any request is waiting or running.
func (e *Engine) HasWork() bool { return e.wait.len() > 0 || len(e.run) > 0 }

// Submit queues a request (FCFS). The prompt is copied.
func (e *Engine) Submit(req Request) error {
	if len(req.Prompt) == 0 || req.MaxTokens < 1 {
		return fmt.Errorf("%w: empty prompt or max_tokens < 1", ErrBadRequest)
	}
	if _, ok := e.reqs[req.ID]; ok {
		return fmt.Errorf("%w: %q", ErrDuplicateID, req.ID)
	}
	// The KV of every token but the last generated one is computed.
	if need := (len(req.Prompt) + req.MaxTokens - 1 + e.bs - 1) / e.bs; need > e.cfg.NumGPUBlocks {
		return fmt.Errorf("%w: needs %d blocks, engine has %d", ErrTooLong, need, e.cfg.NumGPUBlocks)
	}
	total := len(req.Prompt) + req.MaxTokens
	r := &request{
		id:           req.ID,
		tokens:       make([]int32, len(req.Prompt), total),
		promptLen:    len(req.Prompt),
		maxTokens:    req.MaxTokens,
		arrival:      req.Arrival,
		cachedTokens: -1,
		firstAt:      -1,
	}
	copy(r.tokens, req.Prompt)
	nb := total / e.bs
	r.hashes = make([]uint64, 0, nb)
	r.ehashes = make([]uint64, 0, nb)
	r.sampleKey = sampleKey(e.cfg.Seed, req.SamplingSeed, req.Prompt)
	e.reqs[r.id] = r
	e.wait.pushBack(r)
	e.st.Submitted++
	return nil
}

// Abort drops a waiting or running request, freeing its blocks. It reports
// whether the request was known.
func (e *Engine) Abort(id string) bool {
	r, ok := e.reqs[id]
	if !ok {
		return false
	}
	delete(e.reqs, id)
	if r.running {
		for i, x := range e.run {
			if x == r {
				e.run = append(e.run[:i], e.run[i+1:]...)
				break
			}
		}
		e.freeBlocks(r)
	} else {
		e.wait.remove(r)
	}
	r.done = true
	e.st.Aborted++
	return true
}

// Step schedules and "executes" one batch starting at now.
func (e *Engine) Step(now float64) StepResult {
	e.res.Tokens = e.res.Tokens[:0]
	e.res.Finished = e.res.Finished[:0]
	e.events, e.pendingEvents = e.pendingEvents, nil
	e.sched = e.sched[:0]
	e.loadCPU, e.loadSSD = 0, 0
	budget := e.cfg.MaxNumBatchedTokens
	preempted := 0

	// Running requests first, in order; preempt the newest on shortage.
	for i := 0; i < len(e.run) && budget > 0; {
		r := e.run[i]
		n := len(r.tokens) - r.computed
		if n > budget {
			n = budget
		}
		if n <= 0 {
			i++
			continue
		}
		ok := false
		for {
			if e.allocate(r, n) {
				ok = true
				break
			}
			victim := e.run[len(e.run)-1]
			e.run = e.run[:len(e.run)-1]
			e.preempt(victim)
			preempted++
			if victim == r {
				break
			}
		}
		if !ok {
			break
		}
		e.sched = append(e.sched, scheduled{r: r, n: n, isDecode: n == 1 && r.computed == len(r.tokens)-1 && r.computed >= r.promptLen})
		budget -= n
		i++
	}
	// Waiting requests only when nothing was preempted (as vLLM).
	if preempted == 0 {
		for e.wait.len() > 0 && budget > 0 && len(e.run) < e.cfg.MaxNumSeqs {
			r := e.wait.front()
			n := e.admit(r, budget)
			if n == 0 {
				break
			}
			e.wait.popFront()
			r.running = true
			e.run = append(e.run, r)
			e.sched = append(e.sched, scheduled{r: r, n: n})
			budget -= n
		}
	}

	res := &e.res
	res.Start = now
	res.Scheduled = len(e.sched)
	res.Preempted = preempted
	res.PrefillTokens, res.DecodeTokens, res.LoadedBlocks = 0, 0, e.loadCPU+e.loadSSD
	if len(e.sched) == 0 {
		res.Duration = 0
		res.Events = e.events
		return *res
	}
	ctx := 0
	pairs := 0.0 // (new token, context token) pairs attended in prefill
	for _, s := range e.sched {
		if s.isDecode {
			res.DecodeTokens++
			ctx += s.r.computed + 1
		} else {
			res.PrefillTokens += s.n
			n := float64(s.n)
			pairs += n*float64(s.r.computed) + n*(n+1)/2
		}
	}
	c := &e.cfg
	dur := c.StepBase + c.PrefillPerToken*float64(res.PrefillTokens) + c.DecodePerToken*float64(res.DecodeTokens) +
		c.DecodePerContextToken*float64(ctx) +
		c.AttentionPerPair*pairs + c.CPULoadPerBlock*float64(e.loadCPU) + c.SSDLoadPerBlock*float64(e.loadSSD)
	res.Duration = dur
	end := now + dur
	e.st.Steps++
	e.st.BusyTime += dur

	finished := 0
	for _, s := range e.sched {
		r := s.r
		r.computed += s.n
		if r.computed != len(r.tokens) {
			continue
		}
		idx := len(r.tokens) - r.promptLen
		tok := sampleToken(r.sampleKey, idx, e.cfg.VocabSize)
		r.tokens = append(r.tokens, tok)
		e.st.GenerationTokens++
		if idx == 0 {
			r.firstAt = end
		}
		fin := idx+1 == r.maxTokens
		res.Tokens = append(res.Tokens, TokenOut{ID: r.id, Token: tok, Index: idx, Finished: fin, PromptTokens: r.promptLen, CachedTokens: r.cachedTokens})
		if fin {
			r.done = true
			finished++
			res.Finished = append(res.Finished, Completion{
				ID: r.id, PromptTokens: r.promptLen, CachedTokens: r.cachedTokens,
				OutputTokens: r.tokens[r.promptLen:len(r.tokens):len(r.tokens)],
				FinishReason: FinishLength, Arrival: r.arrival, FirstTokenTime: r.firstAt,
				FinishTime: end, Preemptions: r.preemptions,
			})
		}
	}
	if finished > 0 {
		k := 0
		for _, r := range e.run {
			if r.done {
				e.freeBlocks(r)
				r.running = false
				delete(e.reqs, r.id)
				e.st.Finished++
				continue
			}
			e.run[k] = r
			k++
		}
		clear(e.run[k:])
		e.run = e.run[:k]
	}
	res.Events = e.events
	return *res
}

// ensureHashes extends r's block hashes to n full blocks.
func (e *Engine) ensureHashes(r *request, n int) {
	bs := e.bs
	buf := e.hashBuf
	for i := len(r.hashes); i < n; i++ {
		var parent uint64
		if i > 0 {
			parent = r.hashes[i-1]
		} else {
			parent = rootHash
		}
		binary.LittleEndian.PutUint64(buf, parent)
		for j, t := range r.tokens[i*bs : (i+1)*bs] {
			binary.LittleEndian.PutUint32(buf[8+4*j:], uint32(t))
		}
		h := xxhash.Sum64(buf)
		r.hashes = append(r.hashes, h)
		r.ehashes = append(r.ehashes, Mix64(h^e.cfg.HashSalt))
	}
}

// admit finds r's prefix hit, allocates blocks for hits loaded from tiers
// and for the first chunk, and returns the tokens scheduled (0 = cannot).
func (e *Engine) admit(r *request, budget int) int {
	bs := e.bs
	maxHit := (len(r.tokens) - 1) / bs
	e.ensureHashes(r, maxHit)
	hits := e.hits[:0]
	evictable := 0
	i := 0
	for ; i < maxHit; i++ {
		id := e.pool.lookup(r.hashes[i])
		if id < 0 {
			break
		}
		if e.pool.b[id].ref == 0 {
			evictable++
		}
		hits = append(hits, id)
	}
	e.hits = hits
	g := i
	cpuHit, ssdHit := 0, 0
	if e.cpu != nil || e.ssd != nil {
		for ; i < maxHit; i++ {
			h := r.hashes[i]
			if e.cpu != nil && e.cpu.has(h) {
				cpuHit++
			} else if e.ssd != nil && e.ssd.has(h) {
				ssdHit++
			} else {
				break
			}
		}
	}
	hitBlocks := i
	computed := hitBlocks * bs
	n := len(r.tokens) - computed
	if n > budget {
		n = budget
	}
	newBlocks := (computed+n+bs-1)/bs - g
	if newBlocks+evictable > e.pool.numFree {
		return 0
	}
	for _, id := range hits {
		e.pool.touch(id)
	}
	r.blocks = append(r.blocks[:0], hits...)
	r.numCached = g
	for j := g; j < hitBlocks; j++ {
		e.pinTier(r.hashes[j], true)
	}
	r.computed = computed
	ok := e.allocate(r, n)
	for j := g; j < hitBlocks; j++ {
		e.pinTier(r.hashes[j], false)
	}
	if !ok {
		panic("sim: allocation failed after capacity check")
	}
	e.loadCPU += cpuHit
	e.loadSSD += ssdHit
	if r.cachedTokens < 0 {
		r.cachedTokens = computed
		e.st.PrefixQueries += int64(r.promptLen)
		e.st.PrefixHits += int64(g * bs)
		e.st.GPUHitTokens += int64(g * bs)
		e.st.CPUHitTokens += int64(cpuHit * bs)
		e.st.SSDHitTokens += int64(ssdHit * bs)
		if e.cpu != nil || e.ssd != nil {
			e.st.ExternalQueries += int64(r.promptLen - g*bs)
			e.st.ExternalHits += int64((cpuHit + ssdHit) * bs)
		}
		e.st.PromptTokens += int64(r.promptLen)
	}
	return n
}

func (e *Engine) pinTier(h uint64, v bool) {
	if e.cpu != nil && e.cpu.has(h) {
		e.cpu.setPinned(h, v)
		if !v {
			e.cpu.touch(h)
		}
		return
	}
	if e.ssd != nil {
		e.ssd.setPinned(h, v)
		if !v {
			e.ssd.touch(h)
		}
	}
}

// allocate gives r the blocks needed to hold computed+n tokens and caches
// the blocks that become full, emitting one BlockStored for the run.
func (e *Engine) allocate(r *request, n int) bool {
	bs := e.bs
	upto := r.computed + n
	need := (upto+bs-1)/bs - len(r.blocks)
	if need > e.pool.numFree {
		return false
	}
	for ; need > 0; need-- {
		id, ev, h, eh := e.pool.popFree()
		if ev {
			e.evicted(h, eh)
		}
		r.blocks = append(r.blocks, id)
	}
	full := upto / bs
	if full > r.numCached {
		e.ensureHashes(r, full)
		from := r.numCached
		for j := from; j < full; j++ {
			e.pool.cache(r.blocks[j], r.hashes[j], r.ehashes[j])
		}
		r.numCached = full
		if !e.cfg.DisableEvents {
			ev := kvcrouter.Event{
				Kind: kvcrouter.EventStored, TypeName: "BlockStored",
				BlockHashes: r.ehashes[from:full:full],
				TokenIDs:    r.tokens[from*bs : full*bs : full*bs],
				BlockSize:   bs, LoraID: -1, Medium: MediumGPU, GroupIdx: -1,
			}
			if from > 0 {
				ev.HasParent, ev.ParentBlockHash = true, r.ehashes[from-1]
			}
			e.events = append(e.events, ev)
		}
	}
	return true
}

// evicted handles a cached GPU block being reallocated: offload into the CPU
// tier (cascading to SSD), then BlockRemoved GPU. Lower-tier stores are
// emitted before the upper-tier removal, as an offloading engine copies a
// block down before freeing it: a consumer that forgets a block once no tier
// holds it never loses track of the offloaded copy (token-less lower-tier
// stores can only be placed through a block it still knows).
func (e *Engine) evicted(h, eh uint64) {
	if e.cpu != nil {
		e.offload(e.cpu, h, eh)
	} else if e.ssd != nil {
		e.offload(e.ssd, h, eh)
	}
	e.emitRemoved(eh, MediumGPU)
}

func (e *Engine) offload(t *tier, h, eh uint64) {
	stored, ev, vh, veh := t.insert(h, eh)
	if stored && !e.cfg.DisableEvents {
		e.events = append(e.events, kvcrouter.Event{
			Kind: kvcrouter.EventStored, TypeName: "BlockStored",
			BlockHashes: e.one(eh), TokenIDs: noTokens,
			LoraID: -1, Medium: t.medium, GroupIdx: -1,
		})
	}
	if ev {
		if t == e.cpu && e.ssd != nil {
			e.offload(e.ssd, vh, veh)
		}
		e.emitRemoved(veh, t.medium)
	}
}

func (e *Engine) emitRemoved(eh uint64, medium string) {
	if e.cfg.DisableEvents {
		return
	}
	e.events = append(e.events, kvcrouter.Event{
		Kind: kvcrouter.EventRemoved, TypeName: "BlockRemoved",
		BlockHashes: e.one(eh), LoraID: -1, Medium: medium, GroupIdx: -1,
	})
}

// noTokens is the (shared, empty) token list of token-less tier events.
var noTokens = []int32{}

// one returns a 1-element hash slice carved from an append-only arena
// (chunks are never reused, so handed-out slices stay valid).
func (e *Engine) one(h uint64) []uint64 {
	if len(e.arena) == cap(e.arena) {
		e.arena = make([]uint64, 0, 256)
	}
	e.arena = append(e.arena, h)
	n := len(e.arena)
	return e.arena[n-1 : n : n]
}

// freeBlocks releases r's blocks, tail first (so a request's tail blocks are
// evicted before its head, as vLLM does).
func (e *Engine) freeBlocks(r *request) {
	for i := len(r.blocks) - 1; i >= 0; i-- {
		e.pool.release(r.blocks[i])
	}
	r.blocks = r.blocks[:0]
	r.numCached = 0
}

func (e *Engine) preempt(r *request) {
	e.freeBlocks(r)
	r.computed = 0
	r.running = false
	r.preemptions++
	e.st.Preemptions++
	e.wait.pushFront(r)
}

// Stats returns a snapshot of gauges and counters.
func (e *Engine) Stats() Stats {
	s := e.st
	s.Running = len(e.run)
	s.Waiting = e.wait.len()
	s.FreeGPUBlocks = e.pool.numFree
	s.CachedGPUBlocks = e.pool.cached
	s.KVUsage = 1 - float64(e.pool.numFree)/float64(e.cfg.NumGPUBlocks)
	if e.cpu != nil {
		s.CPUBlocks = e.cpu.len()
	}
	if e.ssd != nil {
		s.SSDBlocks = e.ssd.len()
	}
	return s
}

// ResetPrefixCache drops every cached block of every tier and emits
// AllBlocksCleared, returned as the events to publish. Like vLLM it refuses
// (ok=false, no event) while blocks are held by running requests unless
// preemptRunning is set, in which case running requests are preempted
// first (they recompute later).
func (e *Engine) ResetPrefixCache(preemptRunning bool) (events []kvcrouter.Event, ok bool) {
	if len(e.run) > 0 {
		if !preemptRunning {
			return nil, false
		}
		for len(e.run) > 0 {
			r := e.run[len(e.run)-1]
			e.run = e.run[:len(e.run)-1]
			e.preempt(r)
		}
	}
	for id := int32(0); id < e.pool.n; id++ {
		if e.pool.b[id].cached {
			e.pool.uncache(id)
		}
	}
	if e.cpu != nil {
		e.cpu.clear()
	}
	if e.ssd != nil {
		e.ssd.clear()
	}
	if e.cfg.DisableEvents {
		return nil, true
	}
	ev := kvcrouter.Event{Kind: kvcrouter.EventCleared, TypeName: "AllBlocksCleared", LoraID: -1, GroupIdx: -1}
	if e.cfg.LazyClearEvent {
		e.pendingEvents = append(e.pendingEvents, ev)
		return nil, true
	}
	return []kvcrouter.Event{ev}, true
}

// CachedBlocks returns the resident blocks of every tier with their copy
// counts (vLLM does not deduplicate GPU blocks with equal hashes).
func (e *Engine) CachedBlocks() map[CachedBlock]int {
	m := make(map[CachedBlock]int, e.pool.cached)
	for id := int32(0); id < e.pool.n; id++ {
		if b := &e.pool.b[id]; b.cached {
			m[CachedBlock{b.ehash, MediumGPU}]++
		}
	}
	for _, t := range []*tier{e.cpu, e.ssd} {
		if t == nil {
			continue
		}
		for _, i := range t.m {
			m[CachedBlock{t.e[i].ehash, t.medium}]++
		}
	}
	return m
}

// EngineHashes returns the engine hashes this engine would publish for the
// full blocks of tokens (useful to map events back to prompts in tests).
func (e *Engine) EngineHashes(tokens []int32) []uint64 {
	r := &request{tokens: tokens}
	e.ensureHashes(r, len(tokens)/e.bs)
	return r.ehashes
}

// SortWaiting puts the waiting requests that have a key in order into key
// order (ties keep their queue order), each taking one of the queue positions
// those requests held; requests without a key keep their positions. A client
// that sends a burst over many connections arrives in the order its threads
// happen to run; the simulator's POST /sim/hold uses this to queue such a
// burst in the order the client numbered it. It returns how many requests it
// placed.
func (e *Engine) SortWaiting(order map[string]int64) int {
	if len(order) == 0 {
		return 0
	}
	var pos []int
	var keyed []*request
	for i := e.wait.head; i < len(e.wait.buf); i++ {
		if _, ok := order[e.wait.buf[i].id]; ok {
			pos = append(pos, i)
			keyed = append(keyed, e.wait.buf[i])
		}
	}
	sort.SliceStable(keyed, func(a, b int) bool { return order[keyed[a].id] < order[keyed[b].id] })
	for k, i := range pos {
		e.wait.buf[i] = keyed[k]
	}
	return len(keyed)
}

// deque is a FIFO with push-front, used for the waiting queue.
type deque struct {
	buf  []*request
	head int
}

func (d *deque) len() int            { return len(d.buf) - d.head }
func (d *deque) front() *request     { return d.buf[d.head] }
func (d *deque) pushBack(r *request) { d.buf = append(d.buf, r) }

func (d *deque) popFront() *request {
	r := d.buf[d.head]
	d.buf[d.head] = nil
	d.head++
	if d.head == len(d.buf) {
		d.buf, d.head = d.buf[:0], 0
	} else if d.head > 1024 && d.head*2 > len(d.buf) {
		n := copy(d.buf, d.buf[d.head:])
		clear(d.buf[n:])
		d.buf, d.head = d.buf[:n], 0
	}
	return r
}

func (d *deque) pushFront(r *request) {
	if d.head > 0 {
		d.head--
		d.buf[d.head] = r
		return
	}
	d.buf = append(d.buf, nil)
	copy(d.buf[1:], d.buf)
	d.buf[0] = r
}

func (d *deque) remove(r *request) {
	for i := d.head; i < len(d.buf); i++ {
		if d.buf[i] == r {
			copy(d.buf[i:], d.buf[i+1:])
			d.buf[len(d.buf)-1] = nil
			d.buf = d.buf[:len(d.buf)-1]
			return
		}
	}
}
