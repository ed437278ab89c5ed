package load

import (
	"fmt"
	"math"
	"time"
)

// Metrics is one scrape of a serving engine's own counters and gauges,
// aggregated over its data-parallel engines. A zero field with its Has* flag
// false means the engine did not report it.
type Metrics struct {
	Running float64
	Waiting float64
	// KVUsage is the fraction (0..1) of GPU KV blocks in use.
	KVUsage    float64
	HasKVUsage bool
	// PrefixQueries and PrefixHits are cumulative token counters.
	PrefixQueries         float64
	PrefixHits            float64
	ExternalPrefixQueries float64
	ExternalPrefixHits    float64
	// BlockSize and NumGPUBlocks come from vllm:cache_config_info (0 = unknown).
	BlockSize    int
	NumGPUBlocks int
	// KVCacheSizeTokens is the KV capacity in tokens where reported
	// (vLLM's kv_cache_size_tokens for hybrid models, SGLang's
	// max_total_num_tokens); 0 = unknown.
	KVCacheSizeTokens int
	// MaxNumSeqs is the engine's running-set capacity when known (0 = unknown).
	MaxNumSeqs int
	// Engines counts the distinct `engine` label values aggregated.
	Engines int
	// At is when the scrape completed.
	At time.Time
}

// Check reports the first value in m no engine can produce, or nil. The
// rules (docs/reliability.md, "Impossible metrics"):
//   - Running, Waiting and the four prefix counters are finite and >= 0;
//   - KVUsage, when reported, is finite and in [0, 1];
//   - the sizes (BlockSize, NumGPUBlocks, KVCacheSizeTokens, MaxNumSeqs,
//     Engines) are >= 0.
//
// The load formula relies on them: a negative waiting count would cancel
// running requests and a NaN would compare false everywhere (a NaN load
// never loses a comparison), so a scrape breaking one is refused whole.
func (m *Metrics) Check() error {
	counts := [...]struct {
		name string
		v    float64
	}{
		{"running requests", m.Running}, {"waiting requests", m.Waiting},
		{"prefix cache queries", m.PrefixQueries}, {"prefix cache hits", m.PrefixHits},
		{"external prefix cache queries", m.ExternalPrefixQueries}, {"external prefix cache hits", m.ExternalPrefixHits},
	}
	for _, c := range counts {
		if !(c.v >= 0) || math.IsInf(c.v, 1) {
			return fmt.Errorf("%s = %v: a count must be finite and not negative", c.name, c.v)
		}
	}
	if m.HasKVUsage && !(m.KVUsage >= 0 && m.KVUsage <= 1) {
		return fmt.Errorf("KV cache usage = %v: a usage fraction must be in [0, 1]", m.KVUsage)
	}
	sizes := [...]struct {
		name string
		v    int
	}{
		{"block size", m.BlockSize}, {"GPU blocks", m.NumGPUBlocks}, {"KV cache size in tokens", m.KVCacheSizeTokens},
		{"max_num_seqs", m.MaxNumSeqs}, {"engines", m.Engines},
	}
	for _, c := range sizes {
		if c.v < 0 {
			return fmt.Errorf("%s = %d: must not be negative", c.name, c.v)
		}
	}
	return nil
}
