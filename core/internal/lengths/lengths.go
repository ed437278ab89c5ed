// Package lengths learns response lengths from what a router can see
// (issue 26): the output token count a finished request reports at
// release (the verl hook forwards it) or that its server's KV events
// showed, else the time from acquire to release as a coarse proxy. Responses to one prompt have similar lengths
// (Seer) and a prompt's responses are similar across epochs (RhymeRL), so
// the estimate is kept per prompt, keyed by a hash of the prompt's
// tokens:
//
//   - history: the mean length of the prompt's responses in earlier steps,
//     an exponentially weighted mean over steps (Weight on the newest). It
//     is not part of the prefix index, so a weight sync's index reset
//     leaves it alone;
//   - this step: siblings that finish update their group's estimate while
//     the rest still run or wait.
//
// A prompt never seen predicts the mean over every prompt seen (0 before
// any observation: unknown).
package lengths

import (
	"container/list"
	"math"
	"sync"
)

// Key identifies a prompt: FNV-1a over its token ids.
type Key uint64

// KeyOf hashes a prompt's tokens.
func KeyOf(tokens []int32) Key {
	h := uint64(14695981039346656037)
	for _, t := range tokens {
		v := uint32(t)
		for i := 0; i < 4; i++ {
			h ^= uint64(byte(v >> (8 * i)))
			h *= 1099511628211
		}
	}
	return Key(h)
}

// Config tunes a Tracker. Zero fields take the defaults.
type Config struct {
	// Weight is the newest step's weight in a prompt's history mean
	// (default 0.6).
	Weight float64
	// MaxPrompts bounds the prompts remembered, least recently seen
	// dropped first (default 1<<20).
	MaxPrompts int
}

// Defaults.
const (
	DefaultWeight     = 0.6
	DefaultMaxPrompts = 1 << 20
)

// Estimate is a prompt's predicted response length.
type Estimate struct {
	// Tokens is the predicted mean output length (0 = unknown).
	Tokens float64
	// History is true when the prompt was seen in an earlier step, and
	// Siblings counts this step's finished responses behind the figure.
	History  bool
	Siblings int
}

type entry struct {
	key Key
	// hist is the history mean over earlier steps (valid when hasHist).
	hist    float64
	hasHist bool
	// This step's finished responses (slog: the sum of their logs).
	sum  float64
	slog float64
	n    int
	step uint64
	el   *list.Element
}

// Tracker is safe for concurrent use.
type Tracker struct {
	mu      sync.Mutex
	cfg     Config
	byKey   map[Key]*entry
	lru     *list.List // front = most recently seen
	step    uint64
	allSum  float64
	allN    float64
	dropped uint64
	// anova accumulates this step's log lengths by prompt for the
	// within-group correlation (Corr); corr is the last step's estimate.
	anova     anova
	corr      float64
	corrKnown bool
}

// anova holds the sums a one-way analysis of variance of log lengths by
// prompt needs, kept as responses arrive (no pass over the prompts).
type anova struct {
	n, k   float64 // responses, prompts with one or more
	t1, t2 float64 // sum of y and of y^2
	g      float64 // sum over prompts of S_k^2 / n_k
	n2     float64 // sum over prompts of n_k^2
}

// add records y = log(length) for a prompt that had n responses summing
// s before it.
func (a *anova) add(y, s float64, n int) {
	a.n++
	a.t1 += y
	a.t2 += y * y
	if n == 0 {
		a.k++
	} else {
		a.g -= s * s / float64(n)
	}
	a.g += (s + y) * (s + y) / float64(n+1)
	a.n2 += float64(2*n + 1)
}

// Minimum evidence for a correlation estimate: prompts with responses, and
// responses beyond one per prompt (the within-prompt degrees of freedom).
const (
	minCorrPrompts = 8
	minCorrWithin  = 16
)

