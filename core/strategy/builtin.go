package strategy

import (
	"math"

	json "github.com/goccy/go-json"

	"github.com/kvc-router/kvc-router/core/index"
	"github.com/kvc-router/kvc-router/core/strictjson"
)

func init() {
	Register("least_inflight", func(p json.RawMessage) (Strategy, error) {
		var v struct{}
		if err := DecodeStrict(p, &v); err != nil {
			return nil, err
		}
		return LeastInflight{}, nil
	})
	Register("kvc_aware", func(p json.RawMessage) (Strategy, error) {
		k := DefaultKVCAware()
		if err := DecodeStrict(p, &k); err != nil {
			return nil, err
		}
		if err := k.Validate(); err != nil {
			return nil, err
		}
		return &k, nil
	})
}

// LeastInflight reproduces verl's default balancer: the fewest local
// in-flight requests wins; ties go to the server added first.
type LeastInflight struct{}

// Name implements Strategy.
func (LeastInflight) Name() string { return "least_inflight" }

// Score implements Strategy.
func (LeastInflight) Score(_ *Request, c []Candidate, out []float64) {
	for i := range c {
		out[i] = -float64(c[i].Inflight)
	}
}

// KVCAware combines prefix-cache credit per tier with load:
//
//	S_cache = sum over tiers of layer_weights[tier] * credited_blocks[tier] / hittable_blocks
//	S       = alpha * S_cache + (1 - alpha) * (1 - load)
//
// and a server whose load exceeds LoadThreshold has 1 subtracted, so it is
// chosen only when every candidate is overloaded. Three refinements, each
// measured with kvbench and the demo, keep cache affinity
// from piling work onto one server:
//
//   - Marginal credit (marginal): only blocks beyond the smallest match
//     among the candidates earn credit. A shared system prompt that every
//     server holds, or that one busy server holds, otherwise pulls every
//     new request to the same place.
//   - KV-pressure load (token_load): load is at least the server's
//     in-flight prompt tokens over its KV capacity (from its metrics, else
//     kv_tokens), not capped at 1, so that long prompts over-committing one
//     server's cache show as load even while its running count is low, and
//     servers still rank when all are over-committed.
//   - Saved-token scale (saved_scale_tokens): the credit is multiplied by
//     min(1, saved tokens / saved_scale_tokens); a small hit is worth a few
//     milliseconds of prefill and must not outweigh load.
//
// A prompt with no hittable block scores on load alone.
type KVCAware struct {
	Alpha            float64            `json:"alpha"`
	LoadThreshold    float64            `json:"load_threshold"`
	LayerWeights     map[string]float64 `json:"layer_weights"`
	Marginal         bool               `json:"marginal"`
	TokenLoad        bool               `json:"token_load"`
	KVTokens         int                `json:"kv_tokens"`
	SavedScaleTokens int                `json:"saved_scale_tokens"`
	tier             [index.NumTiers]float64
}

// DefaultKVCAware returns the documented defaults.
func DefaultKVCAware() KVCAware {
	return KVCAware{
		Alpha: 0.3, LoadThreshold: 0.9, LayerWeights: map[string]float64{"gpu": 0.7, "cpu": 0.2, "ssd": 0.1},
		Marginal: true, TokenLoad: true, KVTokens: DefaultKVTokens, SavedScaleTokens: 4096,
	}
}

// Validate checks ranges and resolves tier weights. Errors are
// *strictjson.KeyError naming the parameter.
func (k *KVCAware) Validate() error {
	if !(k.Alpha >= 0 && k.Alpha <= 1) {
		return strictjson.Errorf("alpha", "must be in [0, 1], got %v", k.Alpha)
	}
	if !(k.LoadThreshold > 0 && k.LoadThreshold <= 1) {
		return strictjson.Errorf("load_threshold", "must be in (0, 1], got %v", k.LoadThreshold)
	}
	if k.KVTokens <= 0 {
		return strictjson.Errorf("kv_tokens", "must be > 0, got %d", k.KVTokens)
	}
	if k.SavedScaleTokens < 0 {
		return strictjson.Errorf("saved_scale_tokens", "must be >= 0 (0 disables), got %d", k.SavedScaleTokens)
	}
	tw, err := TierWeights("layer_weights", k.LayerWeights)
	if err != nil {
		return err
	}
	k.tier = tw
	return nil
}

// Name implements Strategy.
func (k *KVCAware) Name() string { return "kvc_aware" }

// Threshold is the overload bound used for sticky breakout.
func (k *KVCAware) Threshold() float64 { return k.LoadThreshold }

// Score implements Strategy.
func (k *KVCAware) Score(req *Request, c []Candidate, out []float64) {
	var base [index.NumTiers]int
	if k.Marginal && len(c) > 1 {
		base = c[0].Hit.Tier
		for i := range c {
			for t := range index.NumTiers {
				base[t] = min(base[t], c[i].Hit.Tier[t])
			}
		}
	}
	for i := range c {
		out[i] = k.score(req, &c[i], &base)
	}
}

func (k *KVCAware) score(req *Request, c *Candidate, base *[index.NumTiers]int) float64 {
	var cache float64
	if c.HittableBlocks > 0 {
		n := float64(c.HittableBlocks)
		saved := 0
		for t := range index.NumTiers {
			b := c.Hit.Tier[t] - base[t]
			cache += k.tier[t] * float64(b) / n
			saved += b
		}
		if k.SavedScaleTokens > 0 && len(req.Tokens) > 0 {
			tokens := float64(saved) * float64(len(req.Tokens)) / float64(c.HittableBlocks+1)
			cache *= math.Min(1, tokens/float64(k.SavedScaleTokens))
		}
	}
	load := k.EffectiveLoad(c)
	s := k.Alpha*cache + (1-k.Alpha)*(1-load)
	if load > k.LoadThreshold {
		s--
	}
	return s
}

// DefaultKVTokens is the KV capacity assumed for a server whose metrics do
// not report one: 30,000 blocks of 16 tokens, an 8B model on an 80 GB GPU.
const DefaultKVTokens = 480_000

func tokenLoad(c *Candidate, fallback int) float64 {
	capacity := c.KVCapacityTokens
	if capacity <= 0 {
		capacity = fallback
	}
	return math.Max(c.Load, float64(c.InflightTokens)/float64(capacity))
}

// EffectiveLoad implements LoadMeasure: the load kvc_aware scores with, so
// the router's sticky breakout and the overload penalty in Score agree. With
// token_load it is at least the in-flight prompt tokens over the server's KV
// capacity (kv_tokens when its metrics report none); without, the load
// store's figure.
func (k *KVCAware) EffectiveLoad(c *Candidate) float64 {
	if k.TokenLoad {
		return tokenLoad(c, k.KVTokens)
	}
	return c.Load
}

// TierWeights parses a {gpu, cpu, ssd} weight map; errors are
// *strictjson.KeyError under the key name.
func TierWeights(name string, m map[string]float64) ([index.NumTiers]float64, error) {
	var out [index.NumTiers]float64
	for k, w := range m {
		var t index.Tier
		switch k {
		case "gpu":
			t = index.GPU
		case "cpu":
			t = index.CPU
		case "ssd":
			t = index.SSD
		default:
			return out, strictjson.Errorf(name+"."+k, "unknown tier (allowed: gpu, cpu, ssd)")
		}
		if !(w >= 0 && w <= 1) {
			return out, strictjson.Errorf(name+"."+k, "must be in [0, 1], got %v", w)
		}
		out[t] = w
	}
	return out, nil
}
