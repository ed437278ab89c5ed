package router

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/blockhash"
	"github.com/kvc-router/kvc-router/core/internal/index"
	"github.com/kvc-router/kvc-router/core/internal/load"
	"github.com/kvc-router/kvc-router/core/internal/memtrim"
	"github.com/kvc-router/kvc-router/core/internal/strategy"
)

// AdmissionSpec configures router-side admission with late binding.
//
// A verl rollout step submits far more sequences than the fleet can run. An
// engine queues what it cannot run, and a request queued there is bound to
// that engine: when another engine drains first it idles while the step's
// tail still waits elsewhere. With admission on, the router holds a request
// while every server already has its share in flight, and gives each slot a
// release frees to the held request that fits that server best — a sticky
// session bound there, a sibling of a prompt it already holds, a prompt no
// server holds yet, in that order — so siblings stay together (shared
// prefill and KV) while no engine idles with work held elsewhere. Where
// kvc_aware's group_spread applies and the step's samples are measured
// alike within a prompt, a group's siblings go where it has the fewest
// instead (groupFull): a long group kept on one server straggles.
type AdmissionSpec struct {
	// Enabled turns admission on (kvc_aware mode only). In router.config
	// (verl's block, the Python balancers) it also takes "auto", the
	// default there: on where the balancer can hold acquire calls (the
	// async KVCAwareAdmissionBalancer, which verl's hook creates for
	// kvc_aware) unless turns is "multi" (agent loops), off in the
	// synchronous KVCAwareBalancer. The library's own document takes true
	// or false (default false).
	// When to change: false to keep every request going straight to an
	// engine's queue (verl's timing then counts no wait in the router);
	// true where the host holds acquires itself (C hosts: kvr_acquire_with
	// with submit). With admission, a step that sends more requests than
	// the fleet runs at once waits in the router, for whichever server
	// frees a slot first (with its cache in mind), instead of queueing
	// inside one server.
	Enabled bool `json:"enabled"`
	// MaxInflight is each server's in-flight cap; 0 = its max_num_seqs
	// (from metrics, else load.max_num_seqs) times Headroom.
	// When to change: when the router cannot know the servers' max_num_seqs
	// (the verl hook sets it from rollout.max_num_seqs x data_parallel_size).
	MaxInflight int `json:"max_inflight"`
	// Headroom scales max_num_seqs into the cap (default 1).
	// When to change: above 1 keeps the servers' own queues a little full
	// (less idle time between batches); below 1 holds more in the router.
	Headroom float64 `json:"headroom,omitempty"`
	// EngineQueue holds requests in the router while a server's engine is
	// queuing: once its last fresh scrape counted waiting requests, the
	// server takes no held request while that count, plus the requests sent
	// there since the scrape, less those finished there since, is at least
	// EngineQueue (0 = off, the default: the slot cap alone).
	// When to change: when the engines' KV cache fills before their
	// max_num_seqs (vLLM then queues, and preempts, requests it cannot
	// hold); a queued request is bound to its engine, a held one goes to
	// whichever frees first.
	EngineQueue int `json:"engine_queue,omitempty"`
	// MaxQueue bounds held requests; beyond it Submit fails with
	// ErrQueueFull (default 65,536).
	// When to change: raise it when a step holds more requests than this at
	// once.
	MaxQueue int `json:"max_queue,omitempty"`
	// Window is how many of the oldest held requests free to go anywhere a
	// freed slot considers; the oldest goes first once Window younger ones
	// went ahead of it (default 512). Longest-first admission
	// (lengths.longest_first) ranks every held request instead and bounds
	// passing-over with lengths.max_skips.
	// When to change: larger finds more cache hits for a freed slot at more
	// CPU per release; smaller costs less.
	Window int `json:"window,omitempty"`
	// MaxHeldBytes bounds the memory of held prompts (4 bytes a token
	// plus the request's fixed cost); beyond it Submit fails with
	// ErrQueueFull (default 512 MiB).
	// When to change: raise it when long prompts are refused while few are
	// held; lower it to bound the router's memory more tightly.
	MaxHeldBytes int64 `json:"max_held_bytes,omitempty"`
	// EmptyPoolMS: held requests fail with ErrNoServers once the pool has
	// been empty this long (default 5,000).
	// When to change: raise it when servers are replaced all at once and
	// held requests should wait for the new ones.
	EmptyPoolMS int `json:"empty_pool_ms,omitempty"`
	// ReconcileAfterMS: when a server's fresh metrics count fewer requests
	// (running + waiting) than the router has in flight there, at every
	// scrape for this long, the router's count drops by the smallest such
	// excess: slots of requests whose clients died come back (default
	// 30,000; -1 = never).
	// When to change: raise it when requests take long between acquire
	// and reaching the engine; -1 when the engines also serve traffic that
	// does not pass this router (their counts then say nothing of ours).
	ReconcileAfterMS int `json:"reconcile_after_ms,omitempty"`
	// ClaimTimeoutMS (the Python actor's): an admitted request nobody
	// claims, or a held one nobody asked for, this long is released or
	// cancelled (default 30,000).
	// When to change: raise it when clients may stall longer than this
	// between polls (a paused process) without having died.
	ClaimTimeoutMS int `json:"claim_timeout_ms,omitempty"`
}

