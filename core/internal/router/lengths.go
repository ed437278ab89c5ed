package router

import (
	"container/heap"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/lengths"
)

// LengthsSpec configures response-length learning (issue 26; package
// lengths): the router remembers each in-flight request's prompt, and a
// release that names the request and reports its output token count
// (ReleaseDone; kvr_release_done in the C ABI, which the Python balancer
// calls when release_server gets request_id and output_tokens, as the
// verl hook sends them) teaches the prompt's length. Without a count,
// the output a server's KV events showed as its blocks filled
// (progress.go) is learnt instead, and without those the time from
// acquire to release (a coarse proxy, in milliseconds, used only while no
// count has arrived). The history is kept
// per prompt hash and survives ResetCache (a weight sync ends a step).
//
// With admission on, LongestFirst gives a freed slot to the held request
// with the longest predicted response among all held requests free to go
// anywhere (longest processing time first: the step ends with its longest
// groups, so they should start first, and in an oversubscribed step the
// longest are as likely to be at the back of the queue as at its front).
// A held request passed over MaxSkips times goes next whatever its
// prediction, so no request starves. While no held request has an
// estimate, the admission order is unchanged.
type LengthsSpec struct {
	// Enabled turns length learning on (kvc_aware mode). It learns from
	// releases that name their request (release_server with request_id,
	// and output_tokens where known: the verl hook sends both); without a
	// count, from the output blocks a KV-event-fed server published. When to
	// change: on when prompts recur across steps (a dataset iterated in
	// epochs) or a group's samples finish at different times.
	Enabled bool `json:"enabled"`
	// Weight is the newest step's weight in a prompt's history (default
	// 0.6). When to change: higher when lengths drift fast between epochs.
	Weight float64 `json:"weight,omitempty"`
	// MaxPrompts bounds the prompts remembered (default 1<<20, about
	// 100 MiB at most). When to change: at least the dataset's prompt count.
	MaxPrompts int `json:"max_prompts,omitempty"`
	// LongestFirst orders admission by predicted length (default true).
	// When to change: off to keep admission's sibling-first order.
	LongestFirst *bool `json:"longest_first,omitempty"`
	// MaxSkips bounds how often a held request is passed over: once this
	// many longest-first picks went ahead of the oldest held request, it
	// goes next (default 4096). When to change: lower when short requests
	// must not wait.
	MaxSkips int `json:"max_skips,omitempty"`
	// MinCorr opens longest-first only where the within-prompt
	// correlation of response lengths is measured at or above it (default
	// 0.25; 0 = always open): the last finished step's (length_corr in
	// status), and within a step, once its finished responses span 64
	// prompts with 256 beyond one per prompt, theirs. Until either is
	// measured it stays closed. Where a prompt's samples are no more alike
	// than any two, neither its history nor its finished siblings predict a
	// sample, and ranking by them only breaks up the siblings-first order
	// that shares a group's prefill. A caller's hint still ranks. When to
	// change: 0 when hints or histories are known to predict lengths that
	// the step's own samples do not show, or steps too small to measure
	// (fewer than 8 prompts with 16 responses beyond one per prompt).
	MinCorr *float64 `json:"min_corr,omitempty"`
}

// Defaults of LengthsSpec.
const (
	DefaultLengthsMaxSkips = 4096
	// DefaultLengthsMinCorr is group_spread_min_corr's default: both
	// gates ask the same question of the same measurement.
	DefaultLengthsMinCorr = 0.25
	// maxLengthFlights bounds the in-flight requests remembered for
	// ReleaseDone: callers that release without request ids would
	// otherwise grow the table forever.
	maxLengthFlights = 1 << 20
)

func (l *LengthsSpec) normalise() error {
	if l.Weight < 0 || l.Weight > 1 {
		return configErr("lengths.weight", "must be in (0, 1] (0 = default), got %v", l.Weight)
	}
	if l.MaxPrompts < 0 {
		return configErr("lengths.max_prompts", "must not be negative, got %d", l.MaxPrompts)
	}
	if l.MaxSkips == 0 {
		l.MaxSkips = DefaultLengthsMaxSkips
	}
	if l.MaxSkips < 0 {
		return configErr("lengths.max_skips", "must be positive, got %d", l.MaxSkips)
	}
	if l.MinCorr == nil {
		v := DefaultLengthsMinCorr
		l.MinCorr = &v
	}
	if !(*l.MinCorr >= 0 && *l.MinCorr <= 1) {
		return configErr("lengths.min_corr", "must be in [0, 1] (0 = always open), got %v", *l.MinCorr)
	}
	return nil
}

