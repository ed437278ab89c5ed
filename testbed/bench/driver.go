package bench

import (
	"container/heap"
	"errors"
	"fmt"
	"github.com/kvc-router/kvc-router/core/kvcrouter"
	"math"
	"math/rand/v2"
	"sort"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/kvc-router/kvc-router/testbed/peers"
	"github.com/kvc-router/kvc-router/testbed/sim"
)

// EngineSpec sizes the simulated fleet. Zero fields take sim defaults.
type EngineSpec struct {
	Engines          int
	GPUBlocks        int
	CPUBlocks        int
	BlockSize        int
	MaxNumSeqs       int
	MaxBatchedTokens int
	// PrefillPerToken overrides the engines' prefill cost per uncached
	// token in seconds (0 = the sim default); a tiny value makes prefill
	// free, as if every prompt were fully cached (the makespan bound).
	PrefillPerToken float64
	// Model names the engine step-time model (sim.EngineModels; "" =
	// default).
	Model string
	// Seed is shared by every engine, so equal prompts with equal sampling
	// seeds generate equal tokens whichever engine serves them; this keeps
	// multi-turn workloads identical across policies.
	Seed uint64
}

// SimConfig is one engine's configuration (without its hash salt). A
// prefill cost below 1 ns a token marks the prefill-free bound run, whose
// prefill attention is free too.
func (es EngineSpec) SimConfig() (sim.Config, error) {
	c, err := sim.Config{BlockSize: es.BlockSize, NumGPUBlocks: es.GPUBlocks, CPUBlocks: es.CPUBlocks,
		MaxNumSeqs: es.MaxNumSeqs, MaxNumBatchedTokens: es.MaxBatchedTokens, Seed: es.Seed,
		PrefillPerToken: es.PrefillPerToken}.WithModel(es.Model)
	if err != nil {
		return c, err
	}
	if es.PrefillPerToken > 0 && es.PrefillPerToken < 1e-9 {
		c.AttentionPerPair = 0
	}
	return c, nil
}

// Options tune one replay.
type Options struct {
	Engines EngineSpec
	// ScrapeInterval is the metrics push period in virtual seconds
	// (default 0.1) for policies that do not set their own.
	ScrapeInterval float64
	// EventDelay delays KV-event delivery to the router (virtual seconds).
	EventDelay float64
	// ArrivalSpread spreads the arrivals a phase starts with (a GRPO
	// step's B×n requests, an agent step's first turns) uniformly over
	// [0, ArrivalSpread) virtual seconds, as a rollout client submitting
	// them one by one does; 0 = all at the phase start.
	ArrivalSpread float64
	// OracleLongestFirst submits each phase's initial arrivals in order of
	// their true response length, longest first: a reference for what
	// length knowledge (which no router has: verl sends one max_tokens for
	// every sample) would buy, not a policy.
	OracleLongestFirst bool
	// ClientRate, when > 0, submits each phase's initial arrivals as verl's
	// client path does (VerlArrivals): in batch order, split into
	// ClientWorkers contiguous chunks (agent-loop workers, default 8)
	// interleaved at ClientRate acquires per second in total. 0 = all at
	// the phase start (the single-instant burst).
	ClientRate    float64
	ClientWorkers int
	// Record keeps per-request block chains for the bounds.
	Record bool
	// Progress, when set, is incremented once per completed request.
	Progress *atomic.Int64
}

