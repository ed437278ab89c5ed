package sim

import (
	"errors"
	"fmt"
)

// Default step-time profile. Provenance (see the project reference
// simulation-and-data.md §2):
//
//   - DefaultStepBase 5.5 ms: H100 linear-op time of an 8B-class model for a
//     small batch (weight-bandwidth bound), derived from Vidur's Llama-2-7B
//     H100 profile; also Dynamo's mocker decode curve at empty KV (5.7 ms).
//   - DefaultPrefillPerToken 20 µs/token: the same profile saturates at
//     ≈49–51k tok/s of batched prefill.
//   - DefaultDecodeFullKV 28.5 ms: Dynamo's mocker decode step goes from
//     5.7 ms (empty KV) to ≈34 ms (full KV), i.e. ≈+28.5 ms when every GPU
//     block holds context being attended. The per-context-token coefficient
//     c is DecodeFullKV / (NumGPUBlocks·BlockSize), so a full cache makes a
//     decode step ≈6× the empty one whatever the cache size.
//   - Tier load costs: one 16-token block of an 8B model is ≈2 MiB of KV
//     (128 KiB/token); ≈25 GB/s host-to-device gives ≈80 µs (CPU), ≈5 GB/s
//     NVMe ≈400 µs (SSD). Scaled linearly with BlockSize/16.
//
// The HBM engine model (HBMModel, issue 26) adds what the default lacks:
//
//   - an attention term for prefill, AttentionPerPair per (new token,
//     context token) pair, so a chunk prefilled behind a long context costs
//     more than the same chunk at the start: 4·layers·hidden = 524,288 FLOPs
//     a pair for Llama-3-8B, at ≈525 TFLOP/s (53% of an H100's 989 dense
//     BF16) ≈ 1.0 ns. Checked against Dynamo's mocker prefill polynomial,
//     whose quadratic 4.21e-7 ms·T² is 0.84 ns a pair.
//   - a decode cost per context token from KV bytes and memory bandwidth:
//     KVBytesPerToken (128 KiB, Llama-3-8B FP16) / MemBandwidth (H100 SXM's
//     3.35 TB/s at the 77% vLLM 0.23 reaches in batch-1 decode of
//     Llama-3.1-8B on an A100, 75 tok/s against a 97 tok/s roofline) ≈ 51 ns
//     a context token a step; a full 480k-token cache adds ≈ 24 ms a step
//     (Dynamo's mocker curve: +28.5 ms).
//   - the linear-op cost PrefillPerToken for decode tokens too (Vidur's
//     H100 linear-op profile is per token in the batch, prefill or decode).
//
// Checked against vLLM 0.21 serving Llama-3.1-8B (FP16) on one H100
// (InferenceBench concurrency sweep, chatbot-short): TPOT p50 6.48 ms at
// concurrency 1 and 6.59 ms at 4; the model gives 5.6 and 5.7 ms (it omits
// sampling and scheduler overhead); 10.9 ms at 16 includes the chunked
// prefills of arriving requests, which the model charges as prefill.
//
// These are knobs, not truth; experiments should state what they used.
const (
	DefaultKVBytesPerToken  = 131072
	DefaultMemBandwidth     = 3.35e12 * 0.77
	DefaultAttentionPerPair = 1.0e-9

	DefaultBlockSize           = 16
	DefaultNumGPUBlocks        = 8192
	DefaultMaxNumSeqs          = 256
	DefaultMaxNumBatchedTokens = 8192
	DefaultStepBase            = 0.0055
	DefaultPrefillPerToken     = 20e-6
	DefaultDecodeFullKV        = 0.0285
	DefaultCPULoadPerBlock16   = 80e-6
	DefaultSSDLoadPerBlock16   = 400e-6
	DefaultVocabSize           = 32000
	DefaultModelName           = "sim/llama-8b"
)

// Config describes one simulated engine. Zero fields take the defaults
// listed on each field (applied by New; see WithDefaults). For the
// step-time coefficients a negative value means an explicit zero.
type Config struct {
	// ModelName is reported by the server (default DefaultModelName).
	ModelName string
	// BlockSize is tokens per KV block (default 16).
	BlockSize int
	// NumGPUBlocks is the GPU KV capacity in blocks (default 8192).
	NumGPUBlocks int
	// CPUBlocks and SSDBlocks size the optional offload tiers; 0 = off.
	CPUBlocks int
	SSDBlocks int
	// MaxNumSeqs caps the running set (default 256).
	MaxNumSeqs int
	// MaxNumBatchedTokens is the per-step token budget (default 8192).
	MaxNumBatchedTokens int

	// Step time: StepBase + PrefillPerToken·(uncached prefill tokens in the
	// step) + DecodePerContextToken·(Σ context tokens of decoding requests)
	// + per-block tier load costs. Seconds.
	StepBase        float64 // a, default 5.5 ms
	PrefillPerToken float64 // b, default 20 µs
	// DecodePerContextToken is c; 0 derives it as DecodeFullKV divided by
	// the GPU capacity in tokens; negative means 0.
	DecodePerContextToken float64
	// DecodeFullKV is the extra decode time of a full cache (default 28.5 ms),
	// used only to derive DecodePerContextToken.
	DecodeFullKV float64
	// CPULoadPerBlock / SSDLoadPerBlock are the costs of loading one block
	// back from a tier (defaults 80 µs / 400 µs per 16 tokens of block).
	CPULoadPerBlock float64
	SSDLoadPerBlock float64
	// AttentionPerPair is the prefill attention cost per (new token,
	// context token) pair in seconds; 0 = none (the default model).
	AttentionPerPair float64
	// KVBytesPerToken / MemBandwidth (bytes/s), when both are set and
	// DecodePerContextToken is not, derive DecodePerContextToken.
	KVBytesPerToken float64
	MemBandwidth    float64
	// DecodePerToken is the linear-op cost of a decode token in seconds
	// (0 = none, the default model; the HBM model charges PrefillPerToken).
	DecodePerToken float64

	// Seed drives output tokens (and the engine-hash salt when HashSalt is 0).
	Seed uint64
	// HashSalt salts the engine hashes published in events. Engine hashes
	// are a bijective mix of the internal chained hash and this salt, so
	// different salts give unrelated values: consumers must key on tokens.
	// 0 derives the salt from Seed.
	HashSalt uint64
	// VocabSize bounds generated token ids (default 32000).
	VocabSize int
	// DisableEvents suppresses KV events (faster benchmarks).
	DisableEvents bool
	// LazyClearEvent publishes a prefix-cache reset's AllBlocksCleared with
	// the engine's next step, as vLLM does (its block pool queues the event
	// and the engine core takes the queue after a step), instead of at the
	// reset. An idle engine therefore reports the reset only once the next
	// rollout's first request runs.
	LazyClearEvent bool
}