// lenState is the router's length learning; nil when disabled.
type lenState struct {
	tok, dur *lengths.Tracker
	longest  bool
	maxSkips int
	minCorr  float64
	// gated: longest-first is closed (no correlation measured yet, or
	// the last one, over the last step or this one's finishers, below
	// minCorr); only hints rank.
	gated   bool
	flights map[string]lenFlight
	held    map[uint64]*heldLen // by admission ticket (free queue only)
	prog    *progress           // output blocks followed through KV events
	counts  LengthCounters
	// Longest-first admission over every free held request: lpt is a
	// max-heap of those with a prediction that rests on something learnt
	// (stale entries are dropped when they surface), unknown the others in
	// arrival order (all predict the same mean, so the oldest stands for
	// them), waiting each prompt's held requests (re-ranked when a
	// release teaches their prompt). Rebuilt at a step boundary, when
	// predictions switch from durations to counts, and when stale entries
	// outnumber live ones; a held prompt the tracker evicts (more prompts
	// than lengths.max_prompts) keeps its last rank until then.
	lpt      lptHeap
	unknown  []*held
	waiting  map[lengths.Key][]*held
	picks    uint64 // longest-first picks so far (starvation clock)
	lptStale bool
	// work is each server's predicted output in flight (the strategy's
	// work_weight reads it as Candidate.PredictedTokens): every tracked
	// request adds its prediction when placed and takes exactly that back
	// when a release names it. Nil unless the strategy reads it.
	work map[string]workSum
	gen  uint64 // the last stamp given (workSum.gen)
	// corr is tok's measured correlation as of the last step boundary,
	// kept here so a decision reads it without the tracker's lock.
	corr      float64
	corrKnown bool
	// measured is the correlation regate last read (this step's finishers
	// once they are evidence enough, else the last step's; measuredOK
	// false: neither measured): longest-first's gate and admission's group
	// spread read it.
	measured   float64
	measuredOK bool
	// tasks sums each trajectory's output over its turns for the
	// within-task correlation (no lock of its own: it lives under r.mu,
	// so a decision reads its figure directly).
	tasks *lengths.Tasks
}

// workSum is one pool server's predicted output in flight. gen stamps
// it: a flight charged under an older stamp (before the server was
// re-added, went idle with id-less releases outstanding, or left and came
// back) must not take its charge out of the new sum. Stamps come from one
// counter, so a server removed and re-added never reuses one.
type workSum struct {
	tokens float64
	gen    uint64
}

// lptEntry is a held request's place in the longest-first heap; it is
// live while the request is in the free queue and its heldLen still
// carries pred.
type lptEntry struct {
	h    *held
	pred float64
}

type lenFlight struct {
	key lengths.Key
	at  time.Time
	// server and work: where the request runs and the predicted output
	// charged there (work map); work 0 charged nothing.
	server string
	work   float64
	gen    uint64 // the server's workSum.gen when charged
}

type heldLen struct {
	key  lengths.Key
	hint float64
	// pred is the prediction its live heap entry carries; known that it
	// rests on a hint, history or finished siblings (else it waits in
	// unknown and ranks at the mean).
	pred  float64
	known bool
	since uint64 // picks when it was held (MaxSkips counts from here)
}

