// Package collector teaches the router, live, what every server holds and
// how busy it is, from the servers' own interfaces: KV-cache events over ZMQ
// (vllm_zmq) and Prometheus /metrics over HTTP (vllm_metrics, alias
// vllm_polling; sglang_metrics). Push paths (ApplyPayload, PushMetrics) feed
// the same decoders for callers that run their own transport.
package collector

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/kvc-router/kvc-router/core/index"
	"github.com/kvc-router/kvc-router/core/kvevents"
	"github.com/kvc-router/kvc-router/core/memtrim"
	"github.com/kvc-router/kvc-router/core/sink"
)

// ErrUnknownServer is returned when a payload names a server not in the pool.
var ErrUnknownServer = errors.New("collector: server not in the pool")

// EventStats counts what event application did. Safe for concurrent use.
type EventStats struct {
	Batches       atomic.Uint64
	Events        atomic.Uint64
	StoredBlocks  atomic.Uint64
	RemovedBlocks atomic.Uint64
	Cleared       atomic.Uint64
	UnknownTypes  atomic.Uint64
	UnknownMedium atomic.Uint64
	Unanchored    atomic.Uint64
	DecodeErrors  atomic.Uint64
	ApplyErrors   atomic.Uint64
}

// EventCounts is a plain copy of EventStats.
type EventCounts struct {
	Batches       uint64 `json:"batches"`
	Events        uint64 `json:"events"`
	StoredBlocks  uint64 `json:"stored_blocks"`
	RemovedBlocks uint64 `json:"removed_blocks"`
	Cleared       uint64 `json:"cleared"`
	UnknownTypes  uint64 `json:"unknown_types"`
	UnknownMedium uint64 `json:"unknown_medium"`
	Unanchored    uint64 `json:"unanchored_events"`
	DecodeErrors  uint64 `json:"decode_errors"`
	ApplyErrors   uint64 `json:"apply_errors"`
}

// Snapshot copies the counters.
func (s *EventStats) Snapshot() EventCounts {
	return EventCounts{
		Batches: s.Batches.Load(), Events: s.Events.Load(), StoredBlocks: s.StoredBlocks.Load(),
		RemovedBlocks: s.RemovedBlocks.Load(), Cleared: s.Cleared.Load(), UnknownTypes: s.UnknownTypes.Load(),
		UnknownMedium: s.UnknownMedium.Load(), Unanchored: s.Unanchored.Load(), DecodeErrors: s.DecodeErrors.Load(),
		ApplyErrors: s.ApplyErrors.Load(),
	}
}

// Apply feeds one decoded batch from server into the sink (the router's
// index). Events
// the index cannot place (unknown medium or type, a parent it never saw) are
// counted and skipped; the rest of the batch still applies.
func Apply(r sink.Events, server string, b *kvevents.Batch, st *EventStats) error {
	w, ok := r.EventWriter(server)
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownServer, server)
	}
	return applyTo(w, b, st)
}

func applyTo(w sink.EventWriter, b *kvevents.Batch, st *EventStats) error {
	st.Batches.Add(1)
	st.Events.Add(uint64(len(b.Events)))
	for i := range b.Events {
		ev := &b.Events[i]
		switch ev.Kind {
		case kvevents.KindCleared:
			if err := w.Cleared(); err != nil {
				return err
			}
			st.Cleared.Add(1)
		case kvevents.KindStored, kvevents.KindRemoved:
			tier, ok := kvevents.TierOf(ev.Medium)
			if !ok {
				st.UnknownMedium.Add(1)
				continue
			}
			if ev.Kind == kvevents.KindRemoved {
				if err := w.Removed(index.Tier(tier), ev.BlockHashes); err != nil {
					return err
				}
				st.RemovedBlocks.Add(uint64(len(ev.BlockHashes)))
				continue
			}
			err := w.Stored(index.Tier(tier), ev.HasParent, ev.ParentBlockHash, ev.BlockHashes, ev.TokenIDs, ev.BlockSize, ev.LoraName)
			switch {
			case errors.Is(err, index.ErrUnanchored):
				st.Unanchored.Add(1)
			case errors.Is(err, index.ErrBadEvent):
				st.ApplyErrors.Add(1)
			case err != nil:
				return err
			default:
				st.StoredBlocks.Add(uint64(len(ev.BlockHashes)))
			}
		default:
			st.UnknownTypes.Add(1)
		}
	}
	return nil
}

// ApplyPayload decodes one raw msgpack KVEventBatch and applies it. The
// payload is already in memory: bounding its size is the caller's (the C
// ABI's push.max_event_bytes), so a limit configured above the decoder's
// default is honoured; the per-event limits still apply.
func ApplyPayload(r sink.Events, server string, payload []byte, st *EventStats) error {
	// A large payload leaves its decode garbage and copies behind: have
	// the memory returned once it is applied (or refused).
	defer memtrim.Note(len(payload))
	var b kvevents.Batch
	if err := (kvevents.Limits{MaxPayloadBytes: len(payload)}).DecodeInto(payload, &b); err != nil {
		st.DecodeErrors.Add(1)
		return err
	}
	return Apply(r, server, &b, st)
}
