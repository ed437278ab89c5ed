// Package peers re-implements the scoring rules of other routers so that a
// benchmark can run each of them through kvc-router's kvcrouter.Strategy
// interface and the same router. It is tooling: the shipped library does not
// link it, nothing registers these strategies by name, and none of them is
// a kvc-router default. Each peer is built with its inputs as arguments
// (configuration and a Signals provider) and handed to the router ready
// made (kvcrouter.RouterConfig.Strategy).
//
// The upstream file each formula follows is cited beside it.
package peers

import (
	"errors"
	"fmt"
	"github.com/kvc-router/kvc-router/core/kvcrouter"
	"math"
	"math/rand/v2"
)

// Signals supplies per-server inputs beyond kvcrouter.Candidate, as the
// benchmark driver observes them. Request-relative answers are about the
// request being routed, named by its id.
type Signals interface {
	// Metrics is the server's last scraped metrics (ok false if none).
	Metrics(server string) (kvcrouter.LoadMetrics, bool)
	// Active is the router-local slot view Dynamo keeps of one server,
	// relative to the request reqID being routed.
	Active(server, reqID string) (Active, bool)
	// Session names the server that served the previous request of reqID's
	// session (ok false for a first request or without sessions).
	Session(reqID string) (string, bool)
}

// Active is Dynamo's router-local view of one worker for one request.
type Active struct {
	// PrefillBlocks is the prompt still to prefill by the worker's active
	// requests (uncached tokens until their first token), in blocks.
	PrefillBlocks float64
	// DecodeBlocks is the worker's unique active KV blocks: a block shared
	// by several active sequences counts once.
	DecodeBlocks float64
	// NewBlocks is how many of the request's blocks the worker's active
	// sequences do not already hold.
	NewBlocks float64
}

// RoundRobin picks candidates in turn: decision k prefers candidate k mod n.
type RoundRobin struct{ next int }

// Name implements kvcrouter.Strategy.
func (*RoundRobin) Name() string { return "round_robin" }