// LengthCounters are the length learner's statistics.
type LengthCounters struct {
	Observed uint64 `json:"observed_tokens"`
	// ObservedEvents counts releases without a count that taught the
	// output tokens KV events showed (counted in neither Observed nor
	// ObservedTimed).
	ObservedEvents uint64 `json:"observed_from_events"`
	ObservedTimed  uint64 `json:"observed_durations"`
	Unmatched      uint64 `json:"unmatched_releases"`
	LongestPicks   uint64 `json:"longest_first_picks"`
	StarvedPicks   uint64 `json:"starved_picks"`
	// LongestGated: no length correlation is measured yet (over the last
	// step, or this step's finished responses once there are enough), or
	// the last one is below lengths.min_corr, so longest-first ranks only
	// hinted requests.
	LongestGated bool `json:"longest_first_gated"`
	Prompts      int  `json:"prompts"`
	// CorrOnly: lengths.enabled is false and the learner runs only to
	// measure LengthCorr and TaskCorr for kvc_aware's group_spread_min_corr
	// and task_spread_min_corr; it orders and charges nothing.
	CorrOnly bool `json:"corr_only"`
	// LengthCorr is the within-prompt correlation of log response
	// lengths the learner measured over its last step with enough evidence
	// (LengthCorrKnown false: none yet): how alike a prompt's samples are,
	// the property that decides whether a group kept whole straggles
	// (docs/rl-workloads.md).
	LengthCorr      float64 `json:"length_corr"`
	LengthCorrKnown bool    `json:"length_corr_known"`
	// TaskCorr is the within-task correlation of log trajectory output
	// (a trajectory's output tokens summed over its turns, grouped by its
	// first turn's prompt) over the last step with enough evidence: how
	// alike an agent task's trajectories are, which decides whether a
	// task kept on one server straggles (task_spread_min_corr).
	TaskCorr      float64 `json:"task_corr"`
	TaskCorrKnown bool    `json:"task_corr_known"`
	// TrajectoryTurnsDropped counts turns of trajectories not followed
	// because a step started more than the learner follows (1<<17): the
	// step's first trajectories then stand for the rest.
	TrajectoryTurnsDropped uint64 `json:"trajectory_turns_dropped"`
	// PredictedTokens is each server's predicted output in flight, summed
	// only when the strategy reads it (kvc_aware's work_weight).
	PredictedTokens map[string]float64 `json:"predicted_tokens,omitempty"`
}

func newLenState(spec LengthsSpec) *lenState {
	if !spec.Enabled {
		return nil
	}
	return newLearner(spec)
}

// corrOnlyPrompts bounds the prompts a correlation-only learner remembers:
// one step's groups are all it reads (about 10 MiB at most).
const corrOnlyPrompts = 1 << 17

// newCorrLearner is the learner a strategy that reads the measured length
// correlation gets when lengths are off: it learns, for the correlation
// alone, and orders nothing.
func newCorrLearner() *lenState {
	off := false
	l := newLearner(LengthsSpec{Enabled: true, LongestFirst: &off, MaxPrompts: corrOnlyPrompts, MaxSkips: DefaultLengthsMaxSkips})
	l.counts.CorrOnly = true
	// It learns from the output tokens releases report (the verl hook
	// sends them) and follows no KV events: following a request's output
	// blocks costs two allocations per decision on an event-fed server,
	// which the defaults' decision path does not pay.
	l.prog = nil
	return l
}

func newLearner(spec LengthsSpec) *lenState {
	cfg := lengths.Config{Weight: spec.Weight, MaxPrompts: spec.MaxPrompts}
	minCorr := DefaultLengthsMinCorr
	if spec.MinCorr != nil {
		minCorr = *spec.MinCorr
	}
	l := &lenState{tok: lengths.New(cfg), dur: lengths.New(cfg), longest: boolOr(spec.LongestFirst, true),
		maxSkips: spec.MaxSkips, minCorr: minCorr, flights: map[string]lenFlight{}, held: map[uint64]*heldLen{},
		waiting: map[lengths.Key][]*held{}, prog: newProgress(), tasks: lengths.NewTasks(maxTrajectories)}
	l.regate(false) // closed until a correlation is measured
	return l
}

// maxTrajectories bounds the trajectories one step follows for the
// within-task correlation (a few MiB at most).
const maxTrajectories = 1 << 17

// lenTrack remembers a decided request's prompt, and on a server fed by
// KV events the tip its output will hang off; r.mu held.
func (r *Router) lenTrack(req *Request, server string) {
	l := r.lens
	if l == nil || req.ID == "" {
		return // no id: no release could name it
	}
	if len(l.flights) >= maxLengthFlights {
		clear(l.flights)
		for s := range l.work {
			l.resetWork(s) // the charges' flights are gone
		}
	}
	f := lenFlight{key: lengths.KeyOf(req.Tokens), at: r.now(), server: server}
	if l.work != nil {
		// A session's earlier turn still in flight under the same id
		// loses its charge here: its release can no longer be told apart.
		if old, ok := l.flights[req.ID]; ok {
			l.uncharge(old)
		}
		// Only a server in the pool is charged (its sum exists).
		if ws, ok := l.work[server]; ok {
			f.work = req.Hint
			if f.work <= 0 {
				f.work = l.tok.Predict(f.key).Tokens
			}
			ws.tokens += f.work
			f.gen = ws.gen
			l.work[server] = ws
		}
	}
	l.flights[req.ID] = f
	l.tasks.Start(req.ID, f.key)
	if l.prog == nil {
		return // a correlation-only learner follows no KV events
	}
	s := r.byID[server]
	if s == nil || !s.events {
		l.prog.done(req.ID) // a session's earlier turn elsewhere
		return
	}
	keys, bs := r.promptKeys(s, req)
	if len(keys) == 0 {
		l.prog.done(req.ID) // under a block: its first output block has no parent to follow
		return
	}
	l.prog.track(req.ID, s.ix, keys[len(keys)-1], bs, len(req.Tokens)-len(keys)*bs)
}

