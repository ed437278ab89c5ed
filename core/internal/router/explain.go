package router

import (
	"fmt"
	"math"

	"github.com/kvc-router/kvc-router/core/internal/index"
	"github.com/kvc-router/kvc-router/core/internal/strategy"
)

// Explain is one routing decision, stage by stage (pipeline.go): what the
// session policy found, which servers each filter removed and why, what
// each scorer term was per candidate, and what was picked by which rule.
// Status reports the last decision's as last_decision; kvctl explain
// prints it.
type Explain struct {
	// Seq numbers the decision (the acquires counter when it was made).
	Seq          uint64 `json:"seq"`
	RequestID    string `json:"request_id"`
	PromptTokens int    `json:"prompt_tokens"`
	Mode         string `json:"mode"`
	// Pool is the candidates stage: the pool in insertion order.
	Pool    []string       `json:"pool"`
	Session ExplainSession `json:"session"`
	// Filters lists the filters that ran, in order.
	Filters []ExplainFilter `json:"filters"`
	// Strategy names the scorer; Candidates are the servers left after
	// the health and pin filters, with their scores when scoring ran.
	Strategy   string             `json:"strategy"`
	Scored     bool               `json:"scored"`
	Candidates []ExplainCandidate `json:"candidates"`
	// Pick is the rule that chose Decision.Server.
	Pick     string   `json:"pick"`
	Decision Decision `json:"decision"`
	// Error is set when the decision failed (no servers).
	Error string `json:"error,omitempty"`
}

// ExplainSession is what the session policy did.
type ExplainSession struct {
	// Bound is the server the request id was bound to ("" = none).
	Bound string `json:"bound,omitempty"`
	// Rule is one of the Session* constants; Why says it in words.
	Rule string `json:"rule"`
	Why  string `json:"why"`
}

// ExplainFilter is one filter's effect.
type ExplainFilter struct {
	Name    string           `json:"name"`
	Removed []ExplainRemoved `json:"removed"`
	// Note explains a filter that kept everything although it would have
	// removed some (fail-open), or how a pin chose.
	Note string `json:"note,omitempty"`
}

// ExplainRemoved is one server a filter removed.
type ExplainRemoved struct {
	Server string `json:"server"`
	Why    string `json:"why"`
}

// ExplainCandidate is one candidate's inputs and score.
type ExplainCandidate struct {
	Server         string  `json:"server"`
	Inflight       int     `json:"inflight"`
	InflightTokens int64   `json:"inflight_tokens"`
	Load           float64 `json:"load"`
	Healthy        bool    `json:"healthy"`
	Sessions       int     `json:"sessions"`
	// Siblings: requests with this prompt placed here this step (the
	// group_spread term's input).
	Siblings       int                 `json:"siblings"`
	HitBlocks      [index.NumTiers]int `json:"hit_blocks"`
	HittableBlocks int                 `json:"hittable_blocks"`
	// Score is the strategy's score (nil when scoring did not run);
	// Terms are its parts when the strategy explains itself.
	Score *float64        `json:"score,omitempty"`
	Terms []strategy.Term `json:"terms,omitempty"`
	// Masked: removed at the pick by the room filter.
	Masked bool `json:"masked,omitempty"`
}

// Pick rules.
const (
	pickBound    = "the bound server: the session stays"
	pickPinned   = "pool[pin mod pool size] (full_determinism)"
	pickMoved    = "the least-bound healthy server below the load threshold: the session moves"
	pickScored   = "the highest score; ties to the server added first"
	pickAdmitted = "the server whose freed slot admitted the held request"
)

