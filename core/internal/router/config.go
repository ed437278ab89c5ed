package router

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	json "github.com/goccy/go-json"

	"github.com/kvc-router/kvc-router/core/internal/blockhash"
	"github.com/kvc-router/kvc-router/core/internal/index"
	"github.com/kvc-router/kvc-router/core/internal/load"
	"github.com/kvc-router/kvc-router/core/internal/strategy"
	"github.com/kvc-router/kvc-router/core/internal/strictjson"
)

// Modes.
const (
	// ModeDefault reproduces verl's GlobalRequestLoadBalancer exactly.
	ModeDefault = "default"
	// ModeKVCAware routes on prefix-cache hits and load.
	ModeKVCAware = "kvc_aware"
)

// ErrConfig wraps every configuration error.
var ErrConfig = errors.New("router: invalid config")

// StrategySpec names one strategy and its weight in the combination.
type StrategySpec struct {
	// Name of a registered strategy (kvc_aware, least_inflight).
	Name string `json:"name"`
	// Weight of the strategy's score in the weighted sum; must be > 0.
	Weight float64 `json:"weight"`
	// Params are the strategy's own parameters; unset ones take the
	// strategy's defaults.
	Params json.RawMessage `json:"params,omitempty"`
}

// ServerSpec overrides per-server settings.
type ServerSpec struct {
	// BlockSize used to key prompts for this server until its metrics
	// report one; 0 = the router's BlockSize.
	// When to change: when this server's block size differs from
	// router.block_size.
	BlockSize int `json:"block_size,omitempty"`
	// Capacity in blocks for approximate residency; 0 = from metrics.
	// When to change: when the server's metrics do not report its KV-cache
	// size.
	Capacity int `json:"capacity,omitempty"`
	// Events says the server has a KV-event feed (index is authoritative).
	// When to change: true for a server that publishes KV events (false for
	// one that does not, under events_default: true).
	Events *bool `json:"events,omitempty"`
}

// IndexSpec sizes the block index.
type IndexSpec struct {
	// MaxEntries caps (server, block) records over all servers (40 bytes
	// each); beyond it the least recently used are evicted (CLOCK).
	// When to change: raise it when the fleet's KV caches hold more blocks in
	// all (servers x blocks each); lower it to bound memory.
	MaxEntries int `json:"max_entries,omitempty"`
	// SpecTTLMS is how long a speculative entry (a block presumed resident
	// because a prompt was routed there) lives on an event-fed server.
	// When to change: raise it when KV events reach the router later than this
	// after a request is routed.
	SpecTTLMS int `json:"spec_ttl_ms,omitempty"`
	// ApproxTTLMS is the same for a server without an event feed.
	// When to change: about how long a prefix stays in a server's cache under
	// your load: shorter when caches turn over fast.
	ApproxTTLMS int `json:"approx_ttl_ms,omitempty"`
}

// LoadSpec tunes the load store.
type LoadSpec struct {
	// StaleAfterMS: metrics older than this are ignored and load falls
	// back to in-flight counts.
	// When to change: raise it when metrics are scraped (collector
	// interval_ms) or pushed less often than this.
	StaleAfterMS int `json:"stale_after_ms,omitempty"`
	// MaxNumSeqs is a server's batch capacity when its metrics do not say.
	// When to change: set it to the servers' max_num_seqs
	// (rollout.max_num_seqs) when that is not 256: vLLM's /metrics does not
	// report it.
	MaxNumSeqs int `json:"max_num_seqs,omitempty"`
	// UnhealthyAfter consecutive failed scrapes mark a server unhealthy.
	// When to change: raise it where single scrapes fail on a flaky network;
	// lower it to stop routing to a dead server sooner.
	UnhealthyAfter int `json:"unhealthy_after,omitempty"`
}

