package router

import (
	"errors"
	"fmt"
	"math"

	"github.com/kvc-router/kvc-router/core/blockhash"
	"github.com/kvc-router/kvc-router/core/index"
	"github.com/kvc-router/kvc-router/core/strategy"
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
// prefill and KV) while no engine idles with work held elsewhere.
type AdmissionSpec struct {
	// Enabled turns admission on (kvc_aware mode only).
	Enabled bool `json:"enabled"`
	// MaxInflight is each server's in-flight cap; 0 = its max_num_seqs
	// (from metrics, else load.max_num_seqs) times Headroom.
	MaxInflight int `json:"max_inflight"`
	// Headroom scales max_num_seqs into the cap (default 1).
	Headroom float64 `json:"headroom,omitempty"`
	// MaxQueue bounds held requests; beyond it Submit fails with
	// ErrQueueFull (default 65,536).
	MaxQueue int `json:"max_queue,omitempty"`
	// Window is how many of the oldest held requests a freed slot
	// considers (default 512).
	Window int `json:"window,omitempty"`
}

// Admission defaults.
const (
	DefaultAdmissionMaxQueue = 1 << 16
	DefaultAdmissionWindow   = 512
)

// ReasonAdmitted is the reason of a decision made when a held request is
// given a freed slot.
const ReasonAdmitted = "admitted"

// ErrQueueFull is returned by Submit when admission.max_queue requests are
// already held.
var ErrQueueFull = errors.New("router: admission queue full")

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
	return nil
}

// Admitted is a held request given a slot.
type Admitted struct {
	Ticket   uint64
	Decision Decision
}

// held is one request waiting for a slot.
type held struct {
	ticket uint64
	req    Request
	// last is the key of the prompt's last hittable block (0 = none):
	// requests with equal last keys are siblings (same prompt).
	last uint64
	// affinity is the server a sticky session is bound to (nil = any).
	affinity *server
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

func (r *Router) hasRoom(s *server) bool { return r.ld.Inflight(s.id) < r.capOf(s) }

// Submit routes req as Acquire does, unless admission holds it: then it
// returns queued = true and the request is decided later, in the Admitted
// list of the ReleaseAdmit or Pump call that gives it a slot. A new request
// is held only while no healthy server has room; a sticky session whose
// server is full waits for that server. ticket identifies the request to
// the caller (unique among held requests).
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
	var affinity *server
	if !req.Probe && req.Pin < 0 {
		if sid, ok := r.sticky.Peek(req.ID); ok {
			affinity = r.byID[sid]
		}
	}
	anyRoom := false
	for _, s := range r.pool {
		if r.hasRoom(s) {
			anyRoom = true
			break
		}
	}
	if affinity != nil && !r.hasRoom(affinity) && r.overloaded(affinity) {
		// The breakout would leave it anyway: any server will do.
		affinity = nil
	}
	if (affinity != nil && r.hasRoom(affinity)) || (affinity == nil && anyRoom) {
		d, err = r.acquireLocked(&req)
		return d, false, err
	}
	if len(r.queue) >= r.cfg.Admission.MaxQueue {
		r.adm.Rejected++
		return Decision{}, false, fmt.Errorf("%w: %d requests held (admission.max_queue)", ErrQueueFull, len(r.queue))
	}
	h := held{ticket: ticket, req: req, affinity: affinity}
	h.req.Tokens = append([]int32(nil), req.Tokens...)
	bs := r.cfg.BlockSize
	if n := blockhash.HittableBlocks(len(h.req.Tokens), bs); n > 0 {
		keys := r.memo.AppendKeys(r.keys[bs][:0], h.req.Tokens, bs, blockhash.Namespace(r.cfg.Model, req.Lora))
		r.keys[bs] = keys
		h.last = keys[n-1]
	}
	r.queue = append(r.queue, h)
	r.adm.Queued++
	r.adm.MaxHeld = max(r.adm.MaxHeld, len(r.queue))
	return Decision{}, true, nil
}

