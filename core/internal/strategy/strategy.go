// Package strategy scores candidate servers for one request. A Strategy sees
// every candidate at once (so it can normalise), writes one score per
// candidate, and the router picks the highest score, breaking ties towards the
// server added first. Strategies are built by name from a registry and can be
// combined with weights.
package strategy

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	json "github.com/goccy/go-json"

	"github.com/kvc-router/kvc-router/core/internal/index"
	"github.com/kvc-router/kvc-router/core/internal/strictjson"
)

// Candidate is what a strategy knows about one server for one request.
type Candidate struct {
	ID string
	// Order is the server's position in insertion order (0 = added first).
	Order          int
	Inflight       int
	InflightTokens int64
	// Load is the load store's figure in [0, 1].
	Load    float64
	Fresh   bool
	Healthy bool
	// Hit is the prefix match on this server, capped at HittableBlocks.
	Hit index.Match
	// HittableBlocks is how many leading prompt blocks this server could
	// serve from cache at its block size (vLLM recomputes the last token).
	HittableBlocks int
	// KVCapacityTokens is how many tokens the server's GPU KV cache holds,
	// from its metrics (num_gpu_blocks x block_size); 0 when unknown.
	KVCapacityTokens int
	// Sessions is how many sticky request_id bindings point at this server
	// (the router's sticky LRU). A bound session's later turns will land
	// there, so it is work the server has committed to beyond its in-flight
	// requests.
	Sessions int
	// Siblings is how many requests with this request's prompt (its
	// group: GRPO samples, an agent task's first turns) the router placed
	// on this server since the last weight sync.
	Siblings int
	// PredictedTokens is the output the router predicts for the requests
	// in flight on this server (the sum of each one's learnt response
	// length, charged when it was placed and taken back exactly when it is
	// released); 0 when length learning is off or nothing is known yet.
	PredictedTokens float64
}

// Request is the request being routed.
type Request struct {
	ID     string
	Tokens []int32
	// SessionsBound and LaterTurns are the router's sticky history: how
	// many sessions it has bound, and how many requests arrived for a
	// session already bound (a session's second and later turns). Their
	// ratio says whether sessions here are multi-turn (agents) or one
	// request each (GRPO samples).
	SessionsBound, LaterTurns uint64
	// Turns is what the rollout's sessions are said to be before any
	// returns (the router's "turns" setting; TurnsAuto: not said).
	Turns Turns
	// ResponseTokens is the longest response the rollout asks for (the
	// router's "response_tokens"; verl's rollout.response_length), 0 when
	// not said.
	ResponseTokens int
	// PromptTokensMean is the mean prompt length, in tokens, of the
	// requests the router has placed so far (0 when none): the rollout's
	// typical prompt, which group_spread_min_ratio compares
	// ResponseTokens with, so every group of one rollout gets the same
	// answer.
	PromptTokensMean int
	// LengthCorr is the within-prompt correlation of log response lengths
	// the router's learner measured over its last finished step;
	// LengthCorrKnown false before any step gave enough evidence (or when
	// nothing is learnt).
	LengthCorr      float64
	LengthCorrKnown bool
	// TaskCorr is the within-task correlation of log trajectory output
	// (each trajectory's turns summed, grouped by its first turn's prompt)
	// over the router's last finished step; TaskCorrKnown false before
	// any step gave enough evidence.
	TaskCorr      float64
	TaskCorrKnown bool
}

// Turns is the router's "turns" setting: what the rollout's sessions are
// before the router has seen any return.
type Turns uint8

const (
	TurnsAuto   Turns = iota // learn it from sessions that return
	TurnsSingle              // one request per session (GRPO samples)
	TurnsMulti               // sessions send turn after turn (agent loops)
)

// Strategy scores candidates: out[i] scores c[i]; higher is better.
type Strategy interface {
	Name() string
	Score(req *Request, c []Candidate, out []float64)
}

// LoadMeasure is implemented by strategies that measure a server's load
// their own way (kvc_aware's token load). The router compares this figure
// with its load threshold for the sticky-session breakout, so a binding is
// broken exactly when the strategy itself would see the server as loaded.
type LoadMeasure interface {
	EffectiveLoad(c *Candidate) float64
}

// EffectiveLoad is s's measure of c's load when s implements LoadMeasure,
// else the load store's figure (c.Load).
func EffectiveLoad(s Strategy, c *Candidate) float64 {
	if m, ok := s.(LoadMeasure); ok {
		return m.EffectiveLoad(c)
	}
	return c.Load
}