// WithDefaults returns the config with zero fields filled in.
func (c Config) WithDefaults() Config {
	if c.ModelName == "" {
		c.ModelName = DefaultModelName
	}
	if c.BlockSize == 0 {
		c.BlockSize = DefaultBlockSize
	}
	if c.NumGPUBlocks == 0 {
		c.NumGPUBlocks = DefaultNumGPUBlocks
	}
	if c.MaxNumSeqs == 0 {
		c.MaxNumSeqs = DefaultMaxNumSeqs
	}
	if c.MaxNumBatchedTokens == 0 {
		c.MaxNumBatchedTokens = DefaultMaxNumBatchedTokens
	}
	c.StepBase = orDefault(c.StepBase, DefaultStepBase)
	c.PrefillPerToken = orDefault(c.PrefillPerToken, DefaultPrefillPerToken)
	if c.DecodeFullKV == 0 {
		c.DecodeFullKV = DefaultDecodeFullKV
	}
	if c.DecodePerContextToken == 0 && c.KVBytesPerToken > 0 && c.MemBandwidth > 0 {
		c.DecodePerContextToken = c.KVBytesPerToken / c.MemBandwidth
	} else if c.DecodePerContextToken == 0 && c.BlockSize > 0 && c.NumGPUBlocks > 0 {
		c.DecodePerContextToken = c.DecodeFullKV / float64(c.NumGPUBlocks*c.BlockSize)
	} else if c.DecodePerContextToken < 0 {
		c.DecodePerContextToken = 0
	}
	scale := float64(c.BlockSize) / 16
	c.CPULoadPerBlock = orDefault(c.CPULoadPerBlock, DefaultCPULoadPerBlock16*scale)
	c.SSDLoadPerBlock = orDefault(c.SSDLoadPerBlock, DefaultSSDLoadPerBlock16*scale)
	if c.VocabSize == 0 {
		c.VocabSize = DefaultVocabSize
	}
	if c.HashSalt == 0 {
		c.HashSalt = Mix64(c.Seed ^ 0x6b76632d726f7574)
	}
	return c
}

// EngineModels names the step-time models: "default" (the constants
// above) and "hbm" (HBMModel).
var EngineModels = []string{"default", "hbm"}

// WithModel applies a named engine model to c.
func (c Config) WithModel(name string) (Config, error) {
	switch name {
	case "", "default":
		return c, nil
	case "hbm":
		return HBMModel(c), nil
	}
	return c, fmt.Errorf("unknown engine model %q (want default or hbm)", name)
}

// HBMModel returns c with the HBM model's terms (see the constants'
// comment): prefill attention, decode per context token from KV bytes and
// memory bandwidth, linear cost for decode tokens.
func HBMModel(c Config) Config {
	c.AttentionPerPair = DefaultAttentionPerPair
	c.KVBytesPerToken = DefaultKVBytesPerToken
	c.MemBandwidth = DefaultMemBandwidth
	c.DecodePerToken = DefaultPrefillPerToken
	return c
}

// orDefault maps 0 to def and negatives to 0.
func orDefault(v, def float64) float64 {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

// Validate reports an impossible configuration.
func (c Config) Validate() error {
	var errs []error
	if c.BlockSize <= 0 {
		errs = append(errs, fmt.Errorf("block size %d <= 0", c.BlockSize))
	}
	if c.NumGPUBlocks <= 0 {
		errs = append(errs, fmt.Errorf("num gpu blocks %d <= 0", c.NumGPUBlocks))
	}
	if c.CPUBlocks < 0 || c.SSDBlocks < 0 {
		errs = append(errs, errors.New("negative tier size"))
	}
	if c.MaxNumSeqs <= 0 {
		errs = append(errs, fmt.Errorf("max num seqs %d <= 0", c.MaxNumSeqs))
	}
	if c.MaxNumBatchedTokens <= 0 {
		errs = append(errs, fmt.Errorf("max num batched tokens %d <= 0", c.MaxNumBatchedTokens))
	}
	if c.VocabSize <= 0 {
		errs = append(errs, fmt.Errorf("vocab size %d <= 0", c.VocabSize))
	}
	if c.AttentionPerPair < 0 || c.KVBytesPerToken < 0 || c.MemBandwidth < 0 || c.DecodePerToken < 0 {
		errs = append(errs, errors.New("negative attention cost, KV bytes or memory bandwidth"))
	}
	return errors.Join(errs...)
}
