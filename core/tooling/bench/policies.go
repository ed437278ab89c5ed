package bench

import (
	"fmt"
	"strings"

	json "github.com/goccy/go-json"

	"github.com/kvc-router/kvc-router/core/router"
)

// PolicyNames lists the policies kvbench knows, in report order.
var PolicyNames = []string{
	"round_robin", "random", "verl_default", "sglang_cache_aware", "llmd_weighted", "llmd_precise",
	"dynamo_cost", "kvc_aware", "kvc_aware_approx",
}

// ProposalNames are experimental policies, run only when named (none now:
// the kvc_aware_v2 proposal became kvc_aware).
var ProposalNames []string

// PolicyOptions parameterise policy construction.
type PolicyOptions struct {
	Seed      uint64
	BlockSize int
	// KVCParams overrides the kvc_aware strategy parameters (JSON object
	// with alpha, load_threshold, layer_weights); nil = project defaults.
	KVCParams json.RawMessage
	// KVCRouter, when set, edits the kvc_aware routers' configuration
	// (for prototyping router-level settings such as the speculation TTL).
	KVCRouter func(*router.Config)
	// V2Params overrides kvc_aware_v2 parameters (JSON object).
	V2Params json.RawMessage
}

func bptr(b bool) *bool { return &b }

// NewPolicy builds a named policy. Variants, from the reference:
//
//   - round_robin, random: load-blind; no request ids (no stickiness).
//   - verl_default: router default mode (verl's least in-flight + sticky
//     request_id), request ids passed.
//   - sglang_cache_aware: approximate index fed by routing decisions
//     (speculative insert on route, 120 s eviction, no capacity cap: SGLang's
//     tree is bounded only by max_tree_size), thresholds 0.3 / 64 / 1.5.
//   - llmd_weighted: llm-d's built-in default, approximate prefix (per-pod
//     LRU sized to num_gpu_blocks, no TTL, 256-block cap) 3 + queue 2 +
//     kv-utilisation 2, scraped metrics.
//   - llmd_precise: llm-d's precise sample, KV events + 2 s speculative
//     indexing, precise prefix 2 (gpu 1.0, cpu 0.8) + kv 1 + queue 1.
//   - dynamo_cost: Dynamo's default cost with KV events and its
//     predicted-TTL side index (5 s), router-local prefill/decode blocks,
//     no session affinity.
//   - kvc_aware: ours, KV events, sticky request ids.
//   - kvc_aware_approx: ours without events (speculative index only).
func NewPolicy(name string, o PolicyOptions) (Policy, error) {
	if o.BlockSize <= 0 {
		o.BlockSize = 16
	}
	params := func(v any) json.RawMessage {
		b, _ := json.Marshal(v)
		return b
	}
	one := func(n string, p json.RawMessage) []router.StrategySpec {
		return []router.StrategySpec{{Name: n, Weight: 1, Params: p}}
	}
	kvc := func(events bool) func(string) router.Config {
		return func(string) router.Config {
			c := router.Config{Mode: router.ModeKVCAware, EventsDefault: events, BlockSize: o.BlockSize}
			if events {
				c.Servers = uncapped(o.BlockSize)
			}
			if len(o.KVCParams) > 0 {
				c.Strategies = one("kvc_aware", o.KVCParams)
			}
			if o.KVCRouter != nil {
				o.KVCRouter(&c)
			}
			return c
		}
	}
	switch name {
	case "round_robin":
		return Policy{Name: name, Config: func(string) router.Config {
			return router.Config{Mode: router.ModeDefault, Strategies: one("round_robin", nil)}
		}}, nil
	case "random":
		return Policy{Name: name, Config: func(string) router.Config {
			return router.Config{Mode: router.ModeDefault, Strategies: one("random", params(map[string]any{"seed": o.Seed}))}
		}}, nil
	case "verl_default":
		return Policy{Name: name, StickyIDs: true, Config: func(string) router.Config {
			return router.Config{Mode: router.ModeDefault}
		}}, nil
	case "sglang_cache_aware":
		return Policy{Name: name, Config: func(string) router.Config {
			return router.Config{Mode: router.ModeKVCAware, BlockSize: o.BlockSize, EventsDefault: false,
				Speculate: bptr(true), StickyOverload: bptr(false), Strategies: one("sglang_cache_aware", nil),
				Index: router.IndexSpec{ApproxTTLMS: 120_000}, Servers: uncapped(o.BlockSize)}
		}}, nil
	case "llmd_weighted":
		return Policy{Name: name, Config: func(sig string) router.Config {
			return router.Config{Mode: router.ModeKVCAware, BlockSize: o.BlockSize, EventsDefault: false,
				Speculate: bptr(true), StickyOverload: bptr(false),
				Strategies: one("llmd_weighted", params(map[string]any{"signals": sig, "seed": o.Seed})),
				Index:      router.IndexSpec{ApproxTTLMS: 1000 * 86400}}
		}}, nil
	case "llmd_precise":
		return Policy{Name: name, Events: true, Config: func(sig string) router.Config {
			return router.Config{Mode: router.ModeKVCAware, BlockSize: o.BlockSize, EventsDefault: true,
				Speculate: bptr(true), StickyOverload: bptr(false),
				Strategies: one("llmd_precise", params(map[string]any{"signals": sig, "seed": o.Seed})),
				Index:      router.IndexSpec{SpecTTLMS: 2000}, Servers: uncapped(o.BlockSize)}
		}}, nil
	case "dynamo_cost":
		return Policy{Name: name, Events: true, Config: func(sig string) router.Config {
			return router.Config{Mode: router.ModeKVCAware, BlockSize: o.BlockSize, EventsDefault: true,
				Speculate: bptr(true), StickyOverload: bptr(false),
				Strategies: one("dynamo_cost", params(map[string]any{"signals": sig, "block_size": o.BlockSize})),
				Index:      router.IndexSpec{SpecTTLMS: 5000}, Servers: uncapped(o.BlockSize)}
		}}, nil
	case "kvc_aware":
		return Policy{Name: name, StickyIDs: true, Events: true, Config: kvc(true)}, nil
	case "kvc_aware_approx":
		return Policy{Name: name, StickyIDs: true, Config: kvc(false)}, nil
	}
	return Policy{}, fmt.Errorf("unknown policy %q (known: %s)", name, strings.Join(append(PolicyNames, ProposalNames...), ", "))
}

// uncapped gives servers a record capacity no workload reaches. For
// SGLang's approximate tree this leaves residency to the TTL (its eviction
// timer). For event-fed servers it works around an index behaviour: the
// router caps every server's records at num_gpu_blocks, so once an engine's
// cache is full each speculative record evicts a confirmed one, whose bridge
// entry is lost; later BlockStored events naming it as parent are then
// dropped as unanchored (measured: ~40% of stored blocks on a full engine).
// Events remove blocks authoritatively, so no cap is needed there.
func uncapped(int) map[string]router.ServerSpec {
	m := map[string]router.ServerSpec{}
	for i := 0; i < 256; i++ {
		m[fmt.Sprintf("engine-%d", i)] = router.ServerSpec{Capacity: 1 << 22}
	}
	return m
}