// SiblingReader is implemented by strategies that may read
// Candidate.Siblings. The router keeps per-prompt placement counts (a
// lookup and an update on every decision) only when its strategy reads
// them.
type SiblingReader interface {
	ReadsSiblings() bool
}

// ReadsSiblings reports whether s reads Candidate.Siblings.
func ReadsSiblings(s Strategy) bool {
	m, ok := s.(SiblingReader)
	return ok && m.ReadsSiblings()
}

// WorkReader is implemented by strategies that may read
// Candidate.PredictedTokens. The router sums each server's predicted
// output only when its strategy reads it.
type WorkReader interface {
	ReadsWork() bool
}

// ReadsWork reports whether s reads Candidate.PredictedTokens.
func ReadsWork(s Strategy) bool {
	m, ok := s.(WorkReader)
	return ok && m.ReadsWork()
}

// CorrReader is implemented by strategies that may read
// Request.LengthCorr or Request.TaskCorr. The router learns response lengths (for the
// correlation alone when its lengths are off) only when its strategy
// reads it.
type CorrReader interface {
	ReadsLengthCorr() bool
}

// ReadsLengthCorr reports whether s reads Request.LengthCorr or
// Request.TaskCorr.
func ReadsLengthCorr(s Strategy) bool {
	m, ok := s.(CorrReader)
	return ok && m.ReadsLengthCorr()
}

// GroupSpreader is implemented by strategies that spread a prompt's
// one-request samples (a GRPO group) over servers. Admission, which
// places a held request on whichever server freed a slot instead of
// scoring, asks it whether a held sibling may join its group on a server
// that already holds more of the group than some other server does, and
// over how many servers at most (0: no cap).
type GroupSpreader interface {
	SpreadsGroup(req *Request, promptTokens int) (spread bool, maxServers int)
}

// SpreadsGroup reports whether s spreads req's group and over how many
// servers at most (false when s does not implement GroupSpreader).
func SpreadsGroup(s Strategy, req *Request, promptTokens int) (bool, int) {
	if m, ok := s.(GroupSpreader); ok {
		return m.SpreadsGroup(req, promptTokens)
	}
	return false, 0
}

// Factory builds a strategy from its JSON parameters.
type Factory func(params json.RawMessage) (Strategy, error)

var registry = map[string]Factory{}

// Register adds a factory under a name. It panics on duplicates, at init.
func Register(name string, f Factory) {
	if _, dup := registry[name]; dup {
		panic("strategy: duplicate registration of " + name)
	}
	registry[name] = f
}