// Config is the router's configuration, as JSON crosses the C boundary.
type Config struct {
	// Mode is "default" (verl's GlobalRequestLoadBalancer exactly) or
	// "kvc_aware" (prefix-cache hits and load).
	// When to change: kvc_aware for cache-aware routing (router.type in the
	// router block).
	Mode string `json:"mode"`
	// StickyMaxSize bounds the sticky-session LRU (request id -> server).
	// When to change: raise it above the number of request ids alive at once
	// (every running session), so bindings are not evicted mid-session; the
	// Python balancer takes verl's max_cache_size (10000) when it is unset.
	StickyMaxSize int `json:"sticky_max_size"`
	// Strategies are combined by weight; the default is the mode's own
	// (least_inflight, or kvc_aware).
	// When to change: to tune a strategy's parameters or to combine
	// strategies.
	Strategies []StrategySpec `json:"strategies,omitempty"`
	// LoadThreshold bounds sticky bindings in kvc_aware mode: a bound
	// server above it is re-scored. 0 = the kvc_aware strategy's threshold.
	// When to change: lower it to break sessions away from busy servers sooner
	// (more balance, less cache reuse); raise it to keep sessions with their
	// cache.
	LoadThreshold float64 `json:"load_threshold,omitempty"`
	// StickyOverload enables the breakout (default true in kvc_aware
	// mode; always false in default mode, as verl ignores load).
	// When to change: false keeps every session on its server whatever its
	// load, as verl does.
	StickyOverload *bool `json:"sticky_overload,omitempty"`
	// BlockSize in tokens keys prompts for servers whose metrics report
	// none.
	// When to change: set it to the servers' vLLM block_size
	// (engine_kwargs.vllm.block_size) when that is not 16 and their metrics do
	// not report it: with the wrong size no prefix matches.
	BlockSize int `json:"block_size,omitempty"`
	// Model and the request's LoRA name form the key namespace.
	// When to change: rarely: it only keeps prefixes keyed under different
	// model names apart.
	Model string `json:"model"`
	// Speculate records routed prompts as presumed resident (default true
	// in kvc_aware mode).
	// When to change: false when every server has a KV-event feed and the
	// index should hold only what servers report.
	Speculate *bool `json:"speculate,omitempty"`
	// EventsDefault says whether servers have KV-event feeds unless a
	// ServerSpec says otherwise; without events the index is approximate.
	// When to change: true when every server publishes KV events (vllm_zmq),
	// so the index is trusted as exact.
	EventsDefault bool `json:"events_default"`
	// Servers overrides settings per server id.
	// When to change: for a server whose block size, capacity or event feed
	// differs from the rest.
	Servers map[string]ServerSpec `json:"servers,omitempty"`
	// Index sizes the block index.
	// When to change: see its keys.
	Index IndexSpec `json:"index"`
	// Load tunes the load store.
	// When to change: see its keys.
	Load LoadSpec `json:"load"`
	// SessionMoves lets a multi-turn session leave a server bound to far
	// more sessions than another at a turn boundary (Router.sessionMove;
	// default true in kvc_aware mode).
	// When to change: false to keep multi-turn sessions where they started
	// (more cache reuse, less balance).
	SessionMoves *bool `json:"session_moves,omitempty"`
	// SessionMoveTokens moves a multi-turn session at a turn boundary,
	// while session_moves is on, to the server with the fewest prompt
	// tokens in flight when its bound server has at least this many times
	// the session's own prompt (its whole context), and at least 4,096
	// tokens, more in flight; 0 disables; unset: DefaultSessionMoveTokens. Session counts miss the
	// imbalance that ends an agent step: in-flight context is what slows
	// an engine's decode, and a hard task's trajectories grow it on one
	// server while the counts stay even (docs/rl-workloads.md, "Session
	// moves by in-flight context"). Relative to the session's own context
	// so the prefill a move re-pays stays small next to the imbalance it
	// removes, and at least 2 so a move never leaves the target the busier.
	// When to change: lower (towards 2) for more balance at the cost of
	// cache hits and TTFT; higher, or 0, to keep sessions where their
	// context is cached (prefill-bound agents with very long contexts).
	SessionMoveTokens *float64 `json:"session_move_tokens,omitempty"`
	// Turns says what the rollout's sessions are before the router has
	// seen any come back: "multi" (agent loops: a trajectory sends turn
	// after turn), "single" (GRPO: one request per sample) or "auto" (the
	// default: learn it from sessions that return). The verl hook sets it
	// from actor_rollout_ref.rollout.multi_turn.enable (or a default agent
	// loop other than single_turn_agent). It decides when the kvc_aware
	// strategy's task_spread applies: from the first request when "multi",
	// else only as returning sessions show the rollout is multi-turn, so a
	// fresh router keeps a first GRPO step's groups with their prompt.
	// When to change: "multi" for agent RL outside verl's hook; "single"
	// to say sessions never return.
	Turns string `json:"turns,omitempty"`
	// ResponseTokens is the longest response the rollout asks for, in
	// tokens (0 = not said). The verl hook sets it from
	// actor_rollout_ref.rollout.response_length. The kvc_aware strategy
	// spreads a single-turn group over servers (group_spread) only when it
	// is more than group_spread_min_ratio times the rollout's mean prompt
	// (status prompt_tokens_mean): long responses make a group kept whole
	// its server's straggler.
	// When to change: set it to the sampling max_tokens outside verl's hook.
	ResponseTokens int `json:"response_tokens,omitempty"`
	// Admission holds requests while every server is full (admission.go).
	// When to change: see its keys.
	Admission AdmissionSpec `json:"admission"`
	// MaxPromptTokens bounds a request's prompt length.
	// When to change: raise it for prompts longer than 1,048,576 tokens.
	MaxPromptTokens int `json:"max_prompt_tokens,omitempty"`
	// Lengths learns response lengths per prompt from releases and orders
	// admission longest first (docs/rl-workloads.md).
	// When to change: with admission on RL steps whose prompts recur.
	Lengths LengthsSpec `json:"lengths"`

	// Strategy, when set, is used as is instead of building Strategies
	// from the registry (Go callers only, e.g. benchmark peers built with
	// their own inputs); Strategies is then ignored. Sticky breakout uses
	// LoadThreshold, or the kvc_aware default when it is 0.
	Strategy strategy.Strategy `json:"-"`

	// Now is a test clock; nil means time.Now.
	Now func() time.Time `json:"-"`
}