// Policy is one routing policy: how to build its router and how to drive it.
type Policy struct {
	Name string
	// Config builds the router configuration; sig is the run's view of
	// the fleet for peer strategies that read more than a Candidate.
	Config func(sig peers.Signals) kvcrouter.RouterConfig
	// StickyIDs passes the workload's request_id to the router (sticky
	// sessions); otherwise each submission carries its own unique id.
	StickyIDs bool
	// Events feeds the engines' KV events to the router.
	Events bool
	// Scrape is the policy's own metrics period (0 = Options.ScrapeInterval).
	Scrape float64
	// Sessions answers peers.Signals.Session from the workload's
	// request_id (the server of the session's previous request).
	Sessions bool
	// ActiveBlocks tracks every engine's active prompt blocks for
	// peers.Signals.Active (Dynamo's deduplicated decode load).
	ActiveBlocks bool
	// OutputCounts reports each finished request's output token count
	// with its release (the verl hook's release_server kwargs).
	OutputCounts bool
	// TrueLengths passes every request's true response length as its
	// router.Request.Hint (reference rows only: no router knows it).
	TrueLengths bool
	// Lane pins every request where the longest_lane+truelen reference's
	// plan puts it (reference rows only: the plan reads true lengths).
	Lane *LaneSpec
	// ResetIndexOnUpdate drops the router's prefix index at a weight
	// update (kvc-router's reset_prefix_index hook). Peers have no such
	// API: an event-fed peer learns of the update from the engines'
	// AllBlocksCleared events, an approximate one keeps its stale tree.
	ResetIndexOnUpdate bool
	// FinishSessions tells a strategy that implements
	// peers.SessionFinisher when a trajectory has ended (its request_id
	// gets no follow-up request), as a client calling vllm-router's
	// /finish_session does.
	FinishSessions bool
	// QueueThreshold > 0 holds an arriving request in the router, first
	// come first served, while every engine's router-tracked prefill
	// tokens (placed, first token not yet seen) exceed QueueThreshold x
	// its max_num_batched_tokens, and routes held requests (scoring them
	// then) as prefills complete or requests finish: Dynamo's
	// router_queue_threshold (ai-dynamo/dynamo lib/kv-router/src/queue.rs
	// SchedulerQueue: all_workers_busy, update), in QueuePolicy's order.
	QueueThreshold float64
	// QueuePolicy orders the queue: QueueFCFS (Dynamo's default, also
	// ""), QueueLCFS or QueueWSPT (scheduling/policy.rs). WSPT's overlap
	// comes from the KV events the router has been delivered, each tier
	// weighted by QueueTierWeights (host, disk).
	QueuePolicy      string
	QueueTierWeights [2]float64
}

// Result is what one policy achieved.
type Result struct {
	Policy   string
	Requests int
	Skipped  int
	// Token counters (engine-reported).
	PromptTokens, CachedTokens int64
	GPUHitTokens, CPUHitTokens int64
	SSDHitTokens, OutputTokens int64
	Preemptions                int64
	TTFT, E2E                  []float64 // seconds, sorted
	DecisionUS                 []float64 // microseconds, sorted
	// Span is first arrival to last completion (virtual seconds).
	Span float64
	// Makespans holds each phase's start-to-last-completion time.
	Makespans []float64
	Busy      []float64
	Events    kvcrouter.EventCounts
	Records   []Record
	Wall      time.Duration
	// FinalInflight is the router's in-flight total after the run and
	// Unfinished the engine requests never completed (both 0 when sound).
	FinalInflight, Unfinished int
	// Queued counts the requests Policy.QueueThreshold's router queue
	// held, and QueueLeft those still held after the run (0 when sound).
	Queued, QueueLeft int
	// QueuedCachedTokens sums, over the requests a wspt queue held, the
	// best overlap (tokens, tier-weighted) its key was computed from.
	QueuedCachedTokens float64
	Router             kvcrouter.RouterCounters
	IndexStatus        kvcrouter.IndexStatus
	// Lengths is the router's length learner (nil when off).
	Lengths *kvcrouter.LengthCounters
}

type evKind uint8

const (
	evArrival evKind = iota
	evStepEnd
	evDeliver
)

type event struct {
	t       float64
	seq     uint64
	kind    evKind
	item    *Item
	eng     int
	payload []byte
}

