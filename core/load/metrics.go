package load

import "time"

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