// Admission defaults and bounds.
const (
	DefaultAdmissionMaxQueue     = 1 << 16
	DefaultAdmissionWindow       = 512
	DefaultAdmissionMaxHeldBytes = 512 << 20
	DefaultAdmissionEmptyPoolMS  = 5_000
	DefaultAdmissionReconcileMS  = 30_000
	DefaultAdmissionClaimMS      = 30_000
	// maxAdmissionMS bounds every admission duration (one day): larger
	// values would overflow time.Duration arithmetic.
	maxAdmissionMS = 86_400_000
	// heldOverhead is a held request's fixed cost in bytes beyond its
	// prompt and id (its record, map slot and list links).
	heldOverhead = 192
)

// ReasonAdmitted is the reason of a decision made when a held request is
// given a freed slot.
const ReasonAdmitted = "admitted"

// ErrQueueFull is returned by Submit when admission.max_queue requests, or
// admission.max_held_bytes of prompts, are already held.
var ErrQueueFull = errors.New("router: admission queue full")

// ErrTicketHeld is returned by Submit for a ticket already held: a ticket
// names one request until it is admitted or cancelled.
var ErrTicketHeld = errors.New("router: admission ticket already held")

func (a *AdmissionSpec) normalise() error {
	if a.MaxInflight < 0 {
		return configErr("admission.max_inflight", "must not be negative (0 = max_num_seqs), got %d", a.MaxInflight)
	}
	if a.Headroom == 0 {
		a.Headroom = 1
	}
	if !(a.Headroom > 0 && a.Headroom <= 16) {
		return configErr("admission.headroom", "must be in (0, 16], got %v", a.Headroom)
	}
	if a.EngineQueue < 0 || a.EngineQueue > 1<<20 {
		return configErr("admission.engine_queue", "must be in [0, 1048576] (0 = off), got %d", a.EngineQueue)
	}
	if a.MaxQueue == 0 {
		a.MaxQueue = DefaultAdmissionMaxQueue
	}
	if a.MaxQueue < 0 {
		return configErr("admission.max_queue", "must be positive, got %d", a.MaxQueue)
	}
	if a.Window == 0 {
		a.Window = DefaultAdmissionWindow
	}
	if a.Window < 0 {
		return configErr("admission.window", "must be positive, got %d", a.Window)
	}
	if a.MaxHeldBytes == 0 {
		a.MaxHeldBytes = DefaultAdmissionMaxHeldBytes
	}
	if a.MaxHeldBytes < 0 {
		return configErr("admission.max_held_bytes", "must be positive, got %d", a.MaxHeldBytes)
	}
	for _, d := range []struct {
		key   string
		v     *int
		def   int
		unset bool // -1 allowed (off)
	}{
		{"admission.empty_pool_ms", &a.EmptyPoolMS, DefaultAdmissionEmptyPoolMS, false},
		{"admission.reconcile_after_ms", &a.ReconcileAfterMS, DefaultAdmissionReconcileMS, true},
		{"admission.claim_timeout_ms", &a.ClaimTimeoutMS, DefaultAdmissionClaimMS, false},
	} {
		switch v := *d.v; {
		case v == 0:
			*d.v = d.def
		case v == -1 && d.unset:
		case v < 1 || v > maxAdmissionMS:
			off := ""
			if d.unset {
				off = " or -1 (never)"
			}
			return configErr(d.key, "must be in [1, %d] ms%s, got %d", maxAdmissionMS, off, v)
		}
	}
	return nil
}

// Admitted is a held request given a slot, or failed.
type Admitted struct {
	Ticket   uint64
	Decision Decision
	// Err is set (and Decision empty) for a held request that failed
	// instead: the pool stayed empty (ErrNoServers).
	Err error
}

