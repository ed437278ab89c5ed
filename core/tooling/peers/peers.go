package peers

// Peer policies: the scoring rules of other routers, re-implemented from
// their published descriptions (project reference routing-anchors.md) so
// that a benchmark can run every policy through this package's strategy.Strategy
// interface and the same router. None of them is a default of kvc-router.
//
//   - round_robin: the next server in pool order, one step per decision.
//   - random: a uniformly random server (seeded).
//   - sglang_cache_aware: SGLang's threshold rule over router in-flight
//     counts and the prefix match ratio.
//   - llmd_weighted: llm-d/GAIE's default weighted sum of the approximate
//     prefix scorer (3), queue scorer (2) and KV-cache utilisation scorer (2).
//   - llmd_precise: llm-d's precise sample (precise prefix 2 with tier
//     weights gpu 1.0 / cpu 0.8, kv-utilisation 1, queue 1).
//   - dynamo_cost: Dynamo's linear cost over prefill and decode blocks with
//     tier-weighted overlap credit (argmin; returned negated).
//
// Some of these systems read signals a strategy.Candidate does not carry (scraped
// waiting queue and KV usage, router-side active prefill/decode blocks).
// They get them from a Signals provider registered under a name and named
// in the strategy's "signals" parameter; without one they fall back to the
// strategy.Candidate's own fields, as documented on each type.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"

	json "github.com/goccy/go-json"

	"github.com/kvc-router/kvc-router/core/index"
	"github.com/kvc-router/kvc-router/core/load"
	"github.com/kvc-router/kvc-router/core/strategy"
)

// Signals supplies per-server inputs beyond strategy.Candidate.
type Signals interface {
	// Metrics is the server's last scraped metrics (ok false if none).
	Metrics(server string) (load.Metrics, bool)
	// Active is router-local accounting of the blocks still to prefill and
	// the KV blocks held by requests routed to server (Dynamo's slot view).
	Active(server string) (prefillBlocks, decodeBlocks float64, ok bool)
}

var (
	sigMu    sync.RWMutex
	sigTable = map[string]Signals{}
)

// RegisterSignals makes s available to peer strategies whose "signals"
// parameter is name; a nil s removes the entry.
func RegisterSignals(name string, s Signals) {
	sigMu.Lock()
	defer sigMu.Unlock()
	if s == nil {
		delete(sigTable, name)
		return
	}
	sigTable[name] = s
}

func lookupSignals(name string) Signals {
	if name == "" {
		return nil
	}
	sigMu.RLock()
	defer sigMu.RUnlock()
	return sigTable[name]
}

func init() {
	strategy.Register("round_robin", func(p json.RawMessage) (strategy.Strategy, error) {
		var v struct{}
		if err := strategy.DecodeStrict(p, &v); err != nil {
			return nil, fmt.Errorf("round_robin: %w", err)
		}
		return &RoundRobin{}, nil
	})
	strategy.Register("random", func(p json.RawMessage) (strategy.Strategy, error) {
		v := struct {
			Seed uint64 `json:"seed"`
		}{}
		if err := strategy.DecodeStrict(p, &v); err != nil {
			return nil, fmt.Errorf("random: %w", err)
		}
		return NewRandom(v.Seed), nil
	})
	strategy.Register("sglang_cache_aware", func(p json.RawMessage) (strategy.Strategy, error) {
		s := DefaultSGLang()
		if err := strategy.DecodeStrict(p, &s); err != nil {
			return nil, fmt.Errorf("sglang_cache_aware: %w", err)
		}
		if !(s.CacheThreshold >= 0 && s.CacheThreshold <= 1) || s.BalanceAbs < 0 || s.BalanceRel < 1 {
			return nil, fmt.Errorf("sglang_cache_aware: need cache_threshold in [0,1], balance_abs_threshold >= 0, balance_rel_threshold >= 1")
		}
		return &s, nil
	})
	strategy.Register("llmd_weighted", func(p json.RawMessage) (strategy.Strategy, error) {
		return buildLLMD("llmd_weighted", DefaultLLMDApprox(), p)
	})
	strategy.Register("llmd_precise", func(p json.RawMessage) (strategy.Strategy, error) {
		return buildLLMD("llmd_precise", DefaultLLMDPrecise(), p)
	})
	strategy.Register("dynamo_cost", func(p json.RawMessage) (strategy.Strategy, error) {
		d := DefaultDynamo()
		if err := strategy.DecodeStrict(p, &d); err != nil {
			return nil, fmt.Errorf("dynamo_cost: %w", err)
		}
		if d.BlockSize <= 0 {
			return nil, fmt.Errorf("dynamo_cost: block_size must be > 0")
		}
		return &d, nil
	})
}

// RoundRobin picks candidates in turn: decision k prefers candidate k mod n.
type RoundRobin struct{ next int }

// Name implements strategy.Strategy.
func (*RoundRobin) Name() string { return "round_robin" }

// Score implements strategy.Strategy.
func (r *RoundRobin) Score(_ *strategy.Request, c []strategy.Candidate, out []float64) {
	n := len(c)
	if n == 0 {
		return
	}
	k := r.next % n
	r.next++
	for i := range c {
		out[i] = -float64((i - k + n) % n)
	}
}

