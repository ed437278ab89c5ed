// Package sink holds the narrow interfaces collectors write through. Data
// flows one way: collectors turn what servers report (KV-cache events,
// Prometheus metrics, scrape failures) into calls on these interfaces, and
// the router implements them over its own block index and load store,
// which it never hands out. Collectors therefore do not import the router,
// and a test (or another router) can stand in for it.
package sink

import (
	"github.com/kvc-router/kvc-router/core/internal/index"
	"github.com/kvc-router/kvc-router/core/internal/load"
)

// Pool is the membership every collector follows.
type Pool interface {
	// Servers returns the pool's server ids in pool order.
	Servers() []string
}

// Events receives KV-cache events.
type Events interface {
	Pool
	// EventWriter returns the writer for one pool member's events, or
	// false when the server is not in the pool. A writer is meant for one
	// batch: a server removed and re-added gets a new one.
	EventWriter(server string) (EventWriter, bool)
	// SetEventFeed declares whether a server's residency comes from
	// events (authoritative) or from routing decisions alone. It returns
	// false for a server not in the pool.
	SetEventFeed(server string, on bool) bool
}

// EventWriter applies one server's engine events to the block index. Its
// errors are the index's (index.ErrUnanchored, index.ErrBadEvent, ...).
type EventWriter interface {
	// Stored applies a BlockStored event: engine hashes of a run of
	// blocks (parent when hasParent), their tokens when the engine sent
	// them, keyed in the namespace of the server's model and lora.
	Stored(tier index.Tier, hasParent bool, parent uint64, engineHashes []uint64, tokens []int32, blockSize int, lora string) error
	// Removed applies a BlockRemoved event.
	Removed(tier index.Tier, engineHashes []uint64) error
	// Cleared applies AllBlocksCleared (or an engine restart).
	Cleared() error
}

// Forgetter is an EventWriter that tells a clear of the collector's own (an
// event gap replay could not close, an engine restart) from the engine's
// AllBlocksCleared: after a weight sync the engine's reset is still to
// come, and only that one keeps the router's placements since the sync.
type Forgetter interface {
	// Forget drops every record of the server.
	Forget() error
}

// HybridWriter is an EventWriter that also models a hybrid-attention
// model's KV-cache groups (vLLM: one BlockStored per group, tagged with
// group_idx and kv_cache_spec_kind). Collectors feed full-attention groups
// through EventWriter and sliding-window groups through the window methods.
type HybridWriter interface {
	EventWriter
	// SetGroup records the kind of KV-cache group idx (from its BlockStored).
	SetGroup(idx int, kind string)
	// Group returns the kind recorded for idx, "" when none was seen
	// (BlockRemoved carries group_idx but not the kind).
	Group(idx int) string
	// WindowStored records blocks a sliding-window group holds; need is
	// the number of contiguous blocks an engine hit must end on.
	WindowStored(engineHashes []uint64, need int) error
	// WindowRemoved applies the sliding-window group's BlockRemoved.
	WindowRemoved(engineHashes []uint64) error
}

// Load receives load metrics and scrape health.
type Load interface {
	Pool
	// UpdateMetrics stores a metrics snapshot; false for a server not in
	// the pool.
	UpdateMetrics(server string, m load.Metrics) bool
	// MetricsFailed counts a failed scrape. refused marks a connection
	// refused (nothing listens: the server is down now rather than after
	// several failures). It reports whether the server is unhealthy.
	MetricsFailed(server string, err error, refused bool) bool
}