// held is one request waiting for a slot. It is in exactly one queue (the
// free queue, or the queue of the server it waits for) and in the ticket
// map, so cancel and admit unlink it in O(1).
type held struct {
	ticket uint64
	req    Request
	// last is the key of the prompt's last hittable block (0 = none):
	// requests with equal last keys are siblings (same prompt).
	last uint64
	// affinity is the server it waits for (nil = any): a sticky session's
	// server, or a full_determinism pin's.
	affinity *server
	// pin is the request's full_determinism pin (-1 = none), kept to
	// re-target it when its server leaves or turns unhealthy.
	pin   int
	seq   uint64 // arrival order
	bytes int64
	// passed counts admissions of younger requests from its queue while
	// it was the oldest (aging: Window passes, then it goes first).
	passed     int
	q          *heldQueue
	prev, next *held
}

// heldQueue is a doubly linked list of held requests, oldest first.
type heldQueue struct {
	head, tail *held
	n          int
}

func (q *heldQueue) push(h *held) {
	h.q, h.prev, h.next = q, q.tail, nil
	if q.tail != nil {
		q.tail.next = h
	} else {
		q.head = h
	}
	q.tail = h
	q.n++
}

func (q *heldQueue) unlink(h *held) {
	if h.prev != nil {
		h.prev.next = h.next
	} else {
		q.head = h.next
	}
	if h.next != nil {
		h.next.prev = h.prev
	} else {
		q.tail = h.prev
	}
	h.q, h.prev, h.next = nil, nil, nil
	q.n--
}

// merge moves every entry of src into q, keeping arrival order: one pass
// over both (a pool change moves whole queues).
func (q *heldQueue) merge(src *heldQueue) {
	if src == q || src.n == 0 {
		return
	}
	var out heldQueue
	a, b := q.head, src.head
	for a != nil || b != nil {
		var h *held
		if b == nil || (a != nil && a.seq < b.seq) {
			h, a = a, a.next
		} else {
			h, b = b, b.next
		}
		out.push(h)
	}
	*q = out
	for h := q.head; h != nil; h = h.next {
		h.q = q
	}
	*src = heldQueue{}
}

// admissionState is the router's held requests; guarded by Router.mu.
type admissionState struct {
	st      AdmissionStatus
	free    heldQueue              // requests free to go to any server
	bound   map[*server]*heldQueue // requests waiting for one server
	tickets map[uint64]*held       // every held request
	seq     uint64
	bytes   int64
	peak    int64 // held bytes at the fullest since the queue last drained
	// ready holds requests admitted by a Submit (room it found before
	// routing the new request); the next ReleaseAdmit or Pump reports them.
	ready []Admitted
	// emptySince is when the pool last became empty (zero: not empty).
	emptySince time.Time
	// anyHealthy: some pool member is healthy (computed per operation).
	anyHealthy bool
	recon      map[string]*reconState
	order      admissionOrder
	pickMemo   map[uint64]uint8
	// pickElig is each pool server's eligibility (by pool position) for
	// the pick under way, read once per pick by groupFull; nil until then.
	pickElig []bool
}

// reconState tracks one server's excess of router in-flight count over
// the engine's own count.
type reconState struct {
	since time.Time // first scrape of the current run of excess (zero: none)
	min   int       // the smallest excess seen since
}

func newAdmissionState() admissionState {
	return admissionState{
		bound: map[*server]*heldQueue{}, tickets: map[uint64]*held{},
		recon: map[string]*reconState{}, order: siblingsFirst{}, pickMemo: map[uint64]uint8{},
	}
}

// AdmissionStatus is the admission queue as status reports it.
type AdmissionStatus struct {
	Enabled   bool   `json:"enabled"`
	Held      int    `json:"held"`
	Queued    uint64 `json:"queued_total"`
	Admitted  uint64 `json:"admitted_total"`
	Cancelled uint64 `json:"cancelled_total"`
	Rejected  uint64 `json:"rejected_total"`
	MaxHeld   int    `json:"max_held"`
	// Failed counts held requests failed (empty pool); Reconciled the
	// in-flight slots given back by reconciliation with engine metrics.
	Failed     uint64 `json:"failed_total"`
	Reconciled uint64 `json:"reconciled_total"`
	// HeldBytes is the memory of the held prompts.
	HeldBytes int64 `json:"held_bytes"`
	// GroupSpread counts the groups a freed slot passed over (once per
	// group and slot, however many of its siblings were held) because the
	// group already had more on that server than on another (kvc_aware's
	// group_spread: over group_spread_open_max_servers until the step's
	// samples are measured, over the pool once measured alike).
	GroupSpread uint64 `json:"group_spread_total"`
}

