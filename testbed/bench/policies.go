package bench

import (
	"bytes"
	"fmt"
	"github.com/kvc-router/kvc-router/core/kvcrouter"
	"strings"

	json "github.com/goccy/go-json"

	"github.com/kvc-router/kvc-router/testbed/peers"
)

// PolicyNames lists the policies kvbench knows, in report order. A name
// with a "+suffix" is a variant of the policy before the "+".
var PolicyNames = []string{
	"round_robin", "random", "verl_default", "verl_default_090",
	"vllm_router_sticky_least_loaded", "vllm_router_sticky_least_loaded+nofinish",
	"smg_cache_aware",
	"sglang_cache_aware", "sglang_cache_aware+gateway",
	"llmd_weighted", "llmd_weighted+nohit", "llmd_precise", "llmd_precise+spec", "llmd_precise+session",
	"llmd_precise+nohit", "llmd_precise+active",
	"dynamo_cost", "dynamo_cost+ttl", "dynamo_cost+session", "dynamo_cost+agentic", "dynamo_cost+queue",
	"kvc_aware", "kvc_aware+admit", "kvc_aware+noadmit", "kvc_aware_approx",
	"kvc_aware+lengths", "kvc_aware+admit+lengths", "kvc_aware+admit+truelen",
	"kvc_aware+admit+engine_queue", "kvc_aware+admit+lengths+engine_queue",
	"kvc_aware+evlengths", "kvc_aware+admit+evlengths",
	"kvc_aware+work+lengths", "kvc_aware+work+truelen", "kvc_aware+admit+work+truelen",
	"longest_lane+truelen",
}

// DefaultPolicies is what kvbench runs when no policy is named: every
// system at its upstream defaults, its shipped variants (sgl-model-gateway's
// rule, llm-d's no-hit-lru and active-request scorers, Dynamo's predicted
// TTL), plus ours.
var DefaultPolicies = []string{
	"round_robin", "verl_default", "sglang_cache_aware", "sglang_cache_aware+gateway",
	"llmd_weighted", "llmd_weighted+nohit", "llmd_precise", "llmd_precise+nohit", "llmd_precise+active",
	"dynamo_cost", "dynamo_cost+ttl", "kvc_aware",
}

// PolicyOptions parameterise policy construction.
type PolicyOptions struct {
	Seed      uint64
	BlockSize int
	// Params overrides a policy's main parameters, keyed by base policy
	// name (before any "+variant"; variants share their base's
	// parameters). The JSON object is decoded strictly over the policy's
	// defaults: kvc_aware's strategy parameters, peers.SGLang,
	// peers.LLMD or peers.Dynamo fields.
	Params map[string]json.RawMessage
	// KVCRouter, when set, edits the kvc_aware routers' configuration.
	KVCRouter func(*kvcrouter.RouterConfig)
	// Turns is kvc_aware's router "turns" setting, as verl's hook sets it
	// from the rollout config a workload like this one runs under
	// (TurnsFor); "" = auto.
	Turns string
	// ResponseTokens is kvc_aware's router "response_tokens", as verl's
	// hook sets it from rollout.response_length (the workload's longest
	// response); 0 = not said.
	ResponseTokens int
	// Admission runs kvc_aware's routers with router-side admission without
	// +admit where verl's hook does at the defaults (admission.enabled:
	// auto, the async balancer; kvcrouter.AdmissionDefault: not for a
	// multi-turn rollout, Turns); +noadmit turns it off there (the
	// synchronous KVCAwareBalancer). kvbench sets it from a freeze.
	Admission bool
	// SessionMoveTokens is kvc_aware's router session_move_tokens (nil: the
	// library's default); kvbench sets it from a freeze, 0 for freezes from
	// before it.
	SessionMoveTokens *float64
}

// TurnsFor is what verl's hook tells kvc_aware (router "turns") for a
// workload: agent loops run with rollout.multi_turn.enable, GRPO without
// it; a chat trace is no verl rollout (auto).
func TurnsFor(workload string) string {
	switch {
	case strings.HasPrefix(workload, "agent"):
		return kvcrouter.TurnsMulti
	case strings.HasPrefix(workload, "grpo"):
		return kvcrouter.TurnsSingle
	}
	return kvcrouter.TurnsAuto
}