// Score implements kvcrouter.Strategy.
func (r *RoundRobin) Score(_ *kvcrouter.ScoreRequest, c []kvcrouter.Candidate, out []float64) {
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

// Name implements kvcrouter.Strategy.
func (*Random) Name() string { return "random" }

// Score implements kvcrouter.Strategy.
func (r *Random) Score(_ *kvcrouter.ScoreRequest, c []kvcrouter.Candidate, out []float64) {
	for i := range c {
		out[i] = r.rng.Float64()
	}
}

// SGLang is SGLang's cache_aware rule. Load is the router's in-flight
// count. The system is imbalanced when max-min > BalanceAbs and
// max > BalanceRel*min: then the least loaded server wins. Otherwise, if the
// best match ratio (matched blocks / hittable blocks) exceeds
// CacheThreshold, the longest match wins (ties to the less loaded); else:
//
//   - Rule "tree" (default): the tenant with the smallest tree, "most
//     available cache capacity" (sgl-project/sglang
//     sgl-router/src/policies/cache_aware.rs, `tree.get_smallest_tenant()`).
//     The tree's size per tenant is the prompt tokens inserted for it that
//     extended no existing prefix (sgl-router's tree counts characters; the
//     ratio is the same). Load is not consulted.
//   - Rule "gateway": the least loaded server (sgl-project/sglang
//     sgl-model-gateway/src/policies/cache_aware.rs, `workers[min_load_idx]`),
//     the rule of the sglang-router wheels built from the gateway (the
//     arena's sglang-router 0.3.2).
//
// Nothing evicts the tree sizes here (sgl-router evicts LRU leaves beyond
// max_tree_size, 2^26 characters, which kvbench's runs do not reach), and a
// weight update leaves them as they are (sglang-router has no API for it).
// Defaults from the Python launcher's RouterArgs (python -m
// sglang_router.launch_router), which verl uses.
type SGLang struct {
	CacheThreshold float64 `json:"cache_threshold"`
	BalanceAbs     float64 `json:"balance_abs_threshold"`
	BalanceRel     float64 `json:"balance_rel_threshold"`
	// Rule is "tree" (sgl-router) or "gateway" (sgl-model-gateway).
	Rule string `json:"rule"`
	size map[string]float64
}

// SGLang no-match rules.
const (
	SGLangRuleTree    = "tree"
	SGLangRuleGateway = "gateway"
)

// DefaultSGLang returns the launcher defaults 0.3 / 64 / 1.5 with
// sgl-router's smallest-tree rule.
func DefaultSGLang() SGLang {
	return SGLang{CacheThreshold: 0.3, BalanceAbs: 64, BalanceRel: 1.5, Rule: SGLangRuleTree}
}

// Validate checks ranges.
func (s *SGLang) Validate() error {
	if !(s.CacheThreshold >= 0 && s.CacheThreshold <= 1) || s.BalanceAbs < 0 || s.BalanceRel < 1 {
		return errors.New("sglang_cache_aware: need cache_threshold in [0,1], balance_abs_threshold >= 0, balance_rel_threshold >= 1")
	}
	if s.Rule != SGLangRuleTree && s.Rule != SGLangRuleGateway {
		return fmt.Errorf("sglang_cache_aware: rule must be %q or %q, got %q", SGLangRuleTree, SGLangRuleGateway, s.Rule)
	}
	return nil
}

// Name implements kvcrouter.Strategy.
func (*SGLang) Name() string { return "sglang_cache_aware" }

// Score implements kvcrouter.Strategy. The router picks the top score (no
// sticky ids, no overload breakout for this peer), so Score records its
// own pick in the tree sizes, as sgl-router inserts the request text for
// the selected tenant.
func (s *SGLang) Score(req *kvcrouter.ScoreRequest, c []kvcrouter.Candidate, out []float64) {
	if len(c) == 0 {
		return
	}
	if s.size == nil {
		s.size = map[string]float64{}
	}
	minL, maxL := math.Inf(1), math.Inf(-1)
	best := 0.0
	for i := range c {
		l := float64(c[i].Inflight)
		minL, maxL = math.Min(minL, l), math.Max(maxL, l)
		best = math.Max(best, matchRatio(&c[i]))
	}
	// cache_aware.rs: is_imbalanced = (max - min) > abs && max > rel * min.
	imbalanced := maxL-minL > s.BalanceAbs && maxL > s.BalanceRel*minL
	useCache := !imbalanced && best > s.CacheThreshold
	for i := range c {
		l := float64(c[i].Inflight)
		switch {
		case useCache:
			// The ratio dominates; load (< 1e6 requests) only breaks ties.
			out[i] = matchRatio(&c[i])*1e6 - l
		case imbalanced || s.Rule == SGLangRuleGateway:
			out[i] = -l
		default:
			// Smallest tree; ties to the first (get_smallest_tenant scans
			// the tenants in order and keeps a strictly smaller one).
			out[i] = -s.size[c[i].ID]
		}
	}
	pick := 0
	for i := range out {
		if out[i] > out[pick] {
			pick = i
		}
	}
	// The insert adds the part of the prompt the tenant's tree lacked.
	if req != nil {
		s.size[c[pick].ID] += float64(len(req.Tokens)) * (1 - matchRatio(&c[pick]))
	}
}

func matchRatio(c *kvcrouter.Candidate) float64 {
	if c.HittableBlocks <= 0 {
		return 0
	}
	return float64(c.Hit.Blocks) / float64(c.HittableBlocks)
}

// LLMD is llm-d's weighted scorer sum, final = Σ w_k·score_k with each score
// in [0, 1], max-score picker with random tie-breaking. Upstream scorers:
// llm-d/llm-d-inference-scheduler pkg/epp/framework/plugins/scheduling/
// scorer/ (prefix, queue, kv-cache-utilization, session-affinity) and
// llm-d/llm-d-kv-cache docs/architecture.md (precise, tier-weighted):
//
//	prefix  = Σ_tier tier_weight·matched_blocks[tier] / total_blocks, both
//	          capped at MaxPrefixBlocks (0 = no cap; the approximate scorer
//	          hashes at most 256 blocks of the prompt); the precise scorer
//	          credits the longest consecutive prefix
//	queue   = (maxQ − q)/(maxQ − minQ), 1 when all equal; q = scraped waiting
//	          requests, router in-flight count without signals
//	kv      = 1 − kv_cache_usage, 1 − kvcrouter.Candidate.Load without
//	          signals
//	session = 1 for the server that served the session's previous request,
//	          else 0 (session-affinity scorer: a scorer, so load can
//	          override it)
//	no-hit  = no-hit-lru-scorer (scorer/nohitlru/no_hit_lru.go): 0.5 for
//	          every pod when any pod has a prefix hit; for a cold request,
//	          pods that never took a cold request first (1 − i/(n−1) in pod
//	          order), then the others from least to most recently used
//	active  = active-request-scorer (scorer/activerequest/active_request.go,
//	          defaults idleThreshold 0, maxBusyScore 1): 1 for a pod with no
//	          request in flight, else (maxCount − count)/maxCount
//
// With MinMax (the precise scorer), the prefix score is llm-d's
// indexedScoresToNormalizedScoredPods (scorer/preciseprefixcache/utils.go):
// the raw tier-weighted block count, min–max normalised over the pods that
// have one (> 0); 1 for all of them when they are equal; 0 for pods
// without a hit.
type LLMD struct {
	PrefixWeight    float64            `json:"prefix_weight"`
	QueueWeight     float64            `json:"queue_weight"`
	KVWeight        float64            `json:"kv_weight"`
	SessionWeight   float64            `json:"session_weight"`
	NoHitWeight     float64            `json:"no_hit_lru_weight"`
	ActiveWeight    float64            `json:"active_request_weight"`
	MinMax          bool               `json:"minmax_prefix"`
	MaxPrefixBlocks int                `json:"max_prefix_blocks"`
	TierWeights     map[string]float64 `json:"tier_weights"`
	Seed            uint64             `json:"seed"`
	name            string
	sig             Signals
	tier            [kvcrouter.NumTiers]float64
	rng             *rand.Rand
	q               []float64
	raw             []float64
	// lru lists the pods that took a cold request, least recently first.
	lru []string
}

// DefaultLLMDApprox is the built-in default profile
// (llm-d/llm-d guides/inference-scheduling/ inference-scheduling values;
// llm-d-inference-scheduler pkg/epp/server/options.go): approximate
// prefix 3, queue 2, kv-cache utilisation 2, at
// most 256 hashed blocks, GPU-only credit.
func DefaultLLMDApprox() LLMD {
	return LLMD{PrefixWeight: 3, QueueWeight: 2, KVWeight: 2, MaxPrefixBlocks: 256, TierWeights: map[string]float64{"gpu": 1}}
}

// DefaultLLMDPrecise is the precise sample
// (llm-d/llm-d-inference-scheduler deploy/config/
// epp-precise-prefix-cache-config.yaml): precise prefix 2 (gpu 1.0,
// cpu 0.8), kv-cache utilisation 1, queue 1, no block cap, min–max
// normalised prefix scores.
func DefaultLLMDPrecise() LLMD {
	return LLMD{PrefixWeight: 2, QueueWeight: 1, KVWeight: 1, MinMax: true,
		TierWeights: map[string]float64{"gpu": 1, "cpu": 0.8}}
}

// NewLLMD validates cfg and binds it to sig (may be nil: fall back to the
// candidates' own fields). name is the policy name it reports.
func NewLLMD(name string, cfg LLMD, sig Signals) (*LLMD, error) {
	l := cfg
	if l.PrefixWeight < 0 || l.QueueWeight < 0 || l.KVWeight < 0 || l.SessionWeight < 0 || l.MaxPrefixBlocks < 0 ||
		l.NoHitWeight < 0 || l.ActiveWeight < 0 {
		return nil, fmt.Errorf("%s: weights and max_prefix_blocks must not be negative", name)
	}
	tw, err := kvcrouter.TierWeights(name, l.TierWeights)
	if err != nil {
		return nil, err
	}
	l.tier, l.name, l.sig = tw, name, sig
	l.rng = rand.New(rand.NewPCG(l.Seed, 0x6c6c6d64))
	return &l, nil
}

// Name implements kvcrouter.Strategy.
func (l *LLMD) Name() string { return l.name }

// Score implements kvcrouter.Strategy.
func (l *LLMD) Score(req *kvcrouter.ScoreRequest, c []kvcrouter.Candidate, out []float64) {
	if cap(l.q) < len(c) {
		l.q = make([]float64, len(c))
	}
	q := l.q[:len(c)]
	minQ, maxQ := math.Inf(1), math.Inf(-1)
	for i := range c {
		q[i] = float64(c[i].Inflight)
		if l.sig != nil {
			if m, ok := l.sig.Metrics(c[i].ID); ok {
				q[i] = m.Waiting
			}
		}
		minQ, maxQ = math.Min(minQ, q[i]), math.Max(maxQ, q[i])
	}
	session := ""
	if l.SessionWeight > 0 && l.sig != nil {
		session, _ = l.sig.Session(req.ID)
	}
	if cap(l.raw) < len(c) {
		l.raw = make([]float64, len(c))
	}
	raw := l.raw[:len(c)]
	minR, maxR := math.Inf(1), math.Inf(-1)
	cold, maxCount := true, 0
	for i := range c {
		raw[i] = l.prefix(&c[i])
		if raw[i] > 0 {
			minR, maxR = math.Min(minR, raw[i]), math.Max(maxR, raw[i])
		}
		cold = cold && c[i].Hit.Blocks == 0
		maxCount = max(maxCount, c[i].Inflight)
	}
	noHit := l.noHitScores(c, cold)
	for i := range c {
		kv := 1 - c[i].Load
		if l.sig != nil {
			if m, ok := l.sig.Metrics(c[i].ID); ok && m.HasKVUsage {
				kv = 1 - m.KVUsage
			}
		}
		qs := 1.0
		if maxQ > minQ {
			qs = (maxQ - q[i]) / (maxQ - minQ)
		}
		ss := 0.0
		if session != "" && c[i].ID == session {
			ss = 1
		}
		ps := raw[i]
		if l.MinMax {
			ps = 0
			switch {
			case raw[i] <= 0:
			case maxR == minR:
				ps = 1
			default:
				ps = (raw[i] - minR) / (maxR - minR)
			}
		}
		as := 1.0
		if c[i].Inflight > 0 {
			as = float64(maxCount-c[i].Inflight) / float64(maxCount)
		}
		out[i] = l.PrefixWeight*ps + l.QueueWeight*qs + l.KVWeight*kv + l.SessionWeight*ss +
			l.NoHitWeight*noHit(i) + l.ActiveWeight*as
	}
	breakTies(l.rng, out)
	if l.NoHitWeight > 0 && cold {
		// PreRequest: the picked pod becomes the most recently used.
		pick := 0
		for i := range out {
			if out[i] > out[pick] {
				pick = i
			}
		}
		l.touch(c[pick].ID)
	}
}

// noHitScores returns the no-hit-lru score of candidate i.
func (l *LLMD) noHitScores(c []kvcrouter.Candidate, cold bool) func(int) float64 {
	if l.NoHitWeight == 0 || !cold || len(c) <= 1 {
		return func(int) float64 {
			if len(c) == 1 && cold {
				return 1
			}
			return 0.5
		}
	}
	pos := make(map[string]int, len(l.lru))
	for i, id := range l.lru {
		pos[id] = i
	}
	never := 0
	score := make([]float64, len(c))
	den := float64(len(c) - 1)
	for i := range c {
		if _, used := pos[c[i].ID]; !used {
			score[i] = 1 - float64(never)/den
			never++
		}
	}
	for i := range c {
		if p, used := pos[c[i].ID]; used {
			score[i] = math.Max(0, 1-float64(never+p)/den)
		}
	}
	return func(i int) float64 { return score[i] }
}

func (l *LLMD) touch(id string) {
	for i, x := range l.lru {
		if x == id {
			l.lru = append(l.lru[:i], l.lru[i+1:]...)
			break
		}
	}
	l.lru = append(l.lru, id)
}

// prefix is the prefix scorer's raw score: the tier-weighted matched
// fraction, or with MinMax the tier-weighted matched block count (min–max
// normalised across pods in Score).
func (l *LLMD) prefix(c *kvcrouter.Candidate) float64 {
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
	for t := range kvcrouter.NumTiers {
		n := min(c.Hit.Tier[t], left)
		s += l.tier[t] * float64(n)
		left -= n
	}
	if l.MinMax {
		return s
	}
	return math.Min(1, s/float64(total))
}

// breakTies lifts one of the top-scoring candidates, chosen uniformly at
// random, above the others, so that kvcrouter.Pick (which breaks ties by
// insertion order) picks a random one among equals, as llm-d's max-score
// picker and Dynamo's temperature-0 selector do.
func breakTies(rng *rand.Rand, out []float64) {
	best := math.Inf(-1)
	for _, s := range out {
		best = math.Max(best, s)
	}
	n := 0
	for _, s := range out {
		if s == best {
			n++
		}
	}
	if n < 2 {
		return
	}
	k := rng.IntN(n)
	for i, s := range out {
		if s == best {
			if k == 0 {
				out[i] = math.Nextafter(s, math.Inf(1))
				return
			}
			k--
		}
	}
}

// Dynamo is Dynamo's KV router cost, argmin (Score returns −cost), after
// ai-dynamo/dynamo lib/kv-router/src/scheduling/selector/default.rs and
// docs/components/router/router-configuration.md:
//
//	raw_prefill      = active_prefill_blocks + request_tokens / block_size
//	adjusted_prefill = max(raw_prefill − c·gpu_overlap − w_host·cpu_overlap
//	                       − w_disk·ssd_overlap, 0)
//	decode           = unique active blocks on the worker + the request's
//	                   blocks not already held by its active sequences
//	cost             = prefill_load_scale·adjusted_prefill + decode
//	                   + decode_active_request_weight·active_requests
//
// (the third term is Dynamo 1.6.1's, default 0; its agentic preset sets it to
// 64 with overlap credit 2 and prefill_load_scale 4). At temperature 0 the
// minimum cost wins and ties break at random. Worker figures come from
// Signals.Active; without signals both are estimated from the router's
// in-flight prompt tokens / BlockSize, with no sharing.
type Dynamo struct {
	OverlapCredit    float64 `json:"overlap_score_credit"`
	PrefillLoadScale float64 `json:"prefill_load_scale"`
	HostWeight       float64 `json:"host_cache_hit_weight"`
	DiskWeight       float64 `json:"disk_cache_hit_weight"`
	// ActiveRequestWeight charges each request the router has in flight on
	// the worker as that many blocks of decode.
	ActiveRequestWeight float64 `json:"decode_active_request_weight"`
	// PredictedTTLSecs is router_predicted_ttl_secs: how long the +ttl
	// variant's predicted blocks (its own routing decisions) live before a KV
	// event confirms them. Only the +ttl variant reads it.
	PredictedTTLSecs float64 `json:"router_predicted_ttl_secs"`
	// QueueThreshold is router_queue_threshold (0 = no router queue,
	// Dynamo's default None): requests wait in the router while every
	// worker's tracked prefill tokens exceed this fraction of its
	// max_num_batched_tokens. The bench driver runs the queue
	// (bench.Policy.QueueThreshold).
	QueueThreshold float64 `json:"router_queue_threshold"`
	// QueuePolicy is router_queue_policy: "fcfs" (Dynamo's default),
	// "lcfs", or "wspt" (1 / the prompt's tokens less the best overlap any
	// worker holds by the KV events seen, keyed when queued). The bench
	// driver orders the queue (bench.Policy.QueuePolicy).
	QueuePolicy string `json:"router_queue_policy"`
	BlockSize   int    `json:"block_size"`
	Seed        uint64 `json:"seed"`
	sig         Signals
	rng         *rand.Rand
}

// DefaultDynamo returns Dynamo's documented defaults (1.0, 1.0, 0.75, 0.25,
// no per-request decode charge) with vLLM's 16-token blocks, and the 5 s
// predicted-block lifetime the +ttl variant runs with.
func DefaultDynamo() Dynamo {
	return Dynamo{OverlapCredit: 1, PrefillLoadScale: 1, HostWeight: 0.75, DiskWeight: 0.25, PredictedTTLSecs: 5, BlockSize: 16}
}

// AgenticDynamo is Dynamo 1.6.1's agentic preset over DefaultDynamo: overlap
// credit 2, prefill_load_scale 4, decode_active_request_weight 64 (the
// values the arena's dynamo_kv_router+agentic gives the real router).
func AgenticDynamo() Dynamo {
	d := DefaultDynamo()
	d.OverlapCredit, d.PrefillLoadScale, d.ActiveRequestWeight = 2, 4, 64
	return d
}

// QueueDynamo is DefaultDynamo with the router queue on at threshold 1.0
// (router_queue_threshold; the arena's dynamo_kv_router+queue value),
// first come first served.
func QueueDynamo() Dynamo {
	d := DefaultDynamo()
	d.QueueThreshold, d.QueuePolicy = 1, "fcfs"
	return d
}

// NewDynamo validates cfg and binds it to sig (may be nil).
func NewDynamo(cfg Dynamo, sig Signals) (*Dynamo, error) {
	d := cfg
	if d.BlockSize <= 0 {
		return nil, errors.New("dynamo_cost: block_size must be > 0")
	}
	if d.OverlapCredit < 0 || d.PrefillLoadScale < 0 || d.HostWeight < 0 || d.DiskWeight < 0 || d.ActiveRequestWeight < 0 {
		return nil, errors.New("dynamo_cost: weights must not be negative")
	}
	if !(d.PredictedTTLSecs > 0 && d.PredictedTTLSecs <= 3600) {
		return nil, errors.New("dynamo_cost: router_predicted_ttl_secs must be in (0, 3600]")
	}
	if !(d.QueueThreshold >= 0 && d.QueueThreshold <= 1000) {
		return nil, errors.New("dynamo_cost: router_queue_threshold must be in [0, 1000] (0 = no queue)")
	}
	switch d.QueuePolicy {
	case "", "fcfs", "lcfs", "wspt":
	default:
		return nil, fmt.Errorf("dynamo_cost: router_queue_policy %q (allowed: fcfs, lcfs, wspt)", d.QueuePolicy)
	}
	d.sig = sig
	d.rng = rand.New(rand.NewPCG(d.Seed, 0x64796e61))
	return &d, nil
}

// Name implements kvcrouter.Strategy.
func (*Dynamo) Name() string { return "dynamo_cost" }

// Score implements kvcrouter.Strategy.
func (d *Dynamo) Score(req *kvcrouter.ScoreRequest, c []kvcrouter.Candidate, out []float64) {
	for i := range c {
		out[i] = -d.Cost(req, &c[i])
	}
	breakTies(d.rng, out)
}

// Cost returns the candidate's cost for req (lower is better).
func (d *Dynamo) Cost(req *kvcrouter.ScoreRequest, c *kvcrouter.Candidate) float64 {
	bs := float64(d.BlockSize)
	reqBlocks := float64(len(req.Tokens)) / bs
	est := float64(c.InflightTokens) / bs
	a := Active{PrefillBlocks: est, DecodeBlocks: est, NewBlocks: math.Ceil(reqBlocks)}
	if d.sig != nil {
		if v, ok := d.sig.Active(c.ID, req.ID); ok {
			a = v
		}
	}
	adj := a.PrefillBlocks + reqBlocks - d.OverlapCredit*float64(c.Hit.Tier[kvcrouter.TierGPU]) -
		d.HostWeight*float64(c.Hit.Tier[kvcrouter.TierCPU]) - d.DiskWeight*float64(c.Hit.Tier[kvcrouter.TierSSD])
	adj = math.Max(adj, 0)
	return d.PrefillLoadScale*adj + a.DecodeBlocks + a.NewBlocks + d.ActiveRequestWeight*float64(c.Inflight)
}