// capOf is s's in-flight cap (0 = unlimited).
func (r *Router) capOf(s *server) int {
	a := &r.cfg.Admission
	if a.MaxInflight > 0 {
		return a.MaxInflight
	}
	seqs := r.cfg.Load.MaxNumSeqs
	if sn, ok := r.ld.Get(s.id); ok && sn.HasMetric && sn.Metrics.MaxNumSeqs > 0 {
		seqs = sn.Metrics.MaxNumSeqs
	}
	if seqs <= 0 {
		seqs = 256
	}
	return max(1, int(math.Ceil(float64(seqs)*a.Headroom)))
}

// healthy reports s's health as the load store knows it.
func (r *Router) healthy(s *server) bool {
	sn, ok := r.ld.Get(s.id)
	return ok && sn.Healthy
}

// scanHealth sets aq.anyHealthy; r.mu held. Called at the start of each
// admission operation: health changes between operations, not within one.
func (r *Router) scanHealth() {
	r.aq.anyHealthy = false
	for _, s := range r.pool {
		if r.healthy(s) {
			r.aq.anyHealthy = true
			return
		}
	}
}

// eligible: s may take requests. An unhealthy server may not while a
// healthy one exists (routing drops it from the candidates the same way);
// with none healthy, all are eligible, as routing falls back to all.
func (r *Router) eligible(s *server) bool { return !r.aq.anyHealthy || r.healthy(s) }

// hasRoom: s is eligible, below its cap and, with admission.engine_queue,
// its engine not queuing; r.mu held, scanHealth done.
func (r *Router) hasRoom(s *server) bool {
	if !r.eligible(s) {
		return false
	}
	n := r.cfg.Admission.EngineQueue
	if n == 0 {
		return r.ld.Inflight(s.id) < r.capOf(s)
	}
	sn, ok := r.ld.Get(s.id)
	if !ok || sn.Inflight >= r.capOf(s) {
		return false
	}
	// An engine whose scrape showed no queue is governed by the cap alone:
	// it was running everything it had, so what the router sent since may
	// well be running too. Stale metrics say nothing; an engine with nothing
	// of ours in flight always takes one (no wait on a scrape).
	if !sn.Fresh || sn.Inflight == 0 || sn.Metrics.Waiting <= 0 {
		return true
	}
	return sn.Metrics.Waiting+float64(sn.SentSince-sn.FinishedSince) < float64(n)
}

// pinTarget is the server a full_determinism pin names: pool[pin mod n],
// or, when that one is not eligible, the eligible servers' [pin mod m], so
// a pin stays deterministic for a given pool and health.
func (r *Router) pinTarget(pin int) *server {
	if len(r.pool) == 0 {
		return nil
	}
	if s := r.pool[pin%len(r.pool)]; r.eligible(s) {
		return s
	}
	n := 0
	for _, s := range r.pool {
		if r.eligible(s) {
			n++
		}
	}
	k := pin % n
	for _, s := range r.pool {
		if r.eligible(s) {
			if k == 0 {
				return s
			}
			k--
		}
	}
	return nil // unreachable: n > 0 when pool is not empty
}

// targetOf is the server req must wait for (nil = any): the server its
// sticky session is bound to (unless the breakout would leave it, or it is
// not eligible), else its full_determinism pin's server.
func (r *Router) targetOf(req *Request) *server {
	if !req.Probe {
		if s := r.liveBinding(req.ID); s != nil {
			if !r.eligible(s) || (!r.hasRoom(s) && r.overloaded(s)) {
				return nil // re-scored among servers with room
			}
			return s
		}
	}
	if req.Pin >= 0 {
		return r.pinTarget(req.Pin)
	}
	return nil
}

// liveBinding is the pool member id's sticky session is bound to (nil: none,
// or a removed server).
func (r *Router) liveBinding(id string) *server {
	if sid, ok := r.sticky.Peek(id); ok {
		return r.byID[sid]
	}
	return nil
}