// LLMDScrapeInterval is llm-d's metrics refresh period in seconds
// (llm-d-inference-scheduler pkg/epp/datalayer/runtime.go,
// --refresh-metrics-interval 50 ms).
const LLMDScrapeInterval = 0.05

// SMGLoadInterval is SMG's load poll period in seconds (smg 1.13.0
// router_args.py load_monitor_interval 10), which feeds its worker
// overload protection.
const SMGLoadInterval = 10

// SGLangMaxTreeSize is SGLang's per-worker tree budget in characters
// (launcher default max_tree_size 2^26; sgl-router/src/tree.rs evicts LRU
// leaves beyond it).
const SGLangMaxTreeSize = 1 << 26

// charsPerToken converts SGLang's character tree budget to tokens (the
// ratio llm-d's approximate scorer also assumes for English text).
const charsPerToken = 4

// BaseName is the policy name before any "+variant".
func BaseName(name string) string {
	b, _, _ := strings.Cut(name, "+")
	return b
}

func bptr(b bool) *bool { return &b }

func decodeOver(name string, raw json.RawMessage, v any) error {
	if len(raw) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("policy %s parameters: %w", name, err)
	}
	return nil
}

// NewPolicy builds a named policy. Variants (upstream in brackets):
//
//   - round_robin, random: load-blind; no request ids (no stickiness).
//   - verl_default: verl 0.9.1's GlobalRequestLoadBalancer: sticky
//     request_id (the router's default mode), else the fewest in-flight,
//     ties by random.choice replayed with a seeded CPython generator
//     (peers.VerlLeastLoaded) [verl/workers/rollout/router.py, PR #7613].
//     verl_default_090: verl 0.9.0's first-added tie-break
//     [verl/workers/rollout/llm_server.py].
//   - vllm_router_sticky_least_loaded: vllm-router 0.1.17's
//     sticky_least_loaded (new session to the replica with the fewest
//     active sessions, sticky after), the client finishing each
//     trajectory (/finish_session) [src/policies/sticky_least_loaded.rs].
//     +nofinish: a client that never calls it (sessions count until the
//     2 h idle expiry).
//   - smg_cache_aware: smg 1.13.0's cache_aware at launcher defaults,
//     with its default worker overload protection (peers.SMG)
//     [model_gateway/src/policies/cache_aware.rs].
//   - sglang_cache_aware: approximate index fed by routing decisions
//     (insert on route), thresholds 0.3 / 64 / 1.5, size-based LRU
//     eviction at max_tree_size (2^26 characters ≈ 2^24 tokens per worker),
//     no time-based expiry; below the cache threshold the smallest tree
//     wins [sgl-router/src/policies/cache_aware.rs, tree.rs]. +gateway: the
//     least loaded server wins instead
//     [sgl-model-gateway/src/policies/cache_aware.rs; the sglang-router
//     wheels the arena runs].
//   - llmd_weighted: llm-d's built-in default, approximate prefix (per-pod
//     LRU sized to num_gpu_blocks, no TTL, 256-block cap) 3 + queue 2 +
//     kv-utilisation 2, metrics every 50 ms.
//   - llmd_precise: llm-d's precise sample: KV events, speculative
//     indexing off, precise prefix 2 (gpu 1.0, cpu 0.8) + kv 1 + queue 1,
//     metrics every 50 ms [deploy/config/epp-precise-prefix-cache-config.yaml].
//     +spec: speculative indexing on (2 s TTL) as llm-d's guide enables it.
//     +session: plus the session-affinity scorer at twice the prefix
//     weight (the 100 : 50 of deploy/config/session-affinity-config.yaml).
//     +nohit: plus the no-hit-lru scorer at half the prefix weight (the
//     2 : 1 of the scorer's documented precise example). +active: plus the
//     active-request scorer at the queue scorer's weight (1; no shipped
//     profile weights it).
//   - llmd_weighted+nohit: the optimized-baseline profile (approximate
//     prefix 3, queue 2, kv-cache utilisation 2, no-hit-lru 2; llm-d-router's
//     well-known "optimized-baseline" EndpointPickerConfig).
//   - dynamo_cost: Dynamo's default cost with KV events, router-local
//     active blocks deduplicated per worker, random tie-break, no session
//     affinity, no predicted-TTL side index
//     [lib/kv-router/src/scheduling/selector/default.rs]. +ttl: the 5 s
//     predicted-TTL side index (--router-predicted-ttl-secs 5). +session:
//     session → worker binding with no load breakout
//     (--router-session-affinity-ttl-secs). +agentic: the 1.6.1 agentic
//     preset. +queue: the router queue at --router-queue-threshold 1.0,
//     first come first served (lib/kv-router/src/queue.rs; the driver
//     holds requests while every worker's tracked prefill tokens exceed
//     the threshold x max_num_batched_tokens).
//   - kvc_aware: ours, KV events, sticky request ids, releases that report
//     output tokens (the verl hook's, which kvc-router's verl integration
//     installs; the defaults read them only to measure the length
//     correlation group_spread_min_corr gates on).
//   - kvc_aware+admit: ours with router-side admission (kvcrouter.AdmissionSpec:
//     hold requests while every engine runs max_num_seqs, late binding).
//     With PolicyOptions.Admission (a freeze whose defaults run admission,
//     as verl's hook does) every kvc_aware row runs it; kvc_aware+noadmit
//     is then the synchronous balancer's routing alone.
//   - kvc_aware_approx: ours without events (speculative index only).
//   - kvc_aware+lengths, kvc_aware+admit+lengths: ours learning response
//     lengths from releases that report output tokens (router.LengthsSpec;
//     the verl hook forwards them); with admission, longest predicted first.
//   - kvc_aware+admit+truelen: a reference row, not a policy: admission
//     longest-first with every request's true length as its hint.
//   - kvc_aware+admit+engine_queue, kvc_aware+admit+lengths+engine_queue:
//     the same with admission.engine_queue 1 (a server whose engine is
//     queuing takes no held request).
//   - kvc_aware+work+lengths: placement by predicted work (work_weight 1
//     unless the parameters set it: each server's load counts the learnt
//     output of its in-flight requests with their prompts), learning from
//     the client's counts. kvc_aware+work+truelen and
//     kvc_aware+admit+work+truelen are its reference rows: the same
//     placement (and admission's order) with every true length known.
//   - longest_lane+truelen: a reference row, not a policy: every true
//     length known, the longest responses pinned to one engine whose
//     other work is capped (LaneSpec says why); parameters "longest_lane".
//     Made for GRPO steps: every request is pinned on its own, so an
//     agent's turns would not follow their session.
func NewPolicy(name string, o PolicyOptions) (Policy, error) {
	if o.BlockSize <= 0 {
		o.BlockSize = 16
	}
	base := BaseName(name)
	raw := o.Params[base]
	known := false
	for _, n := range PolicyNames {
		known = known || n == name
	}
	if !known {
		return Policy{}, fmt.Errorf("unknown policy %q (known: %s)", name, strings.Join(PolicyNames, ", "))
	}
	switch base {
	case "round_robin", "random", "verl_default", "verl_default_090", "vllm_router_sticky_least_loaded":
		if len(raw) > 0 {
			return Policy{}, fmt.Errorf("policy %s takes no parameters", base)
		}
	}
	seed := o.Seed
	switch name {
	case "round_robin":
		return Policy{Name: name, Config: func(peers.Signals) kvcrouter.RouterConfig {
			return kvcrouter.RouterConfig{Mode: kvcrouter.ModeDefault, Strategy: &peers.RoundRobin{}}
		}}, nil
	case "random":
		return Policy{Name: name, Config: func(peers.Signals) kvcrouter.RouterConfig {
			return kvcrouter.RouterConfig{Mode: kvcrouter.ModeDefault, Strategy: peers.NewRandom(seed)}
		}}, nil
	case "verl_default", "verl_default_090":
		// verl 0.9.1: ties to random.choice (seeded); 0.9.0: to the first.
		first := name == "verl_default_090"
		return Policy{Name: name, StickyIDs: true, Config: func(peers.Signals) kvcrouter.RouterConfig {
			return kvcrouter.RouterConfig{Mode: kvcrouter.ModeDefault, Strategy: peers.NewVerlLeastLoaded(seed, first)}
		}}, nil
	case "vllm_router_sticky_least_loaded", "vllm_router_sticky_least_loaded+nofinish":
		// Sessions are the workload's request_ids (a trajectory; a GRPO
		// sample); the router's sticky table keeps a session on its replica.
		return Policy{Name: name, StickyIDs: true, FinishSessions: name == "vllm_router_sticky_least_loaded",
			Config: func(peers.Signals) kvcrouter.RouterConfig {
				return kvcrouter.RouterConfig{Mode: kvcrouter.ModeDefault, Strategy: peers.NewStickyLeastLoaded()}
			}}, nil
	case "smg_cache_aware":
		s := peers.DefaultSMG()
		s.Seed = seed
		if err := decodeOver(name, raw, &s); err != nil {
			return Policy{}, err
		}
		if _, err := peers.NewSMG(s, nil); err != nil {
			return Policy{}, err
		}
		capBlocks := SGLangMaxTreeSize / charsPerToken / o.BlockSize
		// Loads polled every load_monitor_interval (10 s) for the overload veto.
		return Policy{Name: name, Scrape: SMGLoadInterval, Config: func(sig peers.Signals) kvcrouter.RouterConfig {
			st, _ := peers.NewSMG(s, sig)
			return kvcrouter.RouterConfig{Mode: kvcrouter.ModeKVCAware, BlockSize: o.BlockSize, EventsDefault: false,
				Speculate: bptr(true), StickyOverload: bptr(false), SessionMoves: bptr(false), Strategy: st,
				Index: kvcrouter.IndexSpec{ApproxTTLMS: 1000 * 86400}, Servers: servers(kvcrouter.ServerSpec{Capacity: capBlocks})}
		}}, nil
	case "sglang_cache_aware", "sglang_cache_aware+gateway":
		s := peers.DefaultSGLang()
		if name == "sglang_cache_aware+gateway" {
			s.Rule = peers.SGLangRuleGateway
		}
		if err := decodeOver(name, raw, &s); err != nil {
			return Policy{}, err
		}
		if err := s.Validate(); err != nil {
			return Policy{}, err
		}
		capBlocks := SGLangMaxTreeSize / charsPerToken / o.BlockSize
		return Policy{Name: name, Config: func(peers.Signals) kvcrouter.RouterConfig {
			st := s // a fresh tree-size record per run
			return kvcrouter.RouterConfig{Mode: kvcrouter.ModeKVCAware, BlockSize: o.BlockSize, EventsDefault: false,
				Speculate: bptr(true), StickyOverload: bptr(false), SessionMoves: bptr(false), Strategy: &st,
				// Residency ends only by size: an expiry far beyond any run.
				Index: kvcrouter.IndexSpec{ApproxTTLMS: 1000 * 86400}, Servers: servers(kvcrouter.ServerSpec{Capacity: capBlocks})}
		}}, nil
	case "llmd_weighted", "llmd_weighted+nohit", "llmd_precise", "llmd_precise+spec", "llmd_precise+session",
		"llmd_precise+nohit", "llmd_precise+active":
		l := peers.DefaultLLMDPrecise()
		if base == "llmd_weighted" {
			l = peers.DefaultLLMDApprox()
		}
		switch name {
		case "llmd_weighted+nohit":
			l.NoHitWeight = 2
		case "llmd_precise+nohit":
			l.NoHitWeight = l.PrefixWeight / 2
		case "llmd_precise+active":
			l.ActiveWeight = 1
		}
		l.Seed = seed
		if err := decodeOver(name, raw, &l); err != nil {
			return Policy{}, err
		}
		if name == "llmd_precise+session" && l.SessionWeight == 0 {
			l.SessionWeight = 2 * l.PrefixWeight
		}
		if _, err := peers.NewLLMD(name, l, nil); err != nil {
			return Policy{}, err
		}
		p := Policy{Name: name, Scrape: LLMDScrapeInterval, Sessions: l.SessionWeight > 0}
		if base == "llmd_weighted" {
			p.Config = func(sig peers.Signals) kvcrouter.RouterConfig {
				st, _ := peers.NewLLMD(name, l, sig)
				// Per-pod LRU sized from num_gpu_blocks (the router caps an
				// approximate server at its metrics' block count), no TTL.
				return kvcrouter.RouterConfig{Mode: kvcrouter.ModeKVCAware, BlockSize: o.BlockSize, EventsDefault: false,
					Speculate: bptr(true), StickyOverload: bptr(false), SessionMoves: bptr(false), Strategy: st,
					Index: kvcrouter.IndexSpec{ApproxTTLMS: 1000 * 86400}}
			}
			return p, nil
		}
		spec := name == "llmd_precise+spec"
		p.Events = true
		p.Config = func(sig peers.Signals) kvcrouter.RouterConfig {
			st, _ := peers.NewLLMD(name, l, sig)
			c := kvcrouter.RouterConfig{Mode: kvcrouter.ModeKVCAware, BlockSize: o.BlockSize, EventsDefault: true,
				Speculate: bptr(spec), StickyOverload: bptr(false), SessionMoves: bptr(false), Strategy: st, Servers: uncapped()}
			if spec {
				c.Index.SpecTTLMS = 2000
			}
			return c
		}
		return p, nil
	case "dynamo_cost", "dynamo_cost+ttl", "dynamo_cost+session", "dynamo_cost+agentic", "dynamo_cost+queue":
		d := peers.DefaultDynamo()
		switch name {
		case "dynamo_cost+agentic":
			d = peers.AgenticDynamo()
		case "dynamo_cost+queue":
			d = peers.QueueDynamo()
		}
		d.BlockSize = o.BlockSize
		d.Seed = seed
		if err := decodeOver(name, raw, &d); err != nil {
			return Policy{}, err
		}
		if _, err := peers.NewDynamo(d, nil); err != nil {
			return Policy{}, err
		}
		ttl := name == "dynamo_cost+ttl"
		return Policy{Name: name, Events: true, StickyIDs: name == "dynamo_cost+session", ActiveBlocks: true,
			QueueThreshold: d.QueueThreshold, QueuePolicy: d.QueuePolicy, QueueTierWeights: [2]float64{d.HostWeight, d.DiskWeight},
			Config: func(sig peers.Signals) kvcrouter.RouterConfig {
				st, _ := peers.NewDynamo(d, sig)
				// Every peer runs on kvc-router's index and sticky table with
				// kvc_aware's own rules off: no sticky breakout, no session
				// moves (+session's bindings hold as Dynamo's do).
				c := kvcrouter.RouterConfig{Mode: kvcrouter.ModeKVCAware, BlockSize: o.BlockSize, EventsDefault: true,
					Speculate: bptr(ttl), StickyOverload: bptr(false), SessionMoves: bptr(false), Strategy: st, Servers: uncapped()}
				if ttl {
					c.Index.SpecTTLMS = int(d.PredictedTTLSecs * 1000)
				}
				return c
			}}, nil
	case "longest_lane+truelen":
		spec := DefaultLane()
		if err := decodeOver(name, raw, &spec); err != nil {
			return Policy{}, err
		}
		if err := spec.Validate(); err != nil {
			return Policy{}, err
		}
		// Every request carries a pin, so the strategy is never consulted.
		return Policy{Name: name, Lane: &spec, Config: func(peers.Signals) kvcrouter.RouterConfig {
			return kvcrouter.RouterConfig{Mode: kvcrouter.ModeDefault, Strategy: &peers.RoundRobin{}}
		}}, nil
	case "kvc_aware", "kvc_aware+admit", "kvc_aware+noadmit", "kvc_aware_approx", "kvc_aware+lengths", "kvc_aware+admit+lengths",
		"kvc_aware+evlengths", "kvc_aware+admit+evlengths",
		"kvc_aware+admit+truelen", "kvc_aware+work+lengths", "kvc_aware+work+truelen", "kvc_aware+admit+work+truelen",
		"kvc_aware+admit+engine_queue", "kvc_aware+admit+lengths+engine_queue":
		if strings.Contains(name, "+work") {
			k := kvcrouter.DefaultKVCAware()
			if err := decodeOver(name, raw, &k); err != nil {
				return Policy{}, err
			}
			if k.WorkWeight == 0 {
				k.WorkWeight = 1
			}
			b, err := json.Marshal(k)
			if err != nil {
				return Policy{}, err
			}
			raw = b
		}
		if len(raw) > 0 {
			// Validate now, so a bad parameter fails before any run.
			k := kvcrouter.DefaultKVCAware()
			if err := decodeOver(name, raw, &k); err != nil {
				return Policy{}, err
			}
			if err := k.Validate(); err != nil {
				return Policy{}, err
			}
		}
		events := base == "kvc_aware"
		// verl's weight-update hook resets kvc-router's index
		// (reset_prefix_index); no peer has such an API.
		return Policy{Name: name, StickyIDs: true, Events: events, ResetIndexOnUpdate: true,
			OutputCounts: strings.Contains(name, "+lengths") || name == "kvc_aware" || name == "kvc_aware+admit" || name == "kvc_aware+noadmit" || name == "kvc_aware_approx" ||
				name == "kvc_aware+admit+engine_queue",
			TrueLengths: strings.HasSuffix(name, "+truelen"),
			Config: func(peers.Signals) kvcrouter.RouterConfig {
				c := kvcrouter.RouterConfig{Mode: kvcrouter.ModeKVCAware, EventsDefault: events, BlockSize: o.BlockSize, Turns: o.Turns, ResponseTokens: o.ResponseTokens,
					SessionMoveTokens: o.SessionMoveTokens}
				c.Admission.Enabled = strings.Contains(name, "+admit") ||
					!strings.HasSuffix(name, "+noadmit") && kvcrouter.AdmissionDefault(kvcrouter.ModeKVCAware, o.Turns, o.Admission)
				if strings.HasSuffix(name, "+engine_queue") {
					c.Admission.EngineQueue = 1
				}
				// +evlengths: learning on, but the client reports no counts
				// (verl without the hook): the router reads them off the
				// KV events, else the times.
				c.Lengths.Enabled = strings.Contains(name, "+lengths") || strings.HasSuffix(name, "+evlengths") ||
					strings.HasSuffix(name, "+truelen")
				if events {
					c.Servers = uncapped()
				}
				if len(raw) > 0 {
					c.Strategies = []kvcrouter.StrategySpec{{Name: "kvc_aware", Weight: 1, Params: raw}}
				}
				if o.KVCRouter != nil {
					o.KVCRouter(&c)
				}
				return c
			}}, nil
	}
	return Policy{}, fmt.Errorf("unknown policy %q", name)
}

// servers gives every engine name the driver uses the same spec.
func servers(s kvcrouter.ServerSpec) map[string]kvcrouter.ServerSpec {
	m := map[string]kvcrouter.ServerSpec{}
	for i := 0; i < 256; i++ {
		m[fmt.Sprintf("engine-%d", i)] = s
	}
	return m
}

// uncapped gives event-fed servers a record capacity no workload reaches.
// The router caps every server's records at num_gpu_blocks otherwise, so
// once an engine's cache is full each speculative record evicts a
// confirmed one, whose bridge entry is lost; later BlockStored events
// naming it as parent are then dropped as unanchored (measured: ~40% of
// stored blocks on a full engine). Events remove blocks authoritatively,
// so no cap is needed there.
func uncapped() map[string]kvcrouter.ServerSpec {
	return servers(kvcrouter.ServerSpec{Capacity: 1 << 22})
}