// Random scores candidates uniformly at random from a seeded generator.
type Random struct{ rng *rand.Rand }

// NewRandom returns a Random seeded with seed.
func NewRandom(seed uint64) *Random {
	return &Random{rng: rand.New(rand.NewPCG(seed, 0x72616e646f6d))}
}

// Name implements strategy.Strategy.
func (*Random) Name() string { return "random" }

// Score implements strategy.Strategy.
func (r *Random) Score(_ *strategy.Request, c []strategy.Candidate, out []float64) {
	for i := range c {
		out[i] = r.rng.Float64()
	}
}

// SGLang is SGLang's cache_aware rule (defaults: Python RouterArgs, as verl
// and prime-rl use it). Load is the router's in-flight count. The system is
// imbalanced when max-min > BalanceAbs and max > BalanceRel*min: then the
// least loaded server wins. Otherwise, if the best match ratio (matched
// blocks / hittable blocks) exceeds CacheThreshold, the longest match wins
// (ties to the less loaded); else the least loaded server wins.
type SGLang struct {
	CacheThreshold float64 `json:"cache_threshold"`
	BalanceAbs     float64 `json:"balance_abs_threshold"`
	BalanceRel     float64 `json:"balance_rel_threshold"`
}

// DefaultSGLang returns 0.3 / 64 / 1.5.
func DefaultSGLang() SGLang { return SGLang{CacheThreshold: 0.3, BalanceAbs: 64, BalanceRel: 1.5} }

// Name implements strategy.Strategy.
func (*SGLang) Name() string { return "sglang_cache_aware" }

// Score implements strategy.Strategy.
func (s *SGLang) Score(_ *strategy.Request, c []strategy.Candidate, out []float64) {
	if len(c) == 0 {
		return
	}
	minL, maxL := math.Inf(1), math.Inf(-1)
	best := 0.0
	for i := range c {
		l := float64(c[i].Inflight)
		minL, maxL = math.Min(minL, l), math.Max(maxL, l)
		best = math.Max(best, matchRatio(&c[i]))
	}
	imbalanced := maxL-minL > s.BalanceAbs && maxL > s.BalanceRel*minL
	useCache := !imbalanced && best > s.CacheThreshold
	for i := range c {
		l := float64(c[i].Inflight)
		if useCache {
			// The ratio dominates; load (< 1e6 requests) only breaks ties.
			out[i] = matchRatio(&c[i])*1e6 - l
		} else {
			out[i] = -l
		}
	}
}

func matchRatio(c *strategy.Candidate) float64 {
	if c.HittableBlocks <= 0 {
		return 0
	}
	return float64(c.Hit.Blocks) / float64(c.HittableBlocks)
}

// LLMD is llm-d's weighted scorer sum, final = Σ w_k·score_k with each score
// in [0, 1], max-score picker with random tie-breaking:
//
//	prefix = Σ_tier tier_weight·matched_blocks[tier] / total_blocks, both
//	         capped at MaxPrefixBlocks (0 = no cap; the approximate scorer
//	         hashes at most 256 blocks of the prompt)
//	queue  = (maxQ − q)/(maxQ − minQ), 1 when all equal; q = scraped waiting
//	         requests (router in-flight count without signals)
//	kv     = 1 − kv_cache_usage (1 − strategy.Candidate.Load without signals)
type LLMD struct {
	PrefixWeight    float64            `json:"prefix_weight"`
	QueueWeight     float64            `json:"queue_weight"`
	KVWeight        float64            `json:"kv_weight"`
	MaxPrefixBlocks int                `json:"max_prefix_blocks"`
	TierWeights     map[string]float64 `json:"tier_weights"`
	SignalsName     string             `json:"signals"`
	Seed            uint64             `json:"seed"`
	name            string
	tier            [index.NumTiers]float64
	rng             *rand.Rand
	q               []float64
}

// DefaultLLMDApprox is the built-in default: approximate prefix 3, queue 2,
// kv-cache utilisation 2, at most 256 hashed blocks, GPU-only credit.
func DefaultLLMDApprox() LLMD {
	return LLMD{PrefixWeight: 3, QueueWeight: 2, KVWeight: 2, MaxPrefixBlocks: 256, TierWeights: map[string]float64{"gpu": 1}}
}

// DefaultLLMDPrecise is the precise sample: precise prefix 2 (gpu 1.0,
// cpu 0.8), kv-cache utilisation 1, queue 1, no block cap.
func DefaultLLMDPrecise() LLMD {
	return LLMD{PrefixWeight: 2, QueueWeight: 1, KVWeight: 1, TierWeights: map[string]float64{"gpu": 1, "cpu": 0.8}}
}