// ReleaseDone is ReleaseAdmit for a caller that knows which request
// finished: it teaches the length learner the request's output token
// count (0 = unknown: the acquire-to-release time is learnt instead). An
// empty requestID is a plain ReleaseAdmit.
func (r *Router) ReleaseDone(server, requestID string, outputTokens int, out []Admitted) ([]Admitted, bool) {
	r.mu.Lock()
	if l := r.lens; l != nil && requestID != "" {
		seen := 0
		if l.prog != nil {
			seen = l.prog.done(requestID)
		}
		if f, ok := l.flights[requestID]; ok {
			delete(l.flights, requestID)
			l.uncharge(f)
			if outputTokens > 0 {
				l.tasks.Add(requestID, outputTokens)
				l.observeTokens(f.key, outputTokens)
				l.counts.Observed++
			} else if seen > 0 {
				l.tasks.Add(requestID, seen)
				l.observeTokens(f.key, seen)
				l.counts.ObservedEvents++
			} else if l.counts.CorrOnly {
				// Durations feed admission's order alone: a correlation-only
				// learner has none to feed.
			} else if ms := int(r.now().Sub(f.at) / time.Millisecond); ms > 0 {
				l.dur.Observe(f.key, ms)
				if l.dur.StepResponses()%liveEvery == 0 {
					l.regate(true)
				}
				l.repredict(f.key)
				l.counts.ObservedTimed++
			}
		} else {
			l.counts.Unmatched++
		}
	}
	r.mu.Unlock()
	return r.ReleaseAdmit(server, out)
}

// uncharge takes a finished request's predicted output off its server.
func (l *lenState) uncharge(f lenFlight) {
	if l.work == nil || f.work <= 0 {
		return
	}
	ws, ok := l.work[f.server]
	if !ok || ws.gen != f.gen {
		return // the server left, was re-added or went idle since
	}
	// Rounding leaves a sub-token residue; a negative sum would
	// read as spare capacity.
	ws.tokens = max(0, ws.tokens-f.work)
	l.work[f.server] = ws
}

// workIdle forgets a server's predicted output once nothing is in flight
// there: releases that named no request (verl without the hook) never
// took their charges back; r.mu held.
func (r *Router) workIdle(server string) {
	if l := r.lens; l != nil && l.work != nil {
		if _, ok := l.work[server]; ok && r.ld.Inflight(server) == 0 {
			// Flights still charged here were released without their
			// id: the new stamp keeps them from reaching later sums.
			l.resetWork(server)
		}
	}
}

// resetWork starts a pool server's predicted output in flight at zero
// (added, or re-added: its in-flight count restarts too); r.mu held.
func (r *Router) resetWork(server string) {
	if l := r.lens; l != nil && l.work != nil {
		l.resetWork(server)
	}
}

// resetWork starts server's predicted output in flight at zero under a
// fresh stamp.
func (l *lenState) resetWork(server string) {
	l.gen++
	l.work[server] = workSum{gen: l.gen}
}

// workOf is server's predicted output in flight (0 when not summed).
func (r *Router) workOf(server string) float64 {
	if l := r.lens; l != nil && l.work != nil {
		return l.work[server].tokens
	}
	return 0
}

// PredictTokens is the learnt output length of a prompt (0 = unknown).
func (r *Router) PredictTokens(tokens []int32) lengths.Estimate {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lens == nil {
		return lengths.Estimate{}
	}
	return r.lens.tok.Predict(lengths.KeyOf(tokens))
}

// LengthCounters returns the learner's statistics (zero when disabled).
func (r *Router) LengthCounters() LengthCounters {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lens == nil {
		return LengthCounters{}
	}
	return r.lens.snapshot()
}

// snapshot is the learner's counters with the prompts it remembers.
func (l *lenState) snapshot() LengthCounters {
	c := l.counts
	c.LongestGated = l.gated
	c.Prompts, _ = l.tok.Len()
	c.LengthCorr, c.LengthCorrKnown = l.tok.Corr()
	c.TaskCorr, c.TaskCorrKnown = l.tasks.Corr()
	c.TrajectoryTurnsDropped = l.tasks.DroppedTurns()
	if l.work != nil {
		c.PredictedTokens = make(map[string]float64, len(l.work))
		for s, w := range l.work {
			c.PredictedTokens[s] = w.tokens
		}
	}
	return c
}