// Submit routes req as Acquire does, unless admission holds it: then it
// returns queued = true and the request is decided later, in the Admitted
// list of the ReleaseAdmit or Pump call that gives it a slot (or fails it).
// A request free to go anywhere is held only while no eligible server has
// room; a sticky session or a pinned request whose server is full waits
// for that server. Room that appeared since the last ReleaseAdmit or Pump
// goes to held requests first (reported by the next ReleaseAdmit or Pump).
// ticket identifies the request to the caller; it must not be held already.
func (r *Router) Submit(req Request, ticket uint64) (d Decision, queued bool, err error) {
	if !r.admit {
		d, err = r.Acquire(req)
		return d, false, err
	}
	if len(req.Tokens) > r.cfg.MaxPromptTokens {
		d, err = r.Acquire(req) // the same rejection and counter
		return d, false, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.pool) == 0 {
		r.counters.Acquires++
		r.counters.NoServers++
		return Decision{}, false, ErrNoServers
	}
	if _, dup := r.aq.tickets[ticket]; dup {
		return Decision{}, false, fmt.Errorf("%w: ticket %d", ErrTicketHeld, ticket)
	}
	r.scanHealth()
	if len(r.aq.tickets) > 0 {
		r.rebind()
		r.aq.ready = r.fillAll(r.aq.ready)
	}
	target := r.targetOf(&req)
	switch {
	case target != nil && r.hasRoom(target):
		if req.Pin >= 0 {
			// decide pins an unbound request to pool[Pin] (a binding
			// to a removed server is dropped there first).
			req.Pin = r.poolIndex(target)
		}
		d, err = r.acquireLocked(&req)
		return d, false, err
	case target == nil && r.anyRoom():
		d, err = r.acquireLocked(&req)
		return d, false, err
	}
	if len(r.aq.tickets) >= r.cfg.Admission.MaxQueue {
		r.aq.st.Rejected++
		return Decision{}, false, fmt.Errorf("%w: %d requests held (admission.max_queue)", ErrQueueFull, len(r.aq.tickets))
	}
	size := int64(4*len(req.Tokens)+len(req.ID)+len(req.Lora)) + heldOverhead
	if r.aq.bytes+size > r.cfg.Admission.MaxHeldBytes {
		r.aq.st.Rejected++
		return Decision{}, false, fmt.Errorf("%w: %d bytes of prompts held, %d more would pass admission.max_held_bytes = %d",
			ErrQueueFull, r.aq.bytes, size, r.cfg.Admission.MaxHeldBytes)
	}
	r.notePrompt(len(req.Tokens))
	h := &held{ticket: ticket, req: req, affinity: target, pin: req.Pin, bytes: size, seq: r.aq.seq}
	r.aq.seq++
	h.req.Tokens = append([]int32(nil), req.Tokens...)
	bs := r.cfg.BlockSize
	if n := blockhash.HittableBlocks(len(h.req.Tokens), bs); n > 0 {
		keys := r.memo.AppendKeys(r.keys[bs][:0], h.req.Tokens, bs, blockhash.Namespace(r.cfg.Model, req.Lora))
		r.keys[bs] = keys
		h.last = keys[n-1]
	}
	r.queueOf(target).push(h)
	if target == nil {
		r.lenHold(h)
	}
	r.aq.tickets[ticket] = h
	r.aq.bytes += size
	r.aq.peak = max(r.aq.peak, r.aq.bytes)
	r.aq.st.Queued++
	r.aq.st.MaxHeld = max(r.aq.st.MaxHeld, len(r.aq.tickets))
	return Decision{}, true, nil
}

func (r *Router) anyRoom() bool {
	for _, s := range r.pool {
		if r.hasRoom(s) {
			return true
		}
	}
	return false
}

func (r *Router) poolIndex(s *server) int {
	for i, p := range r.pool {
		if p == s {
			return i
		}
	}
	return -1
}

// queueOf is the queue of requests waiting for s (nil: the free queue).
func (r *Router) queueOf(s *server) *heldQueue {
	if s == nil {
		return &r.aq.free
	}
	q := r.aq.bound[s]
	if q == nil {
		q = &heldQueue{}
		r.aq.bound[s] = q
	}
	return q
}

// overloaded reports whether the sticky breakout would leave s: such a
// session is not held for s but re-scored among servers with room.
func (r *Router) overloaded(s *server) bool {
	if !r.overload {
		return false
	}
	sn, _ := r.ld.Get(s.id)
	c := r.candidateOf(s, &sn) // as scoring sees it: breakout and admission agree
	return !sn.Healthy || strategy.EffectiveLoad(r.strat, &c) > r.threshold
}