var sessionWhy = map[string]string{
	SessionNew:        "no binding: placed by the scorers, then bound to the pick",
	SessionStale:      "bound to a server that left the pool: binding dropped, placed as new",
	SessionProbe:      "probe: no binding read or written",
	SessionPinned:     "no binding: full_determinism pins it",
	SessionVerl:       "default mode honours every binding (verl)",
	SessionStay:       "bound server healthy and at most load_threshold: the session stays",
	SessionMove:       "multi-turn sessions and the bound server holds max(2, mean/2) more sessions than the least-bound one: moved at this turn",
	SessionMoveTokens: "multi-turn sessions and the bound server has session_move_tokens x this prompt more prompt tokens in flight than the least-loaded one: moved at this turn",
	SessionOverloaded: "bound server's load is over load_threshold: re-scored and rebound",
	SessionUnhealthy:  "bound server unhealthy: re-scored and rebound",
	SessionAdmitted:   "held by admission, given a freed slot",
}

// trace records the current decision's stages in reused buffers (r.mu
// held); Status turns the last one into an Explain. Recording copies a few
// words per candidate; the score terms are computed only when asked.
type trace struct {
	valid  bool
	seq    uint64
	id     string
	prompt int
	pool   []string
	bound  string
	rule   string

	pinned         bool
	pinArg         int
	pinTo          string
	unhealthyIDs   []string
	unhealthyFails []int
	healthRan      bool
	healthFailOpen bool
	roomRan        bool
	roomOpenNote   bool
	fullIDs        []string
	fullInflight   []int
	fullCap        []int

	cands  []strategy.Candidate
	scores []float64
	masked []bool
	scored bool
	sreq   strategy.Request

	pick string
	d    Decision
	err  string
}

func (t *trace) begin(req *Request, seq uint64) *trace {
	*t = trace{
		valid: true, seq: seq, id: req.ID, prompt: len(req.Tokens),
		pool: t.pool[:0], unhealthyIDs: t.unhealthyIDs[:0], unhealthyFails: t.unhealthyFails[:0],
		fullIDs: t.fullIDs[:0], fullInflight: t.fullInflight[:0], fullCap: t.fullCap[:0],
		cands: t.cands[:0], scores: t.scores[:0], masked: t.masked[:0],
	}
	return t
}

func (t *trace) session(bound *server, rule string) {
	t.bound = ""
	if bound != nil {
		t.bound = bound.id
	}
	t.rule = rule
}

func (t *trace) setPool(pool []*server) {
	for _, s := range pool {
		t.pool = append(t.pool, s.id)
	}
}

func (t *trace) fail(err error) { t.err = err.Error() }

func (t *trace) pin(pin int, to string) { t.pinned, t.pinArg, t.pinTo = true, pin, to }

func (t *trace) unhealthy(id string, failures int) {
	t.unhealthyIDs = append(t.unhealthyIDs, id)
	t.unhealthyFails = append(t.unhealthyFails, failures)
}

func (t *trace) healthOpen() { t.healthFailOpen = true }

func (t *trace) roomOpen() { t.roomRan, t.roomOpenNote = true, true }

func (t *trace) full(id string, inflight, cap int) {
	t.roomRan = true
	t.fullIDs = append(t.fullIDs, id)
	t.fullInflight = append(t.fullInflight, inflight)
	t.fullCap = append(t.fullCap, cap)
}

// candidates copies the candidates (and scores and room mask, when given).
func (t *trace) candidates(c []strategy.Candidate, scores []float64, masked []bool) {
	t.healthRan = true
	t.cands = append(t.cands, c...)
	t.scores = append(t.scores, scores...)
	t.masked = append(t.masked, masked...)
}

// scored records the scorers' request (without its tokens).
func (t *trace) scoredWith(req *strategy.Request, prompt int) {
	t.scored = true
	t.sreq = strategy.Request{ID: req.ID, SessionsBound: req.SessionsBound, LaterTurns: req.LaterTurns, Turns: req.Turns, ResponseTokens: req.ResponseTokens, PromptTokensMean: req.PromptTokensMean,
		LengthCorr: req.LengthCorr, LengthCorrKnown: req.LengthCorrKnown, TaskCorr: req.TaskCorr, TaskCorrKnown: req.TaskCorrKnown}
	t.prompt = prompt
}