// lenNextStep ends a rollout step for the learner (a weight sync).
func (r *Router) lenNextStep() {
	if l := r.lens; l != nil {
		l.tok.NextStep()
		l.dur.NextStep()
		l.lptStale = true // every held prompt's history moved
		l.corr, l.corrKnown = l.tok.Corr()
		l.regate(false)
		l.tasks.NextStep()
	}
}

// predicted is a held request's predicted length and whether it rests on
// anything learnt (a caller's hint, history or finished siblings;
// with longest-first gated, a hint alone).
func (l *lenState) predicted(h *heldLen) (float64, bool) {
	if h.hint > 0 {
		return h.hint, true
	}
	if l.gated {
		return l.mean(), false
	}
	if e := l.tok.Predict(h.key); e.Tokens > 0 {
		return e.Tokens, e.History || e.Siblings > 0
	}
	e := l.dur.Predict(h.key)
	return e.Tokens, e.History || e.Siblings > 0
}

// mean is what a prompt nothing is known of predicts (predicted's
// fallback): the mean count, else the mean duration.
func (l *lenState) mean() float64 {
	if m := l.tok.Mean(); m > 0 {
		return m
	}
	return l.dur.Mean()
}

// The within-step gate (LengthsSpec.MinCorr): every liveEvery responses,
// once this step's finished responses span livePrompts prompts and
// liveWithin responses beyond one per prompt, their own correlation
// decides instead of the last step's. A held step's early finishers are its
// short responses, so the bar is higher than a finished step's (8, 16).
// Not tuned: the first values tried (docs/rl-workloads.md).
const (
	liveEvery   = 64
	livePrompts = 64
	liveWithin  = 256
)

// regate re-reads the measured correlation from the tracker predictions
// come from (counts once any arrived, else durations): this step's
// finishers when live and they are evidence enough, else the last
// finished step; and MinCorr's gate from it, closed while neither is
// measured. A change of the gate re-ranks every held request.
func (l *lenState) regate(live bool) {
	tr := l.tok
	if tr.Mean() == 0 {
		tr = l.dur
	}
	c, ok := 0.0, false
	if live {
		c, ok = tr.StepCorr(livePrompts, liveWithin)
	}
	if !ok {
		c, ok = tr.Corr()
	}
	l.measured, l.measuredOK = c, ok
	if !l.longest {
		return
	}
	if g := l.minCorr > 0 && (!ok || c < l.minCorr); g != l.gated {
		l.gated = g
		l.lptStale = true
	}
}

// observeTokens teaches prompt k an output count and re-ranks its held
// requests; the first count switches every prediction from durations to
// counts, so the order is rebuilt.
func (l *lenState) observeTokens(k lengths.Key, n int) {
	first := l.tok.Mean() == 0
	l.tok.Observe(k, n)
	if first || l.tok.StepResponses()%liveEvery == 0 {
		l.regate(true) // the first count also switches the tracker read
	}
	if first {
		l.lptStale = true
		return
	}
	l.repredict(k)
}

// lenHold enters a request held in the free queue into longest-first
// order; r.mu held.
func (r *Router) lenHold(h *held) {
	l := r.lens
	if l == nil || !l.longest {
		return
	}
	if _, ok := l.held[h.ticket]; ok {
		return
	}
	hl := &heldLen{key: lengths.KeyOf(h.req.Tokens), hint: h.req.Hint, since: l.picks}
	l.held[h.ticket] = hl
	l.waiting[hl.key] = append(l.waiting[hl.key], h)
	l.rank(h, hl)
}

// lenForget takes an admitted or cancelled request out of longest-first
// order (its heap entry goes stale: its queue is gone); r.mu held.
func (r *Router) lenForget(h *held) {
	l := r.lens
	if l == nil {
		return
	}
	hl := l.held[h.ticket]
	if hl == nil {
		return
	}
	delete(l.held, h.ticket)
	w := l.waiting[hl.key]
	for i, o := range w {
		if o == h {
			w[i] = w[len(w)-1]
			w[len(w)-1] = nil
			w = w[:len(w)-1]
			break
		}
	}
	if len(w) == 0 {
		delete(l.waiting, hl.key)
	} else {
		l.waiting[hl.key] = w
	}
}

