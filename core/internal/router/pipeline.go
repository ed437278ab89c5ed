package router

// The routing pipeline: how one request becomes a decision, in one place.
//
//	session     look up the request's binding (a binding to a server that
//	            left the pool is dropped)
//	candidates  the pool, in insertion order
//	filters     pin (full_determinism) → health → prefix match
//	session     a bound request stays, moves or breaks out (sessionRule)
//	scorers     the strategy's score per candidate (kvc_aware: cache
//	            credit, load, session load, overload penalty)
//	filters     room: no new binding to a full server while one has room
//	pick        highest score, ties to the server added first
//	session     bind the request to the pick; speculate its blocks there
//
// verl's default mode stops at the first session step when a binding
// exists (verl honours every binding) and otherwise scores with
// least_inflight. Each decision leaves an explanation of every stage
// (explain.go), which Status reports as last_decision.
//
// Two filters run at different points for a reason. Health and pin remove
// servers before scoring, so the strategy normalises (marginal credit's
// smallest match, the session mean) over the servers that may be chosen.
// Room only masks servers at the pick: a full server still counts in that
// normalisation, as it did before the pipeline was written down, so the
// routing of every fixed-seed benchmark is unchanged (docs/architecture.md,
// "The routing pipeline").

import (
	"math"

	"github.com/kvc-router/kvc-router/core/internal/blockhash"
	"github.com/kvc-router/kvc-router/core/internal/load"
	"github.com/kvc-router/kvc-router/core/internal/strategy"
)

// Session rules: what the session policy did with a request (Explain).
const (
	// SessionNew: no binding; the pipeline places the request and binds
	// its id to the pick.
	SessionNew = "new"
	// SessionStale: the id was bound to a server that left the pool; the
	// binding is dropped and the request placed as new.
	SessionStale = "stale"
	// SessionProbe: a probe request neither reads nor writes a binding.
	SessionProbe = "probe"
	// SessionPinned: no binding; full_determinism pins the request.
	SessionPinned = "pinned"
	// SessionVerl: default mode honours every binding (verl's LRU).
	SessionVerl = "sticky_verl"
	// SessionStay: the bound server is healthy and not overloaded.
	SessionStay = "stay"
	// SessionMove: a multi-turn session leaves a server bound to far more
	// sessions than another (sessionRule).
	SessionMove = "move"
	// SessionMoveTokens: a multi-turn session leaves a server with far
	// more prompt tokens in flight than another (session_move_tokens).
	SessionMoveTokens = "move_tokens"
	// SessionOverloaded: the bound server's load is over the threshold;
	// the request is re-scored and rebound.
	SessionOverloaded = "breakout_overloaded"
	// SessionUnhealthy: the bound server is unhealthy; the request is
	// re-scored and rebound.
	SessionUnhealthy = "breakout_unhealthy"
	// SessionAdmitted: admission gave a held request a freed slot.
	SessionAdmitted = "admitted"
)