// Names lists the registered strategy names, sorted.
func Names() []string {
	out := make([]string, 0, len(registry))
	for n := range registry {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// ErrUnknown is returned for an unregistered strategy name.
var ErrUnknown = errors.New("strategy: unknown strategy")

// Build constructs a registered strategy.
func Build(name string, params json.RawMessage) (Strategy, error) {
	f, ok := registry[name]
	if !ok {
		return nil, fmt.Errorf("%w %q (known: %s)", ErrUnknown, name, strings.Join(Names(), ", "))
	}
	if len(params) == 0 {
		params = json.RawMessage("{}")
	}
	return f(params)
}

// DecodeStrict unmarshals params rejecting unknown fields; errors are
// *strictjson.KeyError naming the parameter.
func DecodeStrict(params json.RawMessage, v any) error {
	return strictjson.Decode(params, v)
}

// Weighted is a weighted sum of strategies.
type Weighted struct {
	Parts   []Strategy
	Weights []float64
	scratch []float64
}

// Name joins the parts' names.
func (w *Weighted) Name() string {
	names := make([]string, len(w.Parts))
	for i, p := range w.Parts {
		names[i] = fmt.Sprintf("%s*%g", p.Name(), w.Weights[i])
	}
	return strings.Join(names, "+")
}

// ReadsSiblings implements SiblingReader: any part reads them.
func (w *Weighted) ReadsSiblings() bool {
	for _, p := range w.Parts {
		if ReadsSiblings(p) {
			return true
		}
	}
	return false
}

// ReadsWork implements WorkReader: any part reads it.
func (w *Weighted) ReadsWork() bool {
	for _, p := range w.Parts {
		if ReadsWork(p) {
			return true
		}
	}
	return false
}

// ReadsLengthCorr implements CorrReader: any part reads it.
func (w *Weighted) ReadsLengthCorr() bool {
	for _, p := range w.Parts {
		if ReadsLengthCorr(p) {
			return true
		}
	}
	return false
}

// SpreadsGroup implements GroupSpreader: the first part that spreads it
// decides (its cap included).
func (w *Weighted) SpreadsGroup(req *Request, promptTokens int) (bool, int) {
	for _, p := range w.Parts {
		if ok, capped := SpreadsGroup(p, req, promptTokens); ok {
			return true, capped
		}
	}
	return false, 0
}

// EffectiveLoad implements LoadMeasure: the highest load any part measures
// (a server one part sees as overloaded is overloaded for the combination,
// since that part's overload penalty pulls the weighted score down); c.Load
// when no part measures load itself.
func (w *Weighted) EffectiveLoad(c *Candidate) float64 {
	load, measured := 0.0, false
	for _, p := range w.Parts {
		if m, ok := p.(LoadMeasure); ok {
			if l := m.EffectiveLoad(c); !measured || l > load {
				load, measured = l, true
			}
		}
	}
	if !measured {
		return c.Load
	}
	return load
}

// Score sums each part's scores times its weight. Not safe for concurrent
// use (it reuses a scratch buffer); the router serialises decisions.
func (w *Weighted) Score(req *Request, c []Candidate, out []float64) {
	if len(w.Parts) == 1 && w.Weights[0] == 1 {
		w.Parts[0].Score(req, c, out)
		return
	}
	for i := range out[:len(c)] {
		out[i] = 0
	}
	if cap(w.scratch) < len(c) {
		w.scratch = make([]float64, len(c))
	}
	tmp := w.scratch[:len(c)]
	for k, p := range w.Parts {
		p.Score(req, c, tmp)
		for i := range tmp {
			out[i] += w.Weights[k] * tmp[i]
		}
	}
}

// Pick returns the index of the best candidate: highest score, ties to the
// lowest Order. NaN scores lose to every number. -1 for no candidates.
func Pick(c []Candidate, scores []float64) int {
	best := -1
	for i := range c {
		s := scores[i]
		if s != s { // NaN
			if best == -1 {
				best = i
			}
			continue
		}
		if best == -1 {
			best = i
			continue
		}
		bs := scores[best]
		if bs != bs || s > bs || (s == bs && c[i].Order < c[best].Order) {
			best = i
		}
	}
	return best
}

// Term is one named part of a candidate's score, for explanations.
type Term struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
}

// Explainer is implemented by strategies that can say what a score is made
// of. Explain returns the terms of c[i]'s score (its last term, "score",
// is the value Score writes for c[i]). The router calls it after the
// decision, when the prompt's tokens are gone: req.Tokens is nil and
// promptTokens is the prompt's length, so an Explainer's score may depend
// on the prompt's length but not on its contents.
type Explainer interface {
	Explain(req *Request, promptTokens int, c []Candidate) [][]Term
}

// Explain returns s's terms for c, or nil when s cannot explain itself.
func Explain(s Strategy, req *Request, promptTokens int, c []Candidate) [][]Term {
	if e, ok := s.(Explainer); ok {
		return e.Explain(req, promptTokens, c)
	}
	return nil
}

// Explain implements Explainer: a single part of weight 1 explains itself;
// otherwise each part contributes its weighted score ("name*weight") and,
// when it explains itself, its own terms prefixed by its name. Nil when a
// part cannot be scored without the prompt's tokens (a part that is not an
// Explainer).
func (w *Weighted) Explain(req *Request, promptTokens int, c []Candidate) [][]Term {
	if len(w.Parts) == 1 && w.Weights[0] == 1 {
		return Explain(w.Parts[0], req, promptTokens, c)
	}
	out := make([][]Term, len(c))
	total := make([]float64, len(c))
	for k, p := range w.Parts {
		terms := Explain(p, req, promptTokens, c)
		if terms == nil {
			return nil
		}
		for i := range c {
			part := terms[i][len(terms[i])-1].Value
			for _, t := range terms[i][:len(terms[i])-1] {
				out[i] = append(out[i], Term{p.Name() + "." + t.Name, t.Value})
			}
			out[i] = append(out[i], Term{fmt.Sprintf("%s*%g", p.Name(), w.Weights[k]), w.Weights[k] * part})
			total[i] += w.Weights[k] * part
		}
	}
	for i := range c {
		out[i] = append(out[i], Term{"score", total[i]})
	}
	return out
}