// rank places h by its current prediction: a heap entry when it rests on
// something learnt, else the unknown queue.
func (l *lenState) rank(h *held, hl *heldLen) {
	hl.pred, hl.known = l.predicted(hl)
	if hl.known {
		heap.Push(&l.lpt, lptEntry{h: h, pred: hl.pred})
	} else {
		l.unknown = append(l.unknown, h)
	}
}

// repredict re-ranks prompt k's held requests after k was taught.
func (l *lenState) repredict(k lengths.Key) {
	if !l.longest || l.lptStale {
		return
	}
	for _, h := range l.waiting[k] {
		hl := l.held[h.ticket]
		if hl == nil || hl.hint > 0 {
			continue
		}
		if p, known := l.predicted(hl); known && (!hl.known || p != hl.pred) {
			hl.pred, hl.known = p, true
			heap.Push(&l.lpt, lptEntry{h: h, pred: p})
		}
	}
}

// rebuild ranks q's held requests afresh.
func (l *lenState) rebuild(q *heldQueue) {
	clear(l.lpt)
	l.lpt = l.lpt[:0]
	clear(l.unknown)
	l.unknown = l.unknown[:0]
	for h := q.head; h != nil; h = h.next {
		if hl := l.held[h.ticket]; hl != nil {
			hl.pred, hl.known = l.predicted(hl)
			if hl.known {
				l.lpt = append(l.lpt, lptEntry{h: h, pred: hl.pred})
			} else {
				l.unknown = append(l.unknown, h)
			}
		}
	}
	heap.Init(&l.lpt)
	l.lptStale = false
}

// live: e still stands for its request's place in q.
func (l *lenState) live(e lptEntry, q *heldQueue) bool {
	if e.h.q != q {
		return false
	}
	hl := l.held[e.h.ticket]
	return hl != nil && hl.known && hl.pred == e.pred
}

// pickLongest is admission's longest-first order (LengthsSpec): among all
// held requests of q (requests free to run on any server), the oldest once
// MaxSkips longest-first picks went ahead of it, else the longest
// predicted (the oldest of equals; requests nothing is known of rank at
// the mean); ok = false when the learner is off or knows nothing about
// any of them (the default order then applies); r.mu held. A pick costs
// O(log held) plus the stale entries it drops.
func (r *Router) pickLongest(q *heldQueue) (*held, bool) {
	l := r.lens
	if l == nil || !l.longest || q.head == nil {
		return nil, false
	}
	if l.lptStale || len(l.lpt)+len(l.unknown) > 2*len(l.held)+1024 {
		l.rebuild(q)
	}
	for len(l.lpt) > 0 && !l.live(l.lpt[0], q) {
		heap.Pop(&l.lpt)
	}
	if len(l.lpt) == 0 {
		return nil, false // nothing known of any held request
	}
	if hl := l.held[q.head.ticket]; hl != nil && l.picks-hl.since >= uint64(l.maxSkips) {
		l.picks++
		l.counts.StarvedPicks++
		return q.head, true
	}
	for len(l.unknown) > 0 {
		u := l.unknown[0]
		if hl := l.held[u.ticket]; u.q == q && hl != nil && !hl.known {
			break
		}
		l.unknown[0] = nil
		l.unknown = l.unknown[1:]
	}
	top := l.lpt[0]
	pick := top.h
	if len(l.unknown) > 0 {
		u := l.unknown[0]
		if m := l.mean(); m > top.pred || (m == top.pred && u.seq < top.h.seq) {
			pick = u
		}
	}
	if pick == top.h {
		heap.Pop(&l.lpt)
	}
	l.picks++
	l.counts.LongestPicks++
	return pick, true
}

// lptHeap is container/heap's view of the longest-first entries: longer
// first, then older.
type lptHeap []lptEntry

func (x lptHeap) Len() int { return len(x) }
func (x lptHeap) Less(i, j int) bool {
	if x[i].pred != x[j].pred {
		return x[i].pred > x[j].pred
	}
	return x[i].h.seq < x[j].h.seq
}
func (x lptHeap) Swap(i, j int) { x[i], x[j] = x[j], x[i] }
func (x *lptHeap) Push(v any)   { *x = append(*x, v.(lptEntry)) }
func (x *lptHeap) Pop() any {
	old := *x
	n := len(old) - 1
	v := old[n]
	old[n] = lptEntry{} // drop the *held for the collector
	*x = old[:n]
	return v
}