// ReleaseAdmit releases one request on server (as Release) and admits held
// requests into the room it frees, appending them (and any a Submit
// admitted) to out.
func (r *Router) ReleaseAdmit(server string, out []Admitted) ([]Admitted, bool) {
	ok := r.Release(server)
	if !r.admit {
		return out, ok
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out = r.takeReady(out)
	r.scanHealth()
	if s := r.byID[server]; s != nil {
		out = r.fill(s, out)
	}
	r.drained()
	return out, ok
}

// Pump admits held requests into any room (servers added, caps raised by
// fresh metrics, plain releases, reconciled slots), re-targets requests
// waiting for a server that left the pool or turned unhealthy, and fails
// held requests once the pool has stayed empty for admission.empty_pool_ms;
// it appends them all to out.
func (r *Router) Pump(out []Admitted) []Admitted {
	if !r.admit {
		return out
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out = r.takeReady(out)
	if len(r.aq.tickets) == 0 {
		return out
	}
	if len(r.pool) == 0 {
		return r.failIfEmptyTooLong(out)
	}
	r.scanHealth()
	r.rebind()
	out = r.fillAll(out)
	r.drained()
	return out
}

func (r *Router) takeReady(out []Admitted) []Admitted {
	if len(r.aq.ready) > 0 {
		out = append(out, r.aq.ready...)
		clear(r.aq.ready)
		r.aq.ready = r.aq.ready[:0]
	}
	return out
}

// failIfEmptyTooLong fails every held request once the pool has been
// empty for admission.empty_pool_ms; r.mu held, pool empty.
func (r *Router) failIfEmptyTooLong(out []Admitted) []Admitted {
	if r.aq.emptySince.IsZero() {
		r.aq.emptySince = r.now()
	}
	wait := time.Duration(r.cfg.Admission.EmptyPoolMS) * time.Millisecond
	if r.now().Sub(r.aq.emptySince) < wait {
		return out
	}
	err := fmt.Errorf("%w: the pool stayed empty for %v while the request was held (admission.empty_pool_ms)", ErrNoServers, wait)
	for _, h := range r.aq.tickets {
		r.forget(h)
		r.aq.st.Failed++
		out = append(out, Admitted{Ticket: h.ticket, Err: err})
	}
	r.drained()
	return out
}

// rebind moves requests waiting for a server that left the pool or is no
// longer eligible: a pinned one to its pin's new server, a session to the
// free queue (it is re-scored when admitted); r.mu held.
func (r *Router) rebind() {
	for s, q := range r.aq.bound {
		if q.n == 0 {
			delete(r.aq.bound, s)
			continue
		}
		if r.byID[s.id] == s && r.eligible(s) {
			continue
		}
		var sessions heldQueue
		moved := map[*server]*heldQueue{}
		for h := q.head; h != nil; {
			next := h.next
			q.unlink(h)
			var to *server
			if h.pin >= 0 && r.liveBinding(h.req.ID) == nil {
				to = r.pinTarget(h.pin)
			}
			h.affinity = to
			if to == nil {
				sessions.push(h)
			} else {
				if moved[to] == nil {
					moved[to] = &heldQueue{}
				}
				moved[to].push(h)
			}
			h = next
		}
		delete(r.aq.bound, s)
		for h := sessions.head; h != nil; h = h.next {
			r.lenHold(h) // free to go anywhere now
		}
		r.aq.free.merge(&sessions)
		for to, mq := range moved {
			r.queueOf(to).merge(mq)
		}
	}
}

// Cancel drops a held request (its caller gave up); false if the ticket is
// not held (already admitted, or unknown).
func (r *Router) Cancel(ticket uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.aq.tickets[ticket]
	if h == nil {
		return false
	}
	r.forget(h)
	r.aq.st.Cancelled++
	r.drained()
	return true
}

// forget unlinks h from its queue and the ticket map and drops its prompt;
// r.mu held.
func (r *Router) forget(h *held) {
	q := h.q
	q.unlink(h)
	if q != &r.aq.free && q.n == 0 && h.affinity != nil && r.aq.bound[h.affinity] == q {
		delete(r.aq.bound, h.affinity)
	}
	delete(r.aq.tickets, h.ticket)
	r.lenForget(h)
	r.aq.bytes -= h.bytes
	h.req.Tokens = nil
}

// drained returns a large queue's memory to the OS once it empties (Go
// keeps freed heap pages otherwise); r.mu held.
func (r *Router) drained() {
	if len(r.aq.tickets) == 0 && r.aq.peak > 0 {
		memtrim.Note(int(min(r.aq.peak, math.MaxInt32)))
		r.aq.peak = 0
	}
}

// Held is the number of requests waiting for a slot.
func (r *Router) Held() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.aq.tickets)
}

