package router

import (
	"math"

	"github.com/kvc-router/kvc-router/core/internal/index"
	"github.com/kvc-router/kvc-router/core/internal/load"
)

// ServerStatus is one pool member as the router sees it.
type ServerStatus struct {
	ID        string        `json:"id"`
	Events    bool          `json:"events"`
	BlockSize int           `json:"block_size"`
	Load      load.Snapshot `json:"load"`
	Running   float64       `json:"running"`
	Waiting   float64       `json:"waiting"`
	KVUsage   float64       `json:"kv_cache_usage"`
	// PrefixHitRate is the engine-reported hits/queries ratio (tokens).
	PrefixHitRate float64 `json:"prefix_hit_rate"`
}

// Status is the router's full state summary.
type Status struct {
	Mode          string  `json:"mode"`
	Strategy      string  `json:"strategy"`
	LoadThreshold float64 `json:"load_threshold"`
	StickyOverld  bool    `json:"sticky_overload"`
	Speculate     bool    `json:"speculate"`
	Approximate   bool    `json:"approximate"`
	StickySize    int     `json:"sticky_size"`
	StickyMax     int     `json:"sticky_max_size"`
	// MaxPrompt is max_prompt_tokens: callers check a prompt's length
	// against it before they pack the tokens.
	MaxPrompt int `json:"max_prompt_tokens"`
	// PromptTokensMean is the running mean prompt length of the requests
	// placed (the latest few thousand weigh most; held requests count when
	// they arrive): the rollout's typical prompt, against which
	// group_spread_min_ratio reads response_tokens (0 before any request).
	PromptTokensMean int             `json:"prompt_tokens_mean"`
	TotalInflight    int             `json:"total_inflight"`
	Servers          []ServerStatus  `json:"servers"`
	Counters         Counters        `json:"counters"`
	Index            index.Status    `json:"index"`
	Admission        AdmissionStatus `json:"admission"`
	// Lengths is the length learner's statistics (null when lengths is
	// off): observed_tokens grows only when releases report output counts.
	Lengths *LengthCounters `json:"lengths"`
	// DecisionSeconds is the histogram of the decisions' duration.
	DecisionSeconds LatencyStatus `json:"decision_seconds"`
	// LastDecision is the last routing decision, stage by stage (null
	// before the first).
	LastDecision *Explain `json:"last_decision"`
}

// Status summarises the router; Approximate is true when any pool member
// lacks a KV-event feed.
func (r *Router) Status() Status {
	r.mu.Lock()
	st := Status{
		Mode: r.cfg.Mode, Strategy: r.strat.Name(), LoadThreshold: r.threshold,
		StickyOverld: r.overload, Speculate: r.speculate, StickySize: r.sticky.Len(),
		StickyMax: r.cfg.StickyMaxSize, MaxPrompt: r.cfg.MaxPromptTokens, Counters: r.counters, Admission: r.aq.st,
		DecisionSeconds: r.latency.status(), LastDecision: r.explainLocked(),
		PromptTokensMean: int(math.Round(r.promptMean)),
	}
	st.Admission.Enabled, st.Admission.Held, st.Admission.HeldBytes = r.admit, len(r.aq.tickets), r.aq.bytes
	if r.lens != nil {
		c := r.lens.snapshot()
		st.Lengths = &c
	}
	for _, s := range r.pool {
		sn, _ := r.ld.Get(s.id)
		ss := ServerStatus{ID: s.id, Events: s.events, BlockSize: blockSizeOf(s, &sn, r.cfg.BlockSize), Load: sn}
		if sn.HasMetric {
			ss.Running, ss.Waiting, ss.KVUsage = sn.Metrics.Running, sn.Metrics.Waiting, sn.Metrics.KVUsage
			if sn.Metrics.PrefixQueries > 0 {
				ss.PrefixHitRate = sn.Metrics.PrefixHits / sn.Metrics.PrefixQueries
			}
		}
		if !s.events {
			st.Approximate = true
		}
		st.TotalInflight += sn.Inflight
		st.Servers = append(st.Servers, ss)
	}
	r.mu.Unlock()
	st.Index = r.ix.Status()
	return st
}