// icc is the intra-class correlation of the recorded logs (the ANOVA
// estimator, clamped to [0, 1]); ok false without enough evidence.
func (a *anova) icc() (float64, bool) {
	if a.k < minCorrPrompts || a.n-a.k < minCorrWithin {
		return 0, false
	}
	if v := a.t2/a.n - (a.t1/a.n)*(a.t1/a.n); v <= 1e-9*(1+a.t2/a.n) {
		return 0, false // every length equal (up to rounding): no evidence either way
	}
	ssw := a.t2 - a.g
	ssb := a.g - a.t1*a.t1/a.n
	msw := max(0, ssw) / (a.n - a.k)
	msb := max(0, ssb) / (a.k - 1)
	n0 := (a.n - a.n2/a.n) / (a.k - 1)
	den := msb + (n0-1)*msw
	if !(den > 0) {
		return 0, false
	}
	return min(1, max(0, (msb-msw)/den)), true
}

// New builds a Tracker.
func New(cfg Config) *Tracker {
	if cfg.Weight <= 0 || cfg.Weight > 1 || math.IsNaN(cfg.Weight) {
		cfg.Weight = DefaultWeight
	}
	if cfg.MaxPrompts <= 0 {
		cfg.MaxPrompts = DefaultMaxPrompts
	}
	return &Tracker{cfg: cfg, byKey: map[Key]*entry{}, lru: list.New()}
}

// fold moves a finished step's responses into the history; t.mu held.
func (t *Tracker) fold(e *entry) {
	if e.step == t.step || e.n == 0 {
		return
	}
	m := e.sum / float64(e.n)
	if e.hasHist {
		e.hist = t.cfg.Weight*m + (1-t.cfg.Weight)*e.hist
	} else {
		e.hist, e.hasHist = m, true
	}
	e.sum, e.slog, e.n = 0, 0, 0
}

func (t *Tracker) get(k Key, create bool) *entry {
	e := t.byKey[k]
	if e == nil {
		if !create {
			return nil
		}
		e = &entry{key: k, step: t.step}
		e.el = t.lru.PushFront(e)
		t.byKey[k] = e
		for t.lru.Len() > t.cfg.MaxPrompts {
			old := t.lru.Remove(t.lru.Back()).(*entry)
			delete(t.byKey, old.key)
			t.dropped++
		}
		return e
	}
	t.fold(e)
	e.step = t.step
	t.lru.MoveToFront(e.el)
	return e
}

// Observe records one finished response of prompt k with n output tokens.
func (t *Tracker) Observe(k Key, n int) {
	if n <= 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.get(k, true)
	y := math.Log(float64(n))
	t.anova.add(y, e.slog, e.n)
	e.sum += float64(n)
	e.slog += y
	e.n++
	t.allSum += float64(n)
	t.allN++
}

// NextStep marks a rollout step boundary (a weight sync): this step's
// responses become history.
func (t *Tracker) NextStep() {
	t.mu.Lock()
	t.step++
	if c, ok := t.anova.icc(); ok {
		t.corr, t.corrKnown = c, true
	}
	t.anova = anova{}
	t.mu.Unlock()
}

// StepCorr is Corr's estimate over this step's responses so far, given at
// least minPrompts prompts and minWithin responses beyond one per prompt
// (ok false before).
func (t *Tracker) StepCorr(minPrompts, minWithin int) (float64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	a := t.anova
	if a.k < float64(minPrompts) || a.n-a.k < float64(minWithin) {
		return 0, false
	}
	return a.icc()
}

// StepResponses is how many responses this step has observed.
func (t *Tracker) StepResponses() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return int(t.anova.n)
}

// Corr is the within-prompt correlation of log response lengths measured
// over the last step that gave enough evidence (the intra-class
// correlation of its finished responses grouped by prompt: 0 when a
// prompt's responses are no more alike than any two, 1 when they are
// equal); ok false until a step has. A GRPO step's samples of one prompt
// show it directly, and it is a property of the task and the policy that
// changes slowly from step to step.
func (t *Tracker) Corr() (float64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.corr, t.corrKnown
}