// decide runs the pipeline for one request; r.mu held.
func (r *Router) decide(req *Request) (Decision, error) {
	for k := range r.keys {
		r.keys[k] = r.keys[k][:0]
	}
	tr := r.trace.begin(req, r.counters.Acquires)

	// Session: the binding.
	bound, rule := r.binding(req)
	tr.session(bound, rule)
	if len(r.pool) == 0 {
		r.counters.NoServers++
		tr.fail(ErrNoServers)
		return Decision{}, ErrNoServers
	}
	// Candidates.
	tr.setPool(r.pool)
	if r.admit {
		r.scanHealth() // hasRoom (moveTarget, roomFilter) reads it
	}
	if bound != nil && !r.kvc {
		r.counters.StickyHits++
		tr.session(bound, SessionVerl)
		return tr.done(Decision{Server: bound.id, Reason: ReasonSticky, Candidates: len(r.pool)}, pickBound), nil
	}
	// Filter: pin. A pinned request skips scoring (verl's
	// full_determinism: pool[pin mod n]).
	if bound == nil && req.Pin >= 0 {
		s := r.pool[req.Pin%len(r.pool)]
		r.bind(req, s.id)
		r.counters.Pinned++
		if r.speculate {
			r.speculateOn(s, req, 0)
		}
		tr.session(nil, SessionPinned)
		tr.pin(req.Pin, s.id)
		return tr.done(Decision{Server: s.id, Reason: ReasonPinned, Candidates: len(r.pool)}, pickPinned), nil
	}
	// Filter: health; then the prefix match of every candidate.
	n := r.candidates()
	r.matchPrefix(req, n)
	group := r.groupKeyOf(n)
	r.fillSiblings(group, n)

	// Session: a bound request stays, moves or breaks out.
	if bound != nil {
		v, i := r.sessionRule(req, bound, n)
		tr.session(bound, v)
		switch v {
		case SessionStay:
			r.counters.StickyHits++
			d := r.decision(i, ReasonSticky, n, false)
			r.speculateOn(bound, req, r.cands[i].Hit.Blocks)
			tr.candidates(r.cands[:n], nil, nil)
			return tr.done(d, pickBound), nil
		case SessionMove, SessionMoveTokens:
			r.counters.StickyBroken++
			r.counters.SessionMoves++
			if v == SessionMoveTokens {
				r.counters.SessionMovesTokens++
			}
			d := r.decision(i, ReasonRebalanced, n, false)
			r.bind(req, d.Server)
			r.speculateOn(r.cpool[i], req, r.cands[i].Hit.Blocks)
			tr.candidates(r.cands[:n], nil, nil)
			return tr.done(d, pickMoved), nil
		}
	}

	// Scorers.
	// r.sreq, not a local: a pointer passed to an interface method
	// escapes, and the decision path allocates nothing.
	r.setSreq(req.ID, req.Tokens)
	r.strat.Score(&r.sreq, r.cands[:n], r.scores[:n])
	r.sreq.Tokens = nil // the caller's buffer, borrowed for this call only
	tr.scoredWith(&r.sreq, len(req.Tokens))
	// Filter: room. Never send a new binding to a full server while one
	// has room.
	masked := r.roomFilter(n)
	tr.candidates(r.cands[:n], r.scores[:n], masked)
	if masked != nil {
		for i := 0; i < n; i++ {
			if masked[i] {
				r.scores[i] = math.Inf(-1)
			}
		}
	}
	// Pick.
	best := strategy.Pick(r.cands[:n], r.scores[:n])
	reason := ReasonScored
	if bound != nil {
		reason = ReasonRebalanced
		r.counters.StickyBroken++
	} else {
		r.counters.Scored++
	}
	d := r.decision(best, reason, n, true)
	// Session: bind to the pick.
	r.bind(req, d.Server)
	r.placed(group, r.cpool[best])
	r.speculateOn(r.byID[d.Server], req, r.cands[best].Hit.Blocks)
	return tr.done(d, pickScored), nil
}

// binding is the session policy's first step: the server req's id is bound
// to (nil: none), and the rule that applies while no other does. A read
// refreshes the binding's recency, as verl's cachetools LRU does; a
// binding to a server that left the pool is dropped here.
func (r *Router) binding(req *Request) (*server, string) {
	if req.Probe {
		return nil, SessionProbe
	}
	if !r.sticky.Contains(req.ID) {
		return nil, SessionNew
	}
	sid, _ := r.sticky.Get(req.ID)
	if s, ok := r.byID[sid]; ok {
		return s, SessionStay
	}
	r.sticky.Remove(req.ID)
	r.counters.StickyStale++
	return nil, SessionStale
}

// sessionRule is the session policy for a request bound to a server, in
// kvc_aware mode: it stays (SessionStay, i = the bound candidate), moves at
// this turn boundary (SessionMove, i = the target), or breaks out to be
// re-scored (SessionOverloaded, SessionUnhealthy; i = -1).
//
// Stickiness: a binding is honoured while its server passed the health
// filter and, with sticky_overload on, is healthy and its load (as the
// strategy measures it, strategy.EffectiveLoad) is at most load_threshold.
//
// Moves: placement cannot tell, at a session's first request, whether it
// will send more: kvc_aware keeps siblings (requests sharing a whole
// prompt) together, which suits GRPO samples but piles an agent task's
// trajectories onto one server — with fewer tasks than servers, some
// servers then idle for the whole step. Once the router has seen later
// turns (strategy.MultiTurn), a session whose server is bound to at least
// max(2, mean/2) sessions more than the least-bound healthy, not
// overloaded server (with room, under admission) moves there: one prefill
// of its context buys every later turn a server of its own. Sessions bound
// to one server in that excess are moved one per turn boundary, so the
// counts level out.
func (r *Router) sessionRule(req *Request, bound *server, n int) (string, int) {
	i := -1
	for k := 0; k < n; k++ {
		if r.cands[k].ID == bound.id {
			i = k
			break
		}
	}
	if i < 0 {
		return SessionUnhealthy, -1 // removed by the health filter
	}
	c := &r.cands[i]
	if r.overload {
		if !c.Healthy {
			return SessionUnhealthy, -1
		}
		if strategy.EffectiveLoad(r.strat, c) > r.threshold {
			return SessionOverloaded, -1
		}
	}
	if v, j := r.moveTarget(len(req.Tokens), i, n); j >= 0 {
		return v, j
	}
	return SessionStay, i
}

