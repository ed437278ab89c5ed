package peers

import (
	"errors"
	"github.com/kvc-router/kvc-router/core/kvcrouter"
	"math"
	"math/rand/v2"
)

// SMG is the cache_aware policy of SMG, the Shepherd Model Gateway (`smg`
// 1.13.0 on PyPI, successor of sglang-router), in its HTTP mode: an
// approximate prefix tree inserted at routing time (here the router's
// speculative index), load = the router's in-flight count per worker.
// Upstream: smg-project/smg model_gateway/src/policies/cache_aware.rs
// (select_worker, select_worker_with_text, select_matched_candidate,
// gate_selected_candidate) and the 1.13.0 launcher's defaults and help
// text (bindings/python/src/smg/router_args.py):
//
//  1. Worker overload protection (on by default): a worker whose polled
//     waiting requests reach WaitingVeto (8) or whose KV usage reaches
//     UsageVeto (0.8) is left out while another is under both; when every
//     worker is over them the least-loaded one takes the request. Loads
//     are polled every load_monitor_interval (10 s; the policy's scrape
//     period in kvbench).
//  2. avg = mean in-flight count over the eligible workers.
//  3. match rate = matched / request length; above CacheThreshold (0.3)
//     the least-loaded worker holding the longest match wins (uniform
//     among ties), unless the spill gate fires: its load exceeds
//     BalanceRel (1.5) × avg AND avg + margin, margin = BalanceAbs (64)
//     capped at the count's natural swing at that mean, max(2·√avg, 4)
//     (1.13.0 help text); then the least-loaded worker wins.
//  4. Otherwise the least-loaded worker, ties to the one that has
//     processed fewer requests, then to the first (#1714).
type SMG struct {
	CacheThreshold float64 `json:"cache_threshold"`
	BalanceAbs     float64 `json:"balance_abs_threshold"`
	BalanceRel     float64 `json:"balance_rel_threshold"`
	WaitingVeto    float64 `json:"worker_overload_waiting_requests"`
	UsageVeto      float64 `json:"worker_overload_token_usage"`
	Seed           uint64  `json:"seed"`
	sig            Signals
	rng            *rand.Rand
	processed      map[string]int
	elig           []int
}

// DefaultSMG returns smg 1.13.0's launcher defaults.
func DefaultSMG() SMG {
	return SMG{CacheThreshold: 0.3, BalanceAbs: 64, BalanceRel: 1.5, WaitingVeto: 8, UsageVeto: 0.8}
}

// NewSMG validates cfg and binds it to sig (may be nil: no overload veto).
func NewSMG(cfg SMG, sig Signals) (*SMG, error) {
	s := cfg
	if !(s.CacheThreshold >= 0 && s.CacheThreshold <= 1) || s.BalanceAbs < 0 || s.BalanceRel < 1 ||
		s.WaitingVeto < 0 || s.UsageVeto < 0 {
		return nil, errors.New("smg_cache_aware: need cache_threshold in [0,1], balance_abs_threshold >= 0, " +
			"balance_rel_threshold >= 1, overload thresholds >= 0 (0 = off)")
	}
	s.sig = sig
	s.rng = rand.New(rand.NewPCG(s.Seed, 0x736d67))
	s.processed = map[string]int{}
	return &s, nil
}

// Name implements kvcrouter.Strategy.
func (*SMG) Name() string { return "smg_cache_aware" }

func (s *SMG) overloaded(id string) bool {
	if s.sig == nil {
		return false
	}
	m, ok := s.sig.Metrics(id)
	if !ok {
		return false
	}
	return (s.WaitingVeto > 0 && m.Waiting >= s.WaitingVeto) || (s.UsageVeto > 0 && m.HasKVUsage && m.KVUsage >= s.UsageVeto)
}

// Score implements kvcrouter.Strategy: the chosen worker scores 1, every
// other 0 (ineligible ones −1). No sticky ids: every request is scored and
// counted as processed by its pick.
func (s *SMG) Score(_ *kvcrouter.ScoreRequest, c []kvcrouter.Candidate, out []float64) {
	if len(c) == 0 {
		return
	}
	s.elig = s.elig[:0]
	for i := range c {
		if !s.overloaded(c[i].ID) {
			s.elig = append(s.elig, i)
		}
	}
	all := len(s.elig) == 0
	if all {
		for i := range c {
			s.elig = append(s.elig, i)
		}
	}
	sum, minIdx := 0.0, -1
	best := 0.0
	for _, i := range s.elig {
		sum += float64(c[i].Inflight)
		if minIdx < 0 || c[i].Inflight < c[minIdx].Inflight ||
			(c[i].Inflight == c[minIdx].Inflight && s.processed[c[i].ID] < s.processed[c[minIdx].ID]) {
			minIdx = i
		}
		best = math.Max(best, matchRatio(&c[i]))
	}
	avg := sum / float64(len(s.elig))
	pick := minIdx
	if !all && best > s.CacheThreshold {
		// Least loaded among the workers holding the longest match.
		var tied []int
		for _, i := range s.elig {
			if matchRatio(&c[i]) != best {
				continue
			}
			if len(tied) > 0 && c[i].Inflight > c[tied[0]].Inflight {
				continue
			}
			if len(tied) > 0 && c[i].Inflight < c[tied[0]].Inflight {
				tied = tied[:0]
			}
			tied = append(tied, i)
		}
		sel := tied[s.rng.IntN(len(tied))]
		load := float64(c[sel].Inflight)
		margin := math.Min(s.BalanceAbs, math.Max(2*math.Sqrt(avg), 4))
		if !(load > avg*s.BalanceRel && load > avg+margin) {
			pick = sel
		}
	}
	for i := range out {
		out[i] = 0
	}
	for i := range c {
		if !all && s.overloaded(c[i].ID) {
			out[i] = -1
		}
	}
	out[pick] = 1
	s.processed[c[pick].ID]++
}