type eventHeap []*event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].t != h[j].t {
		return h[i].t < h[j].t
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(*event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

type engine struct {
	id      string
	e       *sim.Engine
	busy    bool
	res     sim.StepResult
	metrics kvcrouter.LoadMetrics
	scraped bool
	// Dynamo-style router-local accounting: prompt tokens still to
	// prefill (in blocks), and active full prompt blocks with their
	// reference counts (shared prefixes count once).
	prefill float64
	blocks  map[uint64]int32
}

type flight struct {
	item    *Item
	rid     string // the request id the router saw
	eng     int
	at      float64
	prefill float64
	first   bool
	routed  float64
	keys    []uint64
	tail    []int32
	// akeys are the prompt's full-block keys held in engine.blocks.
	akeys []uint64
}

type driver struct {
	opt Options
	pol Policy
	wl  Workload
	r   *kvcrouter.Router
	// lane is Policy.Lane's plan; nil without one.
	lane *lanePlan
	// finisher is the policy's strategy when it tracks sessions that the
	// client finishes (Policy.FinishSessions).
	finisher peers.SessionFinisher
	engines  []*engine
	byName   map[string]int
	h        eventHeap
	seq      uint64
	now      float64
	epoch    time.Time
	flights  map[string]*flight
	stats    kvcrouter.EventStats
	res      Result
	buf      []int32
	bs       int
	ns       uint64

	nextScrape  float64
	scrapeEvery float64
	outstanding int
	lastFinish  float64
	firstArr    float64

	// The request being routed, its prompt keys (ActiveBlocks) and the
	// server of each session's previous request (Sessions).
	cur      *Item
	curKeys  []uint64
	sessions map[string]string

	// Requests the router's admission holds, by ticket, and the slots
	// a release gave to held requests.
	held map[uint64]*Item
	// queue holds requests Policy.QueueThreshold parks, in
	// Policy.QueuePolicy's order; queued numbers them.
	queue  routerQueue
	queued uint64
	// resid mirrors each engine's delivered KV events (wspt's overlap).
	resid    []residency
	ticket   uint64
	admitted []kvcrouter.Admitted
}

// signals adapts the driver to peers.Signals.
type signals struct{ d *driver }

func (s signals) Metrics(server string) (kvcrouter.LoadMetrics, bool) {
	i, ok := s.d.byName[server]
	if !ok || !s.d.engines[i].scraped {
		return kvcrouter.LoadMetrics{}, false
	}
	return s.d.engines[i].metrics, true
}

func (s signals) Active(server, reqID string) (peers.Active, bool) {
	d := s.d
	i, ok := d.byName[server]
	if !ok || !d.pol.ActiveBlocks || d.cur == nil || d.cur.ID != reqID {
		return peers.Active{}, false
	}
	e := d.engines[i]
	// Full blocks only, as Dynamo 1.6.1 counts them (its
	// get_potential_loads; testbed/peers/dynamo_diff_test.go).
	fresh := 0.0
	for _, k := range d.curKeys {
		if e.blocks[k] == 0 {
			fresh++
		}
	}
	return peers.Active{PrefillBlocks: e.prefill, DecodeBlocks: float64(len(e.blocks)), NewBlocks: fresh}, true
}

func (s signals) Session(reqID string) (string, bool) {
	d := s.d
	if !d.pol.Sessions || d.cur == nil || d.cur.ID != reqID {
		return "", false
	}
	srv, ok := d.sessions[d.cur.Key]
	return srv, ok
}

// Run replays a workload (built fresh by mk) under one policy.
func Run(wl Workload, pol Policy, opt Options) (*Result, error) {
	if opt.ScrapeInterval <= 0 {
		opt.ScrapeInterval = 0.1
	}
	if opt.Engines.Engines <= 0 {
		return nil, errors.New("bench: need at least one engine")
	}
	d := &driver{opt: opt, pol: pol, wl: wl, byName: map[string]int{}, flights: map[string]*flight{},
		epoch: time.Unix(1_700_000_000, 0), firstArr: math.Inf(1), scrapeEvery: opt.ScrapeInterval,
		sessions: map[string]string{}, held: map[uint64]*Item{}}
	if pol.Scrape > 0 {
		d.scrapeEvery = pol.Scrape
	}
	if opt.ArrivalSpread < 0 || opt.EventDelay < 0 || opt.ClientRate < 0 || opt.ClientWorkers < 0 {
		return nil, errors.New("bench: arrival spread, event delay, client rate and client workers must not be negative")
	}
	cfg := pol.Config(signals{d})
	cfg.Now = func() time.Time { return d.epoch.Add(time.Duration(d.now * float64(time.Second))) }
	r, err := kvcrouter.NewRouter(cfg)
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", pol.Name, err)
	}
	d.r = r
	if f, ok := cfg.Strategy.(peers.SessionFinisher); ok && pol.FinishSessions {
		d.finisher = f
	}
	names := make([]string, opt.Engines.Engines)
	for i := range names {
		es := opt.Engines
		scfg, err := es.SimConfig()
		if err != nil {
			return nil, err
		}
		scfg.HashSalt, scfg.DisableEvents = es.Seed*1_000_003+uint64(i)+1, !pol.Events
		e, err := sim.New(scfg)
		if err != nil {
			return nil, err
		}
		names[i] = "engine-" + strconv.Itoa(i)
		d.engines = append(d.engines, &engine{id: names[i], e: e, blocks: map[uint64]int32{}})
		d.byName[names[i]] = i
	}
	d.bs = d.engines[0].e.Config().BlockSize
	if pol.Lane != nil {
		if err := pol.Lane.Validate(); err != nil {
			return nil, err
		}
		// The router's pool keeps AddServers' order, so a pin is an engine index.
		d.lane = newLanePlan(*pol.Lane, len(d.engines))
	}
	switch pol.QueuePolicy {
	case "", QueueFCFS, QueueLCFS:
	case QueueWSPT:
		if !pol.Events {
			return nil, fmt.Errorf("policy %s: the wspt queue reads KV events, and the policy takes none", pol.Name)
		}
		for range d.engines {
			d.resid = append(d.resid, residency{})
		}
	default:
		return nil, fmt.Errorf("policy %s: unknown queue policy %q (fcfs, lcfs, wspt)", pol.Name, pol.QueuePolicy)
	}
	if err := r.AddServers(names); err != nil {
		return nil, err
	}
	start := time.Now()
	d.scrape()
	d.nextScrape = d.scrapeEvery
	spread := rand.New(rand.NewPCG(opt.Engines.Seed, 0x737072656164))
	for p := 0; p < wl.Phases(); p++ {
		if p > 0 && wl.ResetBetweenPhases() {
			if err := d.weightUpdate(); err != nil {
				return nil, err
			}
		}
		ps := d.now
		items := wl.Start(p, ps)
		if opt.OracleLongestFirst {
			sort.SliceStable(items, func(a, b int) bool { return items[a].MaxTokens > items[b].MaxTokens })
		}
		if opt.ClientRate > 0 {
			VerlArrivals(items, ps, opt.ClientRate, opt.ClientWorkers)
		}
		for _, it := range items {
			if opt.ArrivalSpread > 0 {
				it.At += spread.Float64() * opt.ArrivalSpread
			}
			d.push(&event{t: it.At, kind: evArrival, item: it})
			d.outstanding++
		}
		d.lastFinish = ps
		if err := d.loop(); err != nil {
			return nil, fmt.Errorf("policy %s: %w", pol.Name, err)
		}
		d.res.Makespans = append(d.res.Makespans, d.lastFinish-ps)
	}
	// Flush delayed event deliveries.
	for d.h.Len() > 0 {
		ev := heap.Pop(&d.h).(*event)
		d.now = math.Max(d.now, ev.t)
		d.handle(ev)
	}
	d.res.Wall = time.Since(start)
	d.finish()
	return &d.res, nil
}

func (d *driver) push(ev *event) {
	d.seq++
	ev.seq = d.seq
	heap.Push(&d.h, ev)
}

func (d *driver) loop() error {
	for d.outstanding > 0 {
		if d.h.Len() == 0 {
			return fmt.Errorf("stalled with %d requests outstanding", d.outstanding)
		}
		ev := heap.Pop(&d.h).(*event)
		for d.nextScrape <= ev.t {
			d.now = d.nextScrape
			d.scrape()
			d.nextScrape += d.scrapeEvery
		}
		d.now = ev.t
		if err := d.handle(ev); err != nil {
			return err
		}
		if d.h.Len() > 0 && d.h[0].t == d.now {
			continue
		}
		for i, e := range d.engines {
			if !e.busy && e.e.HasWork() {
				d.startStep(i)
			}
		}
	}
	return nil
}

func (d *driver) handle(ev *event) error {
	switch ev.kind {
	case evArrival:
		return d.arrive(ev.item)
	case evStepEnd:
		return d.stepEnd(ev.eng)
	case evDeliver:
		_ = d.deliver(ev.eng, ev.payload)
	}
	return nil
}

// deliver applies one engine's event payload to the router (and to the
// residency mirror wspt reads).
func (d *driver) deliver(i int, payload []byte) error {
	err := kvcrouter.ApplyEventPayload(d.r, d.engines[i].id, payload, &d.stats)
	if d.resid != nil {
		if b, derr := kvcrouter.DecodeEvents(payload); derr == nil {
			d.resid[i].apply(b.Events)
		}
	}
	return err
}

// bestCached is the most prompt tokens any engine holds, by the events
// delivered so far (Dynamo's best_effective_prefill_tokens, as overlap).
func (d *driver) bestCached(prompt []int32) float64 {
	best := 0.0
	for i, e := range d.engines {
		n := d.resid[i].effective(e.e.EngineHashes(prompt), d.pol.QueueTierWeights[0], d.pol.QueueTierWeights[1])
		best = max(best, n*float64(d.bs))
	}
	return best
}

func (d *driver) scrape() {
	for _, e := range d.engines {
		st := e.e.Stats()
		cfg := e.e.Config()
		m := kvcrouter.LoadMetrics{Running: float64(st.Running), Waiting: float64(st.Waiting), KVUsage: st.KVUsage, HasKVUsage: true,
			PrefixQueries: float64(st.PrefixQueries), PrefixHits: float64(st.PrefixHits),
			ExternalPrefixQueries: float64(st.ExternalQueries), ExternalPrefixHits: float64(st.ExternalHits),
			BlockSize: cfg.BlockSize, NumGPUBlocks: cfg.NumGPUBlocks, MaxNumSeqs: cfg.MaxNumSeqs, Engines: 1,
			At: d.epoch.Add(time.Duration(d.now * float64(time.Second)))}
		e.metrics, e.scraped = m, true
		d.r.UpdateMetrics(e.id, m)
	}
	d.admitted = d.r.Pump(d.admitted[:0])
	for _, a := range d.admitted {
		it := d.held[a.Ticket]
		delete(d.held, a.Ticket)
		_ = d.place(it, d.wl.Prompt(it, d.buf), a.Decision)
	}
}

// promptOf synthesises it's prompt, reusing the driver's buffer (router
// and engine copy what they keep).
func (d *driver) promptOf(it *Item) []int32 {
	prompt := d.wl.Prompt(it, d.buf)
	if it.prompt == nil {
		d.buf = prompt
	}
	return prompt
}

func (d *driver) arrive(it *Item) error {
	prompt := d.promptOf(it)
	need := (len(prompt) + it.MaxTokens - 1 + d.bs - 1) / d.bs
	if need > d.engines[0].e.Config().NumGPUBlocks {
		d.res.Skipped++
		d.outstanding--
		return nil
	}
	if d.now < d.firstArr {
		d.firstArr = d.now
	}
	if it.turn == 0 {
		it.first = d.now
	}
	if d.pol.QueueThreshold > 0 && d.allBusy() {
		d.queued++
		best := 0.0
		if d.pol.QueuePolicy == QueueWSPT {
			best = d.bestCached(prompt)
			d.res.QueuedCachedTokens += best
		}
		d.queue.push(it, queueKey(d.pol.QueuePolicy, d.queued, len(prompt), best), d.queued)
		d.res.Queued++
		return nil
	}
	return d.route(it, prompt)
}

// allBusy is Dynamo's queue test: every engine's tracked prefill tokens
// above QueueThreshold x its max_num_batched_tokens.
func (d *driver) allBusy() bool {
	for _, e := range d.engines {
		if e.prefill*float64(d.bs) <= d.pol.QueueThreshold*float64(e.e.Config().MaxNumBatchedTokens) {
			return false
		}
	}
	return true
}

// drainQueue routes parked requests while some engine has room (Dynamo
// calls it on every prefill completion and free; here once per step end,
// after its first tokens and completions, which share one instant).
func (d *driver) drainQueue() error {
	for d.queue.Len() > 0 && !d.allBusy() {
		it := d.queue.pop()
		if err := d.route(it, d.promptOf(it)); err != nil {
			return err
		}
	}
	return nil
}

// route asks the router for a server and submits the request there (or
// leaves it with the router's admission).
func (d *driver) route(it *Item, prompt []int32) error {
	// Policies without sticky sessions get the per-submission id, unique
	// within a run, so no binding is ever reused (the router binds every
	// request id, even an empty one, as verl does).
	key := it.ID
	if d.pol.StickyIDs {
		key = it.Key
	}
	d.cur = it
	if d.pol.ActiveBlocks {
		d.curKeys = kvcrouter.AppendBlockKeys(d.curKeys[:0], prompt, d.bs, d.ns)
	}
	t0 := time.Now()
	d.ticket++
	req := kvcrouter.Request{ID: key, Tokens: prompt, Pin: -1}
	if d.pol.TrueLengths {
		req.Hint = float64(it.MaxTokens)
	}
	if d.lane != nil {
		req.Pin = d.lane.pick(it.Phase, it.MaxTokens, len(prompt))
	}
	dec, queued, err := d.r.Submit(req, d.ticket)
	d.res.DecisionUS = append(d.res.DecisionUS, float64(time.Since(t0).Nanoseconds())/1e3)
	d.cur = nil
	if err != nil {
		return err
	}
	if queued {
		d.held[d.ticket] = it
		return nil
	}
	return d.place(it, prompt, dec)
}

// place submits a routed request to the engine the router chose.
func (d *driver) place(it *Item, prompt []int32, dec kvcrouter.Decision) error {
	i, ok := d.byName[dec.Server]
	if !ok {
		return fmt.Errorf("router chose unknown server %q", dec.Server)
	}
	e := d.engines[i]
	hit := 0
	if dec.BlockSize > 0 {
		hit = (dec.HitBlocks[0] + dec.HitBlocks[1] + dec.HitBlocks[2]) * dec.BlockSize / d.bs
	}
	// Uncached prompt tokens in blocks, as Dynamo tracks prefill load.
	rid := it.ID
	if d.pol.StickyIDs {
		rid = it.Key
	}
	f := &flight{item: it, rid: rid, eng: i, at: it.At, routed: d.now, prefill: math.Max(0, float64(len(prompt)-hit*d.bs)) / float64(d.bs)}
	e.prefill += f.prefill
	if d.pol.Sessions {
		d.sessions[it.Key] = e.id
	}
	if d.pol.ActiveBlocks {
		f.akeys = append([]uint64(nil), d.curKeys...)
		for _, k := range f.akeys {
			e.blocks[k]++
		}
	}
	if d.opt.Record {
		f.keys = kvcrouter.AppendBlockKeys(nil, prompt, d.bs, d.ns)
		f.tail = append([]int32(nil), prompt[len(f.keys)*d.bs:]...)
	}
	if err := e.e.Submit(sim.Request{ID: it.ID, Prompt: prompt, MaxTokens: it.MaxTokens, Arrival: d.now, SamplingSeed: it.Seed}); err != nil {
		return err
	}
	d.flights[it.ID] = f
	return nil
}

func (d *driver) startStep(i int) {
	e := d.engines[i]
	res := e.e.Step(d.now)
	if res.Duration <= 0 {
		// Nothing schedulable; the next arrival or completion retries.
		return
	}
	e.res = res
	e.busy = true
	d.push(&event{t: d.now + res.Duration, kind: evStepEnd, eng: i})
}

func (d *driver) stepEnd(i int) error {
	e := d.engines[i]
	e.busy = false
	res := &e.res
	if d.pol.Events && len(res.Events) > 0 {
		payload, err := kvcrouter.EncodeEvents(&kvcrouter.EventBatch{TS: d.now, Events: res.Events, DPRank: -1}, kvcrouter.EventLayoutArray)
		if err != nil {
			return err
		}
		if d.opt.EventDelay > 0 {
			d.push(&event{t: d.now + d.opt.EventDelay, kind: evDeliver, eng: i, payload: payload})
		} else if err := d.deliver(i, payload); err != nil {
			return err
		}
	}
	for _, tok := range res.Tokens {
		if tok.Index != 0 {
			continue
		}
		if f := d.flights[tok.ID]; f != nil && !f.first {
			f.first = true
			e.prefill -= f.prefill
		}
	}
	for k := range res.Finished {
		c := &res.Finished[k]
		f := d.flights[c.ID]
		if f == nil {
			return fmt.Errorf("completion of unknown request %q", c.ID)
		}
		delete(d.flights, c.ID)
		if !f.first {
			e.prefill -= f.prefill
		}
		if d.pol.ActiveBlocks {
			for _, k := range f.akeys {
				if e.blocks[k]--; e.blocks[k] <= 0 {
					delete(e.blocks, k)
				}
			}
		}
		n := 0
		if d.pol.OutputCounts {
			n = len(c.OutputTokens)
		}
		d.admitted, _ = d.r.ReleaseDone(e.id, f.rid, n, d.admitted[:0])
		for _, a := range d.admitted {
			it := d.held[a.Ticket]
			delete(d.held, a.Ticket)
			if err := d.place(it, d.wl.Prompt(it, d.buf), a.Decision); err != nil {
				return err
			}
		}
		d.res.Requests++
		d.res.PromptTokens += int64(c.PromptTokens)
		d.res.CachedTokens += int64(c.CachedTokens)
		d.res.OutputTokens += int64(len(c.OutputTokens))
		d.res.TTFT = append(d.res.TTFT, c.FirstTokenTime-f.at)
		d.res.E2E = append(d.res.E2E, c.FinishTime-f.at)
		d.lastFinish = math.Max(d.lastFinish, c.FinishTime)
		if d.opt.Record {
			seq := append(f.tail, c.OutputTokens...)
			keys := f.keys
			nb := len(keys)
			if len(seq) >= d.bs {
				parent := kvcrouter.BlockRoot(d.ns, d.bs)
				if nb > 0 {
					parent = keys[nb-1]
				}
				for j := 0; j+d.bs <= len(seq); j += d.bs {
					parent = kvcrouter.ChainBlock(parent, seq[j:j+d.bs])
					keys = append(keys, parent)
				}
			}
			rec := Record{Phase: f.item.Phase, At: f.at, Seq: f.item.seq, PromptLen: c.PromptTokens, PromptBlocks: nb,
				Keys: keys, OutputLen: len(c.OutputTokens), Think: f.item.think, First: f.item.first, Routed: f.routed, Engine: f.eng}
			if f.item.chained {
				rec.Chain = f.item.Key
			}
			d.res.Records = append(d.res.Records, rec)
		}
		if d.opt.Progress != nil {
			d.opt.Progress.Add(1)
		}
		d.outstanding--
		more := false
		for _, nx := range d.wl.Done(f.item, c.OutputTokens, d.now) {
			d.push(&event{t: nx.At, kind: evArrival, item: nx})
			d.outstanding++
			more = more || nx.Key == f.item.Key
		}
		if d.finisher != nil && !more {
			d.finisher.FinishSession(f.item.Key)
		}
	}
	return d.drainQueue()
}

// weightUpdate resets every engine's prefix cache (events published through
// the usual path) and the router's residency, as a weight sync does.
func (d *driver) weightUpdate() error {
	for d.h.Len() > 0 { // pending deliveries predate the update
		ev := heap.Pop(&d.h).(*event)
		if err := d.handle(ev); err != nil {
			return err
		}
	}
	for i, e := range d.engines {
		evs, ok := e.e.ResetPrefixCache(true)
		if !ok {
			return fmt.Errorf("engine %s refused the prefix-cache reset", e.id)
		}
		if d.pol.Events && len(evs) > 0 {
			payload, err := kvcrouter.EncodeEvents(&kvcrouter.EventBatch{TS: d.now, Events: evs, DPRank: -1}, kvcrouter.EventLayoutArray)
			if err != nil {
				return err
			}
			if err := d.deliver(i, payload); err != nil {
				return err
			}
		}
	}
	if d.pol.ResetIndexOnUpdate {
		d.r.ResetCache()
	}
	return nil
}

func (d *driver) finish() {
	r := &d.res
	r.Policy = d.pol.Name
	sort.Float64s(r.TTFT)
	sort.Float64s(r.E2E)
	sort.Float64s(r.DecisionUS)
	for _, e := range d.engines {
		st := e.e.Stats()
		r.GPUHitTokens += st.GPUHitTokens
		r.CPUHitTokens += st.CPUHitTokens
		r.SSDHitTokens += st.SSDHitTokens
		r.Preemptions += st.Preemptions
		r.Busy = append(r.Busy, st.BusyTime)
	}
	if !math.IsInf(d.firstArr, 1) {
		r.Span = d.lastFinish - d.firstArr
	}
	r.Events = d.stats.Snapshot()
	r.FinalInflight = d.r.TotalInflight()
	st := d.r.Status()
	r.Router = st.Counters
	r.IndexStatus = st.Index
	r.Lengths = st.Lengths
	r.Unfinished = len(d.flights)
	r.QueueLeft = d.queue.Len()
}