// Predict returns prompt k's estimate: this step's finished siblings and
// the history combined, each sibling counting as much as one step of
// history; the mean over all prompts when k is unknown.
func (t *Tracker) Predict(k Key) Estimate {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.get(k, false)
	if e == nil || (!e.hasHist && e.n == 0) {
		if t.allN == 0 {
			return Estimate{}
		}
		return Estimate{Tokens: t.allSum / t.allN}
	}
	est := Estimate{History: e.hasHist, Siblings: e.n}
	switch {
	case e.n == 0:
		est.Tokens = e.hist
	case !e.hasHist:
		est.Tokens = e.sum / float64(e.n)
	default:
		est.Tokens = (e.hist + e.sum) / float64(1+e.n)
	}
	return est
}

// Mean is the mean output length over every response observed (0 before
// the first): what Predict gives a prompt it knows nothing of.
func (t *Tracker) Mean() float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.allN == 0 {
		return 0
	}
	return t.allSum / t.allN
}

// Len is how many prompts are remembered; Dropped how many were evicted.
func (t *Tracker) Len() (n int, dropped uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byKey), t.dropped
}

// Tasks measures how alike an agent task's trajectories are (issue 26):
// each trajectory (a request id kept over its turns, as verl's agent loop
// does) sums the output tokens its turns report, and a step's trajectories
// are grouped by task, their first turn's prompt (a task's trajectories
// share it). The within-prompt correlation Tracker measures is the wrong
// figure for agents: a first turn's length says little about how many
// turns a trajectory takes or how long they are, which a hard task sets
// for all its trajectories. Not safe for concurrent use: the router calls
// it under its lock.
type Tasks struct {
	max  int
	byID map[string]trajectory
	// order is byID's keys as started: NextStep sums in this order, so a
	// step's figure does not depend on map iteration (runs reproduce).
	order     []string
	dropped   uint64
	corr      float64
	corrKnown bool
}

type trajectory struct {
	task   Key
	tokens int64
}

// NewTasks builds a Tasks that follows at most max trajectories a step.
func NewTasks(max int) *Tasks {
	return &Tasks{max: max, byID: map[string]trajectory{}}
}

// Start records a turn of trajectory id, whose prompt hashes to key: the
// first turn's key names the trajectory's task.
func (t *Tasks) Start(id string, key Key) {
	if _, ok := t.byID[id]; ok {
		return
	}
	if len(t.byID) >= t.max {
		// Beyond the bound the step's first trajectories stand for the
		// rest: a sample, not a reset that would lose them all.
		t.dropped++
		return
	}
	t.byID[id] = trajectory{task: key}
	t.order = append(t.order, id)
}

// Add adds a finished turn's output tokens to trajectory id (a turn whose
// trajectory was never started, or went unfollowed, is ignored).
func (t *Tasks) Add(id string, tokens int) {
	if tr, ok := t.byID[id]; ok && tokens > 0 {
		tr.tokens += int64(tokens)
		t.byID[id] = tr
	}
}

// NextStep ends a step: its trajectories' log totals, grouped by task,
// give the correlation (kept until a later step gives enough evidence),
// and the trajectories are forgotten.
func (t *Tasks) NextStep() {
	type group struct {
		s float64
		n int
	}
	groups := make(map[Key]group, len(t.byID)/2+1)
	var a anova
	for _, id := range t.order {
		tr := t.byID[id]
		if tr.tokens <= 0 {
			continue
		}
		y := math.Log(float64(tr.tokens))
		g := groups[tr.task]
		a.add(y, g.s, g.n)
		groups[tr.task] = group{s: g.s + y, n: g.n + 1}
	}
	if c, ok := a.icc(); ok {
		t.corr, t.corrKnown = c, true
	}
	clear(t.byID)
	clear(t.order) // drop the strings, keep the capacity
	t.order = t.order[:0]
}

// Corr is the within-task correlation of log trajectory output over the
// last step that gave enough evidence (8 tasks, 16 trajectories beyond one
// per task); ok false until one has.
func (t *Tasks) Corr() (float64, bool) { return t.corr, t.corrKnown }

// DroppedTurns counts the turns of trajectories not followed because a
// step started more trajectories than the bound.
func (t *Tasks) DroppedTurns() uint64 { return t.dropped }
