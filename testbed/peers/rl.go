package peers

import (
	"github.com/kvc-router/kvc-router/core/kvcrouter"
	"hash/fnv"
	"math"
)

// VerlLeastLoaded is verl's GlobalRequestLoadBalancer new-pick rule for a
// request_id it has not bound: the fewest in-flight requests. Ties:
//
//   - verl 0.9.1 (verl/workers/rollout/router.py, acquire_server; PR
//     #7613): random.choice over the tied servers in insertion order, from
//     the process-wide generator. Here it is a PyRandom seeded with Seed,
//     so a run replays verl's class under random.seed(Seed) exactly.
//   - verl 0.9.0 (verl/workers/rollout/llm_server.py): the first tied
//     server in insertion order (FirstTie).
//
// The sticky request_id binding (LRU 10,000, no load check) is the
// router's default mode; this strategy only scores new picks.
type VerlLeastLoaded struct {
	FirstTie bool
	rng      *PyRandom
	ties     []int
}

// NewVerlLeastLoaded returns verl 0.9.1's rule seeded with seed, or
// 0.9.0's when firstTie.
func NewVerlLeastLoaded(seed uint64, firstTie bool) *VerlLeastLoaded {
	return &VerlLeastLoaded{FirstTie: firstTie, rng: NewPyRandom(seed)}
}

// Name implements kvcrouter.Strategy.
func (v *VerlLeastLoaded) Name() string {
	if v.FirstTie {
		return "verl_default_090"
	}
	return "verl_default"
}

// Score implements kvcrouter.Strategy: −in-flight, the chosen tied server
// lifted above the others (kvcrouter.Pick would take the first).
func (v *VerlLeastLoaded) Score(_ *kvcrouter.ScoreRequest, c []kvcrouter.Candidate, out []float64) {
	if len(c) == 0 {
		return
	}
	minL := math.MaxInt
	for i := range c {
		out[i] = -float64(c[i].Inflight)
		minL = min(minL, c[i].Inflight)
	}
	v.ties = v.ties[:0]
	for i := range c {
		if c[i].Inflight == minL {
			v.ties = append(v.ties, i)
		}
	}
	k := 0
	if !v.FirstTie {
		k = v.rng.Below(len(v.ties))
	}
	out[v.ties[k]] = math.Nextafter(out[v.ties[k]], math.Inf(1))
}

// StickyLeastLoaded is vllm-router's sticky_least_loaded policy
// (vllm-project/router src/policies/sticky_least_loaded.rs, 0.1.17; the
// default of SkyRL and prime-rl): the router counts active *sessions* per
// replica (not requests). A new session goes to the replica with the
// fewest active sessions, ties broken by rendezvous hashing of
// "session:url" (deterministic per session); the session is recorded
// there. Later requests of a session stick to its replica (the router's
// sticky table, bound by request_id). A session stops counting when the
// client calls POST /finish_session (FinishSession) or after the idle
// expiry, 7,200 s by default (VLLM_ROUTER_SLL_SESSION_EXPIRATION_IN_S),
// which no kvbench run reaches. The rendezvous hash here is FNV-1a, not
// the upstream furc/murmur hash: same property (a fixed pseudo-random
// order per session), different draws.
type StickyLeastLoaded struct {
	sessions map[string]string
	active   map[string]int
}

// NewStickyLeastLoaded returns the policy with no sessions.
func NewStickyLeastLoaded() *StickyLeastLoaded {
	return &StickyLeastLoaded{sessions: map[string]string{}, active: map[string]int{}}
}

// Name implements kvcrouter.Strategy.
func (*StickyLeastLoaded) Name() string { return "vllm_router_sticky_least_loaded" }

// Score implements kvcrouter.Strategy. It is called for a session the
// router has not bound (a new one): the pick is recorded as that
// session's replica.
func (s *StickyLeastLoaded) Score(req *kvcrouter.ScoreRequest, c []kvcrouter.Candidate, out []float64) {
	if len(c) == 0 {
		return
	}
	minA := math.MaxInt
	for i := range c {
		minA = min(minA, s.active[c[i].ID])
	}
	pick, best := -1, uint64(0)
	for i := range c {
		out[i] = -float64(s.active[c[i].ID])
		if s.active[c[i].ID] != minA {
			continue
		}
		h := fnv.New64a()
		_, _ = h.Write([]byte(req.ID + ":" + c[i].ID))
		if w := h.Sum64(); pick < 0 || w > best {
			pick, best = i, w
		}
	}
	out[pick] = math.Nextafter(out[pick], math.Inf(1))
	if old, ok := s.sessions[req.ID]; ok {
		// A session whose replica was lost is reassigned.
		s.drop(old)
	}
	s.sessions[req.ID] = c[pick].ID
	s.active[c[pick].ID]++
}

// FinishSession is POST /finish_session: the session stops counting.
// Unknown sessions are ignored, as upstream.
func (s *StickyLeastLoaded) FinishSession(id string) {
	if srv, ok := s.sessions[id]; ok {
		delete(s.sessions, id)
		s.drop(srv)
	}
}

func (s *StickyLeastLoaded) drop(srv string) {
	if s.active[srv]--; s.active[srv] <= 0 {
		delete(s.active, srv)
	}
}

// SessionFinisher is a strategy told when a workload's trajectory (all
// requests with one request_id) has ended, as a client calling
// vllm-router's /finish_session does.
type SessionFinisher interface {
	FinishSession(id string)
}
