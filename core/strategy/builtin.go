package strategy

import (
	"fmt"
	"math"

	json "github.com/goccy/go-json"

	"github.com/kvc-router/kvc-router/core/index"
)

func init() {
	Register("least_inflight", func(p json.RawMessage) (Strategy, error) {
		var v struct{}
		if err := decodeStrict(p, &v); err != nil {
			return nil, fmt.Errorf("least_inflight: %w", err)
		}
		return LeastInflight{}, nil
	})
	Register("kvc_aware", func(p json.RawMessage) (Strategy, error) {
		k := DefaultKVCAware()
		if err := decodeStrict(p, &k); err != nil {
			return nil, fmt.Errorf("kvc_aware: %w", err)
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
//	S_cache = sum over tiers of layer_weights[tier] * hit_blocks[tier] / hittable_blocks
//	S       = alpha * S_cache + (1 - alpha) * (1 - load)
//
// A server whose load exceeds LoadThreshold has 1 subtracted, so it is chosen
// only when every candidate is overloaded; among those the same formula
// ranks them. A prompt with no hittable block scores on load alone.
type KVCAware struct {
	Alpha         float64            `json:"alpha"`
	LoadThreshold float64            `json:"load_threshold"`
	LayerWeights  map[string]float64 `json:"layer_weights"`
	tier          [index.NumTiers]float64
}

// DefaultKVCAware returns the documented defaults.
func DefaultKVCAware() KVCAware {
	return KVCAware{Alpha: 0.7, LoadThreshold: 0.9, LayerWeights: map[string]float64{"gpu": 0.7, "cpu": 0.2, "ssd": 0.1}}
}

// Validate checks ranges and resolves tier weights.
func (k *KVCAware) Validate() error {
	if !(k.Alpha >= 0 && k.Alpha <= 1) {
		return fmt.Errorf("kvc_aware: alpha must be in [0, 1], got %v", k.Alpha)
	}
	if !(k.LoadThreshold > 0 && k.LoadThreshold <= 1) {
		return fmt.Errorf("kvc_aware: load_threshold must be in (0, 1], got %v", k.LoadThreshold)
	}
	k.tier = [index.NumTiers]float64{}
	for name, w := range k.LayerWeights {
		var t index.Tier
		switch name {
		case "gpu":
			t = index.GPU
		case "cpu":
			t = index.CPU
		case "ssd":
			t = index.SSD
		default:
			return fmt.Errorf("kvc_aware: layer_weights has unknown tier %q (allowed: gpu, cpu, ssd)", name)
		}
		if !(w >= 0 && w <= 1) || math.IsInf(w, 0) {
			return fmt.Errorf("kvc_aware: layer_weights.%s must be in [0, 1], got %v", name, w)
		}
		k.tier[t] = w
	}
	return nil
}

// Name implements Strategy.
func (k *KVCAware) Name() string { return "kvc_aware" }

// Threshold is the overload bound used for sticky breakout.
func (k *KVCAware) Threshold() float64 { return k.LoadThreshold }

// Score implements Strategy.
func (k *KVCAware) Score(_ *Request, c []Candidate, out []float64) {
	for i := range c {
		out[i] = k.score(&c[i])
	}
}

func (k *KVCAware) score(c *Candidate) float64 {
	var cache float64
	if c.HittableBlocks > 0 {
		n := float64(c.HittableBlocks)
		for t := range index.NumTiers {
			cache += k.tier[t] * float64(c.Hit.Tier[t]) / n
		}
	}
	s := k.Alpha*cache + (1-k.Alpha)*(1-c.Load)
	if c.Load > k.LoadThreshold {
		s--
	}
	return s
}