func (r *Router) fillAll(out []Admitted) []Admitted {
	for _, s := range r.pool {
		if len(r.aq.tickets) == 0 {
			break
		}
		out = r.fill(s, out)
	}
	return out
}

// fill gives s's free slots to held requests; r.mu held, scanHealth done.
func (r *Router) fill(s *server, out []Admitted) []Admitted {
	for len(r.aq.tickets) > 0 && r.hasRoom(s) {
		h := r.next(s)
		if h == nil {
			break
		}
		req := h.req
		req.Pin = -1 // a pinned request is admitted on its pin's server (s)
		r.forget(h)
		d := r.admitOn(&req, s)
		r.aq.st.Admitted++
		out = append(out, Admitted{Ticket: h.ticket, Decision: d})
	}
	return out
}

// next chooses the held request a slot on s admits (nil: none may go to
// s): the oldest waiting for s, else longest-first's pick when it decides
// (lengths.longest_first), else the oldest free request once Window
// younger ones went ahead of it (aging: none waits for ever), else what
// the admission order picks among the free requests.
func (r *Router) next(s *server) *held {
	if q := r.aq.bound[s]; q != nil && q.head != nil {
		return q.head
	}
	q := &r.aq.free
	head := q.head
	if head == nil {
		return nil
	}
	// Longest-first bounds its own passing-over (lengths.max_skips): the
	// window's aging would put the head first every Window picks.
	if h, ok := r.pickLongest(q); ok {
		return h
	}
	if head.passed >= r.cfg.Admission.Window {
		return head
	}
	h := r.aq.order.pick(r, s, q, r.cfg.Admission.Window)
	if h == nil {
		h = head
	}
	if h != head {
		head.passed++
	}
	return h
}

// admissionOrder chooses which free held request (one that may go to any
// server) a slot on s admits, among the oldest window of q; nil leaves the
// choice to the caller (the oldest). It is admission's one replaceable
// policy: caps, health, requests waiting for one server and aging are
// enforced around it.
type admissionOrder interface {
	pick(r *Router, s *server, q *heldQueue, window int) *held
}

// siblingsFirst is the default order: a sibling of a prompt s holds (it
// shares prefill and KV there) unless its group spreads (groupFull), else
// a prompt no server holds yet (it starts a new group without splitting
// one), else the oldest.
type siblingsFirst struct{}

func (siblingsFirst) pick(r *Router, s *server, q *heldQueue, window int) *held {
	var fresh *held
	one := [1]index.ServerID{s.ix}
	var m [1]index.Match
	seen := r.aq.pickMemo
	clear(seen)
	r.aq.pickElig = r.aq.pickElig[:0] // groupFull fills it once for this pick
	i := 0
	for h := q.head; h != nil && i < window; h, i = h.next, i+1 {
		if h.last == 0 {
			if fresh == nil {
				fresh = h
			}
			continue
		}
		st, ok := seen[h.last]
		if !ok {
			key := [1]uint64{h.last}
			r.scratch = r.ix.MatchPrefix(key[:], one[:], m[:], r.scratch)
			if m[0].Blocks > 0 {
				st = 1 // held on s
				if r.groupFull(h, s) {
					st = 3 // held on s, but its group spreads elsewhere first
				}
			} else if fresh == nil {
				r.ids = r.ids[:0]
				for _, p := range r.pool {
					r.ids = append(r.ids, p.ix)
				}
				r.matches = grow(r.matches, len(r.ids))
				r.scratch = r.ix.MatchPrefix(key[:], r.ids, r.matches, r.scratch)
				st = 0 // held nowhere
				for _, mm := range r.matches[:len(r.ids)] {
					if mm.Blocks > 0 {
						st = 2 // held elsewhere
						break
					}
				}
			} else {
				st = 2 // a fresh one is already found: only siblings matter now
			}
			seen[h.last] = st
		}
		switch st {
		case 1:
			return h
		case 0:
			if fresh == nil {
				fresh = h
			}
		}
	}
	return fresh
}