func (t *trace) done(d Decision, pick string) Decision {
	t.d, t.pick = d, pick
	return d
}

// explainLocked builds the last decision's Explain; r.mu held. nil before
// the first decision.
func (r *Router) explainLocked() *Explain {
	t := &r.trace
	if !t.valid {
		return nil
	}
	e := &Explain{
		Seq: t.seq, RequestID: t.id, PromptTokens: t.prompt, Mode: r.cfg.Mode,
		Pool:    append([]string{}, t.pool...),
		Session: ExplainSession{Bound: t.bound, Rule: t.rule, Why: sessionWhy[t.rule]},
		Filters: []ExplainFilter{}, Strategy: r.strat.Name(), Scored: t.scored,
		Candidates: []ExplainCandidate{}, Pick: t.pick, Decision: t.d, Error: t.err,
	}
	if finite(e.Decision.Score) == nil {
		e.Decision.Score = 0 // JSON has no NaN or infinity
	}
	if t.pinned {
		f := ExplainFilter{Name: "pin", Removed: []ExplainRemoved{},
			Note: fmt.Sprintf("pin %d selects pool[%d mod %d] = %s", t.pinArg, t.pinArg, len(t.pool), t.pinTo)}
		for _, id := range t.pool {
			if id != t.pinTo {
				f.Removed = append(f.Removed, ExplainRemoved{Server: id, Why: "not the pinned server"})
			}
		}
		e.Filters = append(e.Filters, f)
	}
	if t.healthRan {
		f := ExplainFilter{Name: "health", Removed: []ExplainRemoved{}}
		for i, id := range t.unhealthyIDs {
			f.Removed = append(f.Removed, ExplainRemoved{Server: id,
				Why: fmt.Sprintf("unhealthy (%d consecutive failed scrapes)", t.unhealthyFails[i])})
		}
		if t.healthFailOpen {
			f.Note = "no healthy server: every server kept (fail-open)"
		}
		e.Filters = append(e.Filters, f)
	}
	if t.roomRan {
		f := ExplainFilter{Name: "room", Removed: []ExplainRemoved{}}
		for i, id := range t.fullIDs {
			f.Removed = append(f.Removed, ExplainRemoved{Server: id,
				Why: fmt.Sprintf("full: %d in flight, cap %d (admission)", t.fullInflight[i], t.fullCap[i])})
		}
		if t.roomOpenNote {
			f.Note = "no server has room: every server kept (fail-open)"
		}
		e.Filters = append(e.Filters, f)
	}
	var terms [][]strategy.Term
	if t.scored {
		terms = strategy.Explain(r.strat, &t.sreq, t.prompt, t.cands)
	}
	for i := range t.cands {
		c := &t.cands[i]
		ec := ExplainCandidate{Server: c.ID, Inflight: c.Inflight, InflightTokens: c.InflightTokens, Load: c.Load,
			Healthy: c.Healthy, Sessions: c.Sessions, Siblings: c.Siblings, HitBlocks: c.Hit.Tier, HittableBlocks: c.HittableBlocks}
		if i < len(t.scores) {
			ec.Score = finite(t.scores[i])
		}
		if terms != nil {
			ec.Terms = terms[i]
			for k := range ec.Terms {
				// JSON has no NaN or infinity (a custom strategy's).
				if v := ec.Terms[k].Value; finite(v) == nil {
					ec.Terms[k].Value = 0
					ec.Terms[k].Name += fmt.Sprintf(" (%v)", v)
				}
			}
		}
		if i < len(t.masked) {
			ec.Masked = t.masked[i]
		}
		e.Candidates = append(e.Candidates, ec)
	}
	return e
}

// finite is &v, or nil for NaN and infinities.
func finite(v float64) *float64 {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

// LastDecision explains the last decision (nil before the first).
func (r *Router) LastDecision() *Explain {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.explainLocked()
}