// Values of Config.Turns.
const (
	TurnsAuto   = "auto"
	TurnsSingle = "single"
	TurnsMulti  = "multi"
)

// turnsOf maps a normalised Config.Turns to the strategies' input.
func turnsOf(t string) strategy.Turns {
	switch t {
	case TurnsSingle:
		return strategy.TurnsSingle
	case TurnsMulti:
		return strategy.TurnsMulti
	}
	return strategy.TurnsAuto
}

// MaxDurationMS bounds every *_ms setting (7 days): far beyond any useful
// timeout or TTL, far below where milliseconds overflow a time.Duration.
const MaxDurationMS = 7 * 24 * 3600 * 1000

// DefaultSessionMoveTokens is session_move_tokens' default, chosen on
// tuning seeds (docs/rl-workloads.md, "Session moves by in-flight
// context"): on kvbench's RL agent setting 1.5 to 4 shortened the step
// alike, TTFT p99 rising as the setting falls (the moved turns re-pay their
// prefill); at 3 the held-out agent_long, whose contexts run to 64k tokens,
// doubled its TTFT p99, at 4 it moved nothing there.
const DefaultSessionMoveTokens = 4.0

// sessionMoveTokens is session_move_tokens as the router applies it: 0
// where sessions do not move (default mode, session_moves off).
func (c *Config) sessionMoveTokens() float64 {
	if c.Mode != ModeKVCAware || !boolOr(c.SessionMoves, true) {
		return 0
	}
	if c.SessionMoveTokens == nil {
		return DefaultSessionMoveTokens
	}
	return *c.SessionMoveTokens
}

// DefaultMaxPromptTokens bounds prompts (about 4 MiB of int32 token ids).
const DefaultMaxPromptTokens = 1 << 20