// overloaded reports whether the sticky breakout would leave s: such a
// session is not held for s but re-scored among servers with room.
func (r *Router) overloaded(s *server) bool {
	if !r.overload {
		return false
	}
	sn, _ := r.ld.Get(s.id)
	c := candidateOf(s, &sn)
	return !sn.Healthy || strategy.EffectiveLoad(r.strat, &c) > r.threshold
}

// ReleaseAdmit releases one request on server (as Release) and admits held
// requests into the room it frees, appending them to out.
func (r *Router) ReleaseAdmit(server string, out []Admitted) ([]Admitted, bool) {
	ok := r.Release(server)
	if !r.admit {
		return out, ok
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.byID[server]; s != nil {
		out = r.fill(s, out)
	}
	return out, ok
}

// Pump admits held requests into any room (servers added, caps raised by
// fresh metrics), appending them to out.
func (r *Router) Pump(out []Admitted) []Admitted {
	if !r.admit {
		return out
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.pool {
		out = r.fill(s, out)
	}
	// Sessions bound to servers that left the pool now go anywhere.
	for i := range r.queue {
		if a := r.queue[i].affinity; a != nil && r.byID[a.id] != a {
			r.queue[i].affinity = nil
		}
	}
	for _, s := range r.pool {
		out = r.fill(s, out)
	}
	return out
}

// Cancel drops a held request (its caller gave up); false if the ticket is
// not held (already admitted, or unknown).
func (r *Router) Cancel(ticket uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.queue {
		if r.queue[i].ticket == ticket {
			r.queue = append(r.queue[:i], r.queue[i+1:]...)
			r.adm.Cancelled++
			return true
		}
	}
	return false
}

// Held is the number of requests waiting for a slot.
func (r *Router) Held() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.queue)
}

// fill gives s's free slots to held requests; r.mu held.
func (r *Router) fill(s *server, out []Admitted) []Admitted {
	for len(r.queue) > 0 && r.hasRoom(s) {
		i := r.pick(s)
		if i < 0 {
			break
		}
		h := r.queue[i]
		r.queue = append(r.queue[:i], r.queue[i+1:]...)
		h.req.Pin = -1
		d := r.admitOn(&h.req, s)
		r.adm.Admitted++
		out = append(out, Admitted{Ticket: h.ticket, Decision: d})
	}
	return out
}

// pick chooses the held request for a slot on s among the oldest Window:
// a session bound to s, else a sibling of a prompt s holds, else a prompt
// no server holds, else the oldest request free to go anywhere; -1 if
// every held request waits for another server.
func (r *Router) pick(s *server) int {
	w := min(len(r.queue), r.cfg.Admission.Window)
	sibling, fresh, any := -1, -1, -1
	one := [1]index.ServerID{s.ix}
	var m [1]index.Match
	seen := r.pickMemo
	clear(seen)
	for i := 0; i < w; i++ {
		h := &r.queue[i]
		if h.affinity != nil {
			if h.affinity == s {
				return i
			}
			continue
		}
		if any < 0 {
			any = i
		}
		if h.last == 0 || sibling >= 0 {
			if fresh < 0 && h.last == 0 {
				fresh = i
			}
			continue
		}
		st, ok := seen[h.last]
		if !ok {
			key := [1]uint64{h.last}
			r.scratch = r.ix.MatchPrefix(key[:], one[:], m[:], r.scratch)
			if m[0].Blocks > 0 {
				st = 1
			} else {
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
			}
			seen[h.last] = st
		}
		switch st {
		case 1:
			sibling = i
		case 0:
			if fresh < 0 {
				fresh = i
			}
		}
	}
	switch {
	case sibling >= 0:
		return sibling
	case fresh >= 0:
		return fresh
	}
	return any
}

// admitOn routes req to s (a held request given s's slot); r.mu held.
func (r *Router) admitOn(req *Request, s *server) Decision {
	r.counters.Acquires++
	for k := range r.keys {
		r.keys[k] = r.keys[k][:0]
	}
	n := r.fillCandidates(req)
	d := Decision{Server: s.id, Reason: ReasonAdmitted, Candidates: n}
	hit := 0
	for i := 0; i < n; i++ {
		if r.cands[i].ID == s.id {
			d = r.decision(i, ReasonAdmitted, n)
			hit = r.cands[i].Hit.Blocks
			break
		}
	}
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