// moveTarget is the candidate a session bound to candidate i, whose next
// turn's prompt is own tokens, moves to at this turn and the rule that
// moves it (sessionRule), or -1: it stays. Both rules need evidence that
// sessions return (MultiTurn) and take a healthy, not overloaded server
// with room (under admission); one pass over the candidates serves both.
//
//   - By counts (SessionMove): the bound server holds at least max(2,
//     mean/2) more sessions than the least-bound one (fewer in flight breaks
//     ties), which moves there.
//   - By context (SessionMoveTokens, session_move_tokens): the bound server
//     has at least session_move_tokens x own, and at least
//     minMoveExcessTokens, more prompt tokens in flight than the server with
//     the fewest, which takes it. In-flight tokens, not the contexts of
//     every session bound there: sessions waiting on a tool decode nothing,
//     and counting them for a while after their last turn moved fewer
//     sessions for a longer step on kvbench's agent setting.
func (r *Router) moveTarget(own, i, n int) (string, int) {
	if !r.moveSessions || n < 2 ||
		strategy.MultiTurn(&strategy.Request{SessionsBound: r.bound, LaterTurns: r.counters.StickyHits + r.counters.StickyBroken}) < 0.5 {
		return "", -1
	}
	total, js, jt := 0, -1, -1
	for k := 0; k < n; k++ {
		c := &r.cands[k]
		total += c.Sessions
		if k == i || !c.Healthy || strategy.EffectiveLoad(r.strat, c) > r.threshold || (r.admit && !r.hasRoom(r.cpool[k])) {
			continue
		}
		if js < 0 || c.Sessions < r.cands[js].Sessions ||
			(c.Sessions == r.cands[js].Sessions && c.Inflight < r.cands[js].Inflight) {
			js = k
		}
		if jt < 0 || c.InflightTokens < r.cands[jt].InflightTokens {
			jt = k
		}
	}
	if js < 0 { // no candidate may take it (jt < 0 too)
		return "", -1
	}
	mean := float64(total) / float64(n)
	if float64(r.cands[i].Sessions-r.cands[js].Sessions) >= max(2, mean/2) {
		return SessionMove, js
	}
	if r.moveTokens > 0 && own > 0 {
		excess := r.cands[i].InflightTokens - r.cands[jt].InflightTokens
		if excess >= minMoveExcessTokens && float64(excess) >= r.moveTokens*float64(own) {
			return SessionMoveTokens, jt
		}
	}
	return "", -1
}

// minMoveExcessTokens is the least in-flight excess that moves a session
// by context, whatever its own prompt: a few thousand tokens of context
// cost a decode step a fraction of a millisecond, less than the prefill a
// move re-pays. Every multi-turn workload kvbench measures has prompts of
// over a thousand tokens (a 1,024-token system prompt), so at
// session_move_tokens 4 this floor never decides there.
const minMoveExcessTokens = 4096

// roomFilter marks, under admission, the candidates without room for a new
// binding, when at least one has room (nil: none masked).
func (r *Router) roomFilter(n int) []bool {
	if !r.admit {
		return nil
	}
	room := false
	for i := 0; i < n; i++ {
		if r.hasRoom(r.cpool[i]) {
			room = true
			break
		}
	}
	if !room {
		r.trace.roomOpen()
		return nil
	}
	r.masked = grow(r.masked, n)
	for i := 0; i < n; i++ {
		r.masked[i] = !r.hasRoom(r.cpool[i])
		if r.masked[i] {
			r.trace.full(r.cands[i].ID, r.cands[i].Inflight, r.capOf(r.cpool[i]))
		}
	}
	return r.masked[:n]
}

// bind records req's binding to server (the session policy's last step).
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

// decision describes candidate i as the pick; Score is its score when the
// scorers ran for this request (else 0: r.scores holds an earlier
// decision's, possibly masked to -Inf, which JSON cannot carry).
func (r *Router) decision(i int, reason string, n int, scored bool) Decision {
	c := &r.cands[i]
	d := Decision{
		Server: c.ID, Reason: reason, Load: c.Load,
		HitBlocks: c.Hit.Tier, HittableBlocks: c.HittableBlocks, BlockSize: r.bsizes[i], Candidates: n,
	}
	if scored {
		d.Score = r.scores[i]
	}
	return d
}

// candidates snapshots load for every pool member and applies the health
// filter: unhealthy servers are dropped while a healthy one remains.
// It fills r.cands, r.bsizes and r.cpool and returns their length.
func (r *Router) candidates() int {
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
			r.trace.unhealthy(s.id, sn.Failures)
			continue
		}
		r.cands[n] = r.candidateOf(s, sn)
		r.bsizes[n] = blockSizeOf(s, sn, r.cfg.BlockSize)
		r.cpool[n] = s
		n++
	}
	if healthy == 0 {
		r.trace.healthOpen()
	}
	return n
}

// matchPrefix sets each candidate's prefix hit (kvc_aware mode; default
// mode scores on in-flight counts alone).
func (r *Router) matchPrefix(req *Request, n int) {
	if !r.kvc || len(req.Tokens) == 0 {
		return
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
			// A hybrid model's engine also needs its sliding-window
			// group's last blocks (a no-op for other servers).
			r.ix.TrimWindow(r.cpool[i].ix, keys[:hittable], &r.matches[j])
			r.cands[i].Hit = r.matches[j]
			r.cands[i].HittableBlocks = hittable
		}
		first = next
	}
	for i := 0; i < n; i++ {
		r.bsizes[i] = -r.bsizes[i]
	}
}

// setSreq sets r.sreq to what the strategy reads of a request and of the
// router's evidence (sessions, turns, the last step's correlations);
// r.mu held.
func (r *Router) setSreq(id string, tokens []int32) {
	r.sreq = strategy.Request{ID: id, Tokens: tokens, SessionsBound: r.bound,
		LaterTurns: r.counters.StickyHits + r.counters.StickyBroken, Turns: r.turns, ResponseTokens: r.respToks,
		PromptTokensMean: int(math.Round(r.promptMean))}
	if l := r.lens; l != nil {
		r.sreq.LengthCorr, r.sreq.LengthCorrKnown = l.corr, l.corrKnown
		r.sreq.TaskCorr, r.sreq.TaskCorrKnown = l.tasks.Corr()
	}
}

// notePrompt adds a prompt the router was asked to place to its running
// mean (every request once: at acquire, or when it is held); r.mu held.
// The mean's weight floor (promptMeanWindow requests) lets a rollout whose
// prompts change follow them.
func (r *Router) notePrompt(tokens int) {
	r.promptN++
	r.promptMean += (float64(tokens) - r.promptMean) / float64(min(r.promptN, promptMeanWindow))
}

// promptMeanWindow: the mean weighs about this many of the latest prompts.
const promptMeanWindow = 4096

// fillCandidates is candidates, matchPrefix and the group counts
// (admission's slot path); it returns the candidates and the group key.
func (r *Router) fillCandidates(req *Request) (int, uint64) {
	n := r.candidates()
	r.matchPrefix(req, n)
	g := r.groupKeyOf(n)
	r.fillSiblings(g, n)
	return n, g
}

// candidateOf is what a strategy sees of s before prefix matching.
func (r *Router) candidateOf(s *server, sn *load.Snapshot) strategy.Candidate {
	return strategy.Candidate{
		ID: s.id, Order: s.order, Inflight: sn.Inflight, InflightTokens: sn.InflightTokens,
		Load: sn.Load, Fresh: sn.Fresh, Healthy: sn.Healthy, KVCapacityTokens: kvCapacity(sn),
		Sessions: *s.sessions, PredictedTokens: r.workOf(s.id),
	}
}

// speculateOn records the prompt's blocks beyond the matched prefix as
// presumed resident on s, so siblings routed before any event arrives find
// them.
func (r *Router) speculateOn(s *server, req *Request, matched int) {
	if !r.speculate || s == nil || len(req.Tokens) == 0 {
		return
	}
	if keys, _ := r.promptKeys(s, req); matched < len(keys) {
		r.ix.Speculate(s.ix, keys[matched:])
	}
}

// promptKeys is req's full-block keys at s's block size (the decision's
// own when the prefix match computed them, else hashed now) and that size;
// r.mu held.
func (r *Router) promptKeys(s *server, req *Request) ([]uint64, int) {
	bs := r.blockSize(s)
	keys, ok := r.keys[bs]
	if !ok || len(keys) != blockhash.FullBlocks(len(req.Tokens), bs) {
		keys = r.memo.AppendKeys(r.keys[bs][:0], req.Tokens, bs, blockhash.Namespace(r.cfg.Model, req.Lora))
		r.keys[bs] = keys
	}
	return keys, bs
}