// ParseConfig decodes JSON strictly (unknown keys are errors) and validates.
// Every error wraps ErrConfig and a *strictjson.KeyError naming the key.
func ParseConfig(data []byte) (Config, error) {
	var c Config
	if err := strictjson.Decode(data, &c); err != nil {
		return c, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return c, c.normalise()
}

// configErr is a validation error at key.
func configErr(key, format string, args ...any) error {
	return fmt.Errorf("%w: %w", ErrConfig, strictjson.Errorf(key, format, args...))
}

// Normalise validates c and fills in place the defaults New applies (mode,
// sticky size, block size, prompt bound, strategies). Strategy parameters
// are checked when the strategies are built (New, Effective).
func (c *Config) Normalise() error { return c.normalise() }

func (c *Config) normalise() error {
	if c.Mode == "" {
		c.Mode = ModeDefault
	}
	if c.Mode != ModeDefault && c.Mode != ModeKVCAware {
		return configErr("mode", "%q (allowed: default, kvc_aware)", c.Mode)
	}
	if c.StickyMaxSize == 0 {
		c.StickyMaxSize = 10000
	}
	if c.StickyMaxSize < 0 {
		return configErr("sticky_max_size", "must be positive, got %d", c.StickyMaxSize)
	}
	if c.BlockSize == 0 {
		c.BlockSize = blockhash.DefaultBlockSize
	}
	if c.BlockSize < 0 || c.BlockSize > 1<<16 {
		return configErr("block_size", "must be in [1, 65536], got %d", c.BlockSize)
	}
	if c.MaxPromptTokens == 0 {
		c.MaxPromptTokens = DefaultMaxPromptTokens
	}
	if c.MaxPromptTokens < 0 {
		return configErr("max_prompt_tokens", "must be positive, got %d", c.MaxPromptTokens)
	}
	if c.LoadThreshold < 0 || c.LoadThreshold > 1 {
		return configErr("load_threshold", "must be in (0, 1], got %v", c.LoadThreshold)
	}
	for _, v := range []struct {
		name string
		n    int
	}{{"index.max_entries", c.Index.MaxEntries}, {"index.spec_ttl_ms", c.Index.SpecTTLMS}, {"index.approx_ttl_ms", c.Index.ApproxTTLMS},
		{"load.stale_after_ms", c.Load.StaleAfterMS}, {"load.max_num_seqs", c.Load.MaxNumSeqs}, {"load.unhealthy_after", c.Load.UnhealthyAfter}} {
		if v.n < 0 {
			return configErr(v.name, "must not be negative, got %d", v.n)
		}
		// Milliseconds become a time.Duration (nanoseconds): beyond
		// MaxDurationMS the product overflowed and wrapped silently.
		if strings.HasSuffix(v.name, "_ms") && v.n > MaxDurationMS {
			return configErr(v.name, "must be at most %d ms (7 days), got %d", MaxDurationMS, v.n)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.Servers)) {
		s := c.Servers[name]
		if s.BlockSize < 0 || s.BlockSize > 1<<16 {
			return configErr(fmt.Sprintf("servers[%q].block_size", name), "must be in [0, 65536] (0 = router block_size), got %d", s.BlockSize)
		}
		if s.Capacity < 0 {
			return configErr(fmt.Sprintf("servers[%q].capacity", name), "must not be negative, got %d", s.Capacity)
		}
	}
	if c.ResponseTokens < 0 || c.ResponseTokens > 1<<24 {
		return configErr("response_tokens", "must be in [0, 16777216] (0 = not said), got %d", c.ResponseTokens)
	}
	if v := c.SessionMoveTokens; v != nil && !(*v == 0 || (*v >= 2 && *v <= 1000)) {
		return configErr("session_move_tokens", "must be 0 (off) or in [2, 1000], got %v", *v)
	}
	switch c.Turns {
	case "":
		c.Turns = TurnsAuto
	case TurnsAuto, TurnsSingle, TurnsMulti:
	default:
		return configErr("turns", "%q (allowed: auto, single, multi)", c.Turns)
	}
	if err := c.Admission.normalise(); err != nil {
		return err
	}
	if err := c.Lengths.normalise(); err != nil {
		return err
	}
	if len(c.Strategies) == 0 {
		if c.Mode == ModeDefault {
			c.Strategies = []StrategySpec{{Name: "least_inflight", Weight: 1}}
		} else {
			c.Strategies = []StrategySpec{{Name: "kvc_aware", Weight: 1}}
		}
	}
	for i, s := range c.Strategies {
		// Default mode matches no prefixes, so kvc_aware would score on
		// load alone while the user believes cache affinity is on.
		if c.Mode == ModeDefault && s.Name == ModeKVCAware {
			return configErr(fmt.Sprintf("strategies[%d].name", i), "%q needs mode kvc_aware (mode default routes without the prefix index)", s.Name)
		}
		if !(s.Weight > 0) {
			return configErr(fmt.Sprintf("strategies[%d].weight", i), "must be > 0, got %v", s.Weight)
		}
	}
	return nil
}

func (c *Config) buildStrategy() (strategy.Strategy, float64, error) {
	threshold := c.LoadThreshold
	if c.Strategy != nil {
		if threshold == 0 {
			threshold = strategy.DefaultKVCAware().LoadThreshold
		}
		return c.Strategy, threshold, nil
	}
	w := &strategy.Weighted{}
	for i, s := range c.Strategies {
		st, err := strategy.Build(s.Name, s.Params)
		if err != nil {
			return nil, 0, strategyErr(i, err)
		}
		if k, ok := st.(*strategy.KVCAware); ok && threshold == 0 {
			threshold = k.Threshold()
		}
		w.Parts = append(w.Parts, st)
		w.Weights = append(w.Weights, s.Weight)
	}
	if threshold == 0 {
		threshold = strategy.DefaultKVCAware().LoadThreshold
	}
	return w, threshold, nil
}

// strategyErr names the key of a strategy's build error: its name when it is
// not registered, the parameter a *strictjson.KeyError names, else the
// strategy itself.
func strategyErr(i int, err error) error {
	key := fmt.Sprintf("strategies[%d]", i)
	var ke *strictjson.KeyError
	switch {
	case errors.Is(err, strategy.ErrUnknown):
		return configErr(key+".name", "%v", err)
	case errors.As(err, &ke):
		return fmt.Errorf("%w: %w", ErrConfig, strictjson.Prefixed(key+".params", ke))
	}
	return configErr(key, "%v", err)
}

// ResolvedStrategies returns the configured strategies with every
// parameter filled in (the strategy's defaults where the configuration
// is silent), as the library reports them in its effective configuration.
func (c *Config) ResolvedStrategies() ([]StrategySpec, error) {
	out := make([]StrategySpec, len(c.Strategies))
	for i, s := range c.Strategies {
		st, err := strategy.Build(s.Name, s.Params)
		if err != nil {
			return nil, strategyErr(i, err)
		}
		params, err := json.Marshal(st)
		if err != nil {
			return nil, fmt.Errorf("%w: strategies[%d]: encoding parameters: %v", ErrConfig, i, err)
		}
		out[i] = StrategySpec{Name: s.Name, Weight: s.Weight, Params: params}
	}
	return out, nil
}

func (c *Config) indexConfig() index.Config {
	return index.Config{
		MaxEntries: c.Index.MaxEntries,
		SpecTTL:    time.Duration(c.Index.SpecTTLMS) * time.Millisecond,
		ApproxTTL:  time.Duration(c.Index.ApproxTTLMS) * time.Millisecond,
		Now:        c.Now,
	}
}

func (c *Config) loadConfig() load.Config {
	return load.Config{
		StaleAfter:     time.Duration(c.Load.StaleAfterMS) * time.Millisecond,
		MaxNumSeqs:     c.Load.MaxNumSeqs,
		UnhealthyAfter: c.Load.UnhealthyAfter,
		Now:            c.Now,
	}
}

func boolOr(p *bool, def bool) bool {
	if p == nil {
		return def
	}
	return *p
}

// Effective returns c, normalised, with every default the router would
// apply filled in explicitly: strategies with all their parameters, the
// sticky load threshold they imply, the mode's speculation and breakout
// switches, and the index and load sizes. Building a router from the
// result behaves exactly as building it from c.
func (c Config) Effective() (Config, error) {
	if err := c.normalise(); err != nil {
		return c, err
	}
	strategies, err := c.ResolvedStrategies()
	if err != nil {
		return c, err
	}
	_, threshold, err := c.buildStrategy()
	if err != nil {
		return c, err
	}
	c.Strategies = strategies
	c.LoadThreshold = threshold
	kvc := c.Mode == ModeKVCAware
	overload, speculate := kvc && boolOr(c.StickyOverload, true), kvc && boolOr(c.Speculate, true)
	c.StickyOverload, c.Speculate = &overload, &speculate
	moves := kvc && boolOr(c.SessionMoves, true)
	c.SessionMoves = &moves
	moveTokens := c.sessionMoveTokens()
	c.SessionMoveTokens = &moveTokens
	ix := index.Config{MaxEntries: c.Index.MaxEntries, SpecTTL: ms(c.Index.SpecTTLMS), ApproxTTL: ms(c.Index.ApproxTTLMS)}.WithDefaults()
	c.Index = IndexSpec{MaxEntries: ix.MaxEntries, SpecTTLMS: int(ix.SpecTTL / time.Millisecond), ApproxTTLMS: int(ix.ApproxTTL / time.Millisecond)}
	ld := load.Config{StaleAfter: ms(c.Load.StaleAfterMS), MaxNumSeqs: c.Load.MaxNumSeqs, UnhealthyAfter: c.Load.UnhealthyAfter}.WithDefaults()
	c.Load = LoadSpec{StaleAfterMS: int(ld.StaleAfter / time.Millisecond), MaxNumSeqs: ld.MaxNumSeqs, UnhealthyAfter: ld.UnhealthyAfter}
	return c, nil
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }
