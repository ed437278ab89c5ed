package kvcrouter

// The library's building blocks live under core/internal so that nothing
// outside core depends on their shape by accident. What the C shell, kvctl
// and the proving ground (testbed/: simulator, kvbench, re-implemented peers)
// legitimately need is named here, once, so this file is the whole public
// surface beyond the Library itself. Aliases keep one definition: a change
// to an internal type is a change to the public one, visible in review here.

import (
	"context"
	"io"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/blockhash"
	"github.com/kvc-router/kvc-router/core/internal/collector"
	"github.com/kvc-router/kvc-router/core/internal/index"
	"github.com/kvc-router/kvc-router/core/internal/kvevents"
	"github.com/kvc-router/kvc-router/core/internal/load"
	"github.com/kvc-router/kvc-router/core/internal/metrics"
	"github.com/kvc-router/kvc-router/core/internal/router"
	"github.com/kvc-router/kvc-router/core/internal/sink"
	"github.com/kvc-router/kvc-router/core/internal/strategy"
)

// Block hashing: how prompts become the chained block keys the index holds.
const DefaultBlockSize = blockhash.DefaultBlockSize

// HashNamespace derives the namespace (model, adapter, ...) a key chain starts from.
func HashNamespace(parts ...string) uint64 { return blockhash.Namespace(parts...) }

// BlockKeys returns the chained keys of tokens' full blocks.
func BlockKeys(tokens []int32, blockSize int, namespace uint64) []uint64 {
	return blockhash.Keys(tokens, blockSize, namespace)
}

// AppendBlockKeys is BlockKeys appending to dst.
func AppendBlockKeys(dst []uint64, tokens []int32, blockSize int, namespace uint64) []uint64 {
	return blockhash.AppendKeys(dst, tokens, blockSize, namespace)
}

// BlockRoot is the parent key of a chain's first block.
func BlockRoot(namespace uint64, blockSize int) uint64 { return blockhash.Root(namespace, blockSize) }

// ChainBlock is the key of block after parent.
func ChainBlock(parent uint64, block []int32) uint64 { return blockhash.Chain(parent, block) }

// KV events: vLLM's wire batches, decoded and (for the simulator) encoded.
type (
	Event       = kvevents.Event
	EventBatch  = kvevents.Batch
	EventLayout = kvevents.Layout
)

const (
	EventStored      = kvevents.KindStored
	EventRemoved     = kvevents.KindRemoved
	EventCleared     = kvevents.KindCleared
	EventLayoutArray = kvevents.LayoutArray
	EventLayoutMap   = kvevents.LayoutMap
	// EventDropNone: an event the decoder kept (Event.Drop names why
	// another was dropped; the rest of its batch decodes on).
	EventDropNone = kvevents.DropNone
)

// DecodeEvents decodes one KV-event batch payload.
func DecodeEvents(payload []byte) (*EventBatch, error) { return kvevents.Decode(payload) }

// DecodeEventsInto decodes into b, reusing its storage.
func DecodeEventsInto(payload []byte, b *EventBatch) error { return kvevents.DecodeInto(payload, b) }

// EncodeEvents encodes b in the given layout (positional or tagged map).
func EncodeEvents(b *EventBatch, layout EventLayout) ([]byte, error) {
	return kvevents.Encode(b, layout)
}

// NoneExtraKeys is the encoded extra_keys field of blocks blocks with none.
func NoneExtraKeys(blocks int) []byte { return kvevents.NoneExtraKeys(blocks) }

// Collectors: applying event payloads, replay, metrics scraping.
type (
	EventSink       = sink.Events
	EventStats      = collector.EventStats
	EventCounts     = collector.EventCounts
	EventEndpoint   = collector.Endpoint
	CollectorStatus = collector.Status
	// CollectorSpec is one entry of Config.Collectors.Collectors.
	CollectorSpec = collector.Spec
)

// ApplyEventPayload decodes one payload and applies it to r for server.
func ApplyEventPayload(r EventSink, server string, payload []byte, st *EventStats) error {
	return collector.ApplyPayload(r, server, payload, st)
}

// ReplayEvents asks a publisher's replay endpoint for sequence numbers from..to.
func ReplayEvents(ctx context.Context, endpoint string, from, to uint64, timeout, dialTimeout time.Duration,
	partial bool, fn func(seq uint64, payload []byte)) (bool, int, error) {
	return collector.Replay(ctx, endpoint, from, to, timeout, dialTimeout, partial, fn)
}

// EventReplayOptions tune ReplayEventsWith.
type EventReplayOptions = collector.ReplayOptions

// ReplayEventsWith is ReplayEvents with every option (a payload limit
// enforced before a frame is read).
func ReplayEventsWith(ctx context.Context, endpoint string, from, to uint64, o EventReplayOptions,
	fn func(seq uint64, payload []byte)) (bool, int, error) {
	return collector.ReplayWith(ctx, endpoint, from, to, o, fn)
}

// LiveEvents is a bounded SUB connection to a KV-event publisher (kvctl
// watch); DialLiveEvents opens one.
type LiveEvents = collector.LiveConn

// DialLiveEvents connects to a publisher and subscribes to a topic prefix;
// frames over maxPayload plus framing end the connection unread.
func DialLiveEvents(ctx context.Context, endpoint, topic string, maxPayload int, dialTimeout time.Duration) (*LiveEvents, error) {
	return collector.DialLive(ctx, endpoint, topic, maxPayload, dialTimeout)
}

// IsHostileEventPeer reports whether an event connection ended because of
// what the peer sent (a frame over the limits, a ZMTP violation).
func IsHostileEventPeer(err error) bool { return collector.IsHostile(err) }

// DefaultMaxEventPayloadBytes is the default KV-event batch size limit.
var DefaultMaxEventPayloadBytes = kvevents.DefaultLimits.MaxPayloadBytes

// MetricsURL is the /metrics URL the poller scrapes for a server id.
func MetricsURL(server string) string { return collector.MetricsURL(server) }

// Metrics: Prometheus text to load figures.
type (
	MetricsFlavor = metrics.Flavor
	LoadMetrics   = load.Metrics
)

const (
	MetricsVLLM         = metrics.VLLM
	MetricsSGLang       = metrics.SGLang
	DefaultMetricsLimit = metrics.DefaultLimit
)

// ParseMetrics parses at most limit bytes of exposition text of a flavor.
func ParseMetrics(r io.Reader, flavor MetricsFlavor, limit int64) (LoadMetrics, error) {
	return metrics.Parse(r, flavor, limit)
}

// The index's view of a prefix hit.
type (
	Match       = index.Match
	IndexStatus = index.Status
)

const (
	NumTiers = index.NumTiers
	TierGPU  = index.GPU
	TierCPU  = index.CPU
	TierSSD  = index.SSD
)

// The router: decisions, admission and the pool.
type (
	Router         = router.Router
	RouterConfig   = router.Config
	RouterStatus   = router.Status
	RouterCounters = router.Counters
	LengthCounters = router.LengthCounters
	Request        = router.Request
	Decision       = router.Decision
	Admitted       = router.Admitted
	ServerSpec     = router.ServerSpec
	ServerLoad     = router.ServerLoad
	IndexSpec      = router.IndexSpec
	StrategySpec   = router.StrategySpec
	AdmissionSpec  = router.AdmissionSpec
	// Explain is one decision stage by stage (RouterStatus.LastDecision).
	Explain          = router.Explain
	ExplainFilter    = router.ExplainFilter
	ExplainCandidate = router.ExplainCandidate
)

const (
	ModeDefault      = router.ModeDefault
	ModeKVCAware     = router.ModeKVCAware
	MaxServerIDBytes = router.MaxServerIDBytes
	TurnsAuto        = router.TurnsAuto
	TurnsSingle      = router.TurnsSingle
	TurnsMulti       = router.TurnsMulti
)

// NewRouter builds a router alone, without collectors (the benchmark drives
// it in simulated time).
func NewRouter(cfg RouterConfig) (*Router, error) { return router.New(cfg) }

// CheckServerID reports why id cannot name a server (nil when it can).
func CheckServerID(id string) error { return router.CheckServerID(id) }

// Scoring strategies: what a peer re-implementation plugs into.
type (
	Strategy     = strategy.Strategy
	Candidate    = strategy.Candidate
	ScoreRequest = strategy.Request
	KVCAware     = strategy.KVCAware
)

// Pick returns the index of the best-scored candidate (the router's tie rule).
func Pick(c []Candidate, scores []float64) int { return strategy.Pick(c, scores) }

// TierWeights validates a strategy's per-tier weights.
func TierWeights(name string, m map[string]float64) ([NumTiers]float64, error) {
	return strategy.TierWeights(name, m)
}

// DefaultKVCAware is kvc_aware's scorer at its defaults.
func DefaultKVCAware() KVCAware { return strategy.DefaultKVCAware() }