func buildLLMD(name string, l LLMD, p json.RawMessage) (strategy.Strategy, error) {
	if err := strategy.DecodeStrict(p, &l); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if l.PrefixWeight < 0 || l.QueueWeight < 0 || l.KVWeight < 0 || l.MaxPrefixBlocks < 0 {
		return nil, fmt.Errorf("%s: weights and max_prefix_blocks must not be negative", name)
	}
	tw, err := strategy.TierWeights(name, l.TierWeights)
	if err != nil {
		return nil, err
	}
	l.tier = tw
	l.name = name
	l.rng = rand.New(rand.NewPCG(l.Seed, 0x6c6c6d64))
	return &l, nil
}

// Name implements strategy.Strategy.
func (l *LLMD) Name() string { return l.name }

// Score implements strategy.Strategy.
func (l *LLMD) Score(_ *strategy.Request, c []strategy.Candidate, out []float64) {
	sig := lookupSignals(l.SignalsName)
	if cap(l.q) < len(c) {
		l.q = make([]float64, len(c))
	}
	q := l.q[:len(c)]
	minQ, maxQ := math.Inf(1), math.Inf(-1)
	for i := range c {
		q[i] = float64(c[i].Inflight)
		if sig != nil {
			if m, ok := sig.Metrics(c[i].ID); ok {
				q[i] = m.Waiting
			}
		}
		minQ, maxQ = math.Min(minQ, q[i]), math.Max(maxQ, q[i])
	}
	for i := range c {
		kv := 1 - c[i].Load
		if sig != nil {
			if m, ok := sig.Metrics(c[i].ID); ok && m.HasKVUsage {
				kv = 1 - m.KVUsage
			}
		}
		qs := 1.0
		if maxQ > minQ {
			qs = (maxQ - q[i]) / (maxQ - minQ)
		}
		out[i] = l.PrefixWeight*l.prefix(&c[i]) + l.QueueWeight*qs + l.KVWeight*kv + 1e-9*l.rng.Float64()
	}
}

func (l *LLMD) prefix(c *strategy.Candidate) float64 {
	total := c.HittableBlocks
	if l.MaxPrefixBlocks > 0 && total > l.MaxPrefixBlocks {
		total = l.MaxPrefixBlocks
	}
	if total <= 0 {
		return 0
	}
	// Longest consecutive prefix, each block credited by its tier. The
	// match's tier breakdown is in prefix order GPU, then lower tiers
	// (a GPU hit after a CPU block is not a reusable GPU prefix in vLLM),
	// so crediting the counts in that order respects the cap.
	left := total
	s := 0.0
	for t := range index.NumTiers {
		n := c.Hit.Tier[t]
		if n > left {
			n = left
		}
		s += l.tier[t] * float64(n)
		left -= n
	}
	return math.Min(1, s/float64(total))
}

// Dynamo is Dynamo's KV router cost (argmin; Score returns −cost):
//
//	adjusted_prefill = max(prefill_blocks − c·gpu_overlap − w_host·cpu_overlap
//	                       − w_disk·ssd_overlap, 0)
//	cost             = prefill_load_scale·adjusted_prefill + decode_blocks
//
// prefill_blocks = blocks still to prefill on the worker + the request's
// blocks; decode_blocks = KV blocks held on the worker + the request's
// blocks. Worker figures come from Signals.Active; without signals both are
// estimated from the router's in-flight prompt tokens / BlockSize.
type Dynamo struct {
	OverlapCredit    float64 `json:"overlap_score_credit"`
	PrefillLoadScale float64 `json:"prefill_load_scale"`
	HostWeight       float64 `json:"host_cache_hit_weight"`
	DiskWeight       float64 `json:"disk_cache_hit_weight"`
	BlockSize        int     `json:"block_size"`
	SignalsName      string  `json:"signals"`
}

// DefaultDynamo returns Dynamo's documented defaults (1.0, 1.0, 0.75, 0.25)
// with vLLM's 16-token blocks for the fallback estimate.
func DefaultDynamo() Dynamo {
	return Dynamo{OverlapCredit: 1, PrefillLoadScale: 1, HostWeight: 0.75, DiskWeight: 0.25, BlockSize: 16}
}

// Name implements strategy.Strategy.
func (*Dynamo) Name() string { return "dynamo_cost" }

// Score implements strategy.Strategy.
func (d *Dynamo) Score(_ *strategy.Request, c []strategy.Candidate, out []float64) {
	sig := lookupSignals(d.SignalsName)
	for i := range c {
		out[i] = -d.Cost(&c[i], sig)
	}
}

// Cost returns the candidate's cost (lower is better).
func (d *Dynamo) Cost(c *strategy.Candidate, sig Signals) float64 {
	est := float64(c.InflightTokens) / float64(d.BlockSize)
	pre, dec := est, est
	if sig != nil {
		if p, q, ok := sig.Active(c.ID); ok {
			pre, dec = p, q
		}
	}
	req := float64(c.HittableBlocks + 1)
	adj := pre + req - d.OverlapCredit*float64(c.Hit.Tier[index.GPU]) -
		d.HostWeight*float64(c.Hit.Tier[index.CPU]) - d.DiskWeight*float64(c.Hit.Tier[index.SSD])
	if adj < 0 {
		adj = 0
	}
	return d.PrefillLoadScale*adj + dec + req
}