// groupFull reports whether held sibling h should not join its group on
// s: the strategy spreads h's group (kvc_aware's group_spread, read with
// the correlation measured so far: this step's finishers, else the last
// step's; see strategy.GroupSpreader) and s already has more of it placed
// this step than the pool server with the fewest (than the fewest of the
// servers holding it, once it is on as many as the strategy's cap allows,
// group_spread_max_servers, or before anything is measured
// group_spread_open_max_servers: a server outside that cap takes none).
// Without it, a freed
// slot keeps taking the siblings of the prompts its server holds, so a
// group runs on one server, and where a prompt's samples are alike a
// long group makes that server the step's straggler; r.mu held.
func (r *Router) groupFull(h *held, s *server) bool {
	if r.groups == nil || h.last == 0 {
		return false
	}
	r.setSreq("", nil)
	if l := r.lens; l != nil { // what is measured so far, this step's finishers included
		r.sreq.LengthCorr, r.sreq.LengthCorrKnown = l.measured, l.measuredOK
	}
	spread, maxServers := strategy.SpreadsGroup(r.strat, &r.sreq, len(h.req.Tokens))
	if !spread {
		return false
	}
	placed, _ := r.groups.Peek(h.last)
	if len(r.aq.pickElig) != len(r.pool) { // once per pick: health holds within one
		r.aq.pickElig = r.aq.pickElig[:0]
		for _, p := range r.pool {
			r.aq.pickElig = append(r.aq.pickElig, r.eligible(p))
		}
	}
	on, fewest := 0, math.MaxInt
	holders, fewestHeld := 0, math.MaxInt
	for i, p := range r.pool {
		if !r.aq.pickElig[i] {
			continue // an unhealthy server gets no slot to take its share
		}
		n := 0
		for _, c := range placed {
			if c.s == p {
				n = c.n
				break
			}
		}
		if p == s {
			on = n
		}
		fewest = min(fewest, n)
		if n > 0 {
			holders++
			fewestHeld = min(fewestHeld, n)
		}
	}
	// group_spread_max_servers: once the group is on that many servers it
	// grows only on them, evenly (placement's cap, read the same way).
	if maxServers > 0 && holders >= maxServers {
		fewest = fewestHeld
		if on == 0 {
			fewest = -1 // a server outside the cap takes none of it
		}
	}
	if on > fewest {
		r.aq.st.GroupSpread++
		return true
	}
	return false
}

// admitOn routes req to s (a held request given s's slot); r.mu held.
func (r *Router) admitOn(req *Request, s *server) Decision {
	r.counters.Acquires++
	for k := range r.keys {
		r.keys[k] = r.keys[k][:0]
	}
	tr := r.trace.begin(req, r.counters.Acquires)
	tr.setPool(r.pool)
	n, group := r.fillCandidates(req)
	r.placed(group, s)
	tr.candidates(r.cands[:n], nil, nil)
	d := Decision{Server: s.id, Reason: ReasonAdmitted, Candidates: n}
	hit := 0
	for i := 0; i < n; i++ {
		if r.cands[i].ID == s.id {
			d = r.decision(i, ReasonAdmitted, n, false)
			hit = r.cands[i].Hit.Blocks
			break
		}
	}
	bound := ""
	if sid, ok := r.sticky.Peek(req.ID); ok {
		bound = sid
	}
	tr.rule, tr.bound = SessionAdmitted, bound
	tr.done(d, pickAdmitted)
	if _, bound := r.sticky.Peek(req.ID); bound {
		r.counters.StickyHits++
	} else {
		r.counters.Scored++
	}
	r.bind(req, s.id)
	r.speculateOn(s, req, hit)
	r.charge(req, &d)
	return d
}

// reconcile compares a server's fresh engine count (running + waiting)
// with the router's in-flight count there. Requests on their way to the
// engine or back make the router's count higher for moments; a client
// that died holding slots makes it higher for good. When the excess has
// been positive at every scrape for admission.reconcile_after_ms, the
// router's count drops by the smallest excess seen in that run, and held
// requests get the room at the next pump; r.mu held.
func (r *Router) reconcile(id string, m *load.Metrics) {
	after := r.cfg.Admission.ReconcileAfterMS
	if !r.admit || after < 0 {
		return
	}
	st := r.aq.recon[id]
	if st == nil {
		st = &reconState{}
		r.aq.recon[id] = st
	}
	excess := r.ld.Inflight(id) - int(math.Ceil(m.Running+m.Waiting))
	if excess <= 0 {
		st.since = time.Time{}
		return
	}
	at := m.At
	if at.IsZero() {
		at = r.now()
	}
	if st.since.IsZero() {
		st.since, st.min = at, excess
		return
	}
	st.min = min(st.min, excess)
	if at.Sub(st.since) < time.Duration(after)*time.Millisecond {
		return
	}
	for i := 0; i < st.min; i++ {
		r.ld.Release(id)
	}
	// The dead clients' charges cannot be named; they go when the server
	// is next idle, which may be now.
	r.workIdle(id)
	r.aq.st.Reconciled += uint64(st.min)
	st.since = time.Time{}
}
