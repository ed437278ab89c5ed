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

	"github.com/kvc-router/kvc-router/core/internal/index"
	"github.com/kvc-router/kvc-router/core/internal/kvevents"
	"github.com/kvc-router/kvc-router/core/internal/memtrim"
	"github.com/kvc-router/kvc-router/core/internal/sink"
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
	// Dropped counts events left out of the index, by reason (DropReason);
	// the rest of their batch still applies.
	Dropped [numDropReasons]atomic.Uint64
	// WindowBlocks counts blocks of sliding-window groups applied to the
	// window residency (hybrid models).
	WindowBlocks atomic.Uint64
}

// DropReason says why one event did not reach the index. The decoder's
// reasons (kvevents.DropReason) come first, with the same numbers.
type DropReason uint8

const (
	// DropGroup: an event of a KV-cache group whose blocks give no prefix
	// hit on their own (sliding window, mamba) when the writer does not
	// model that group; full-attention groups alone feed the index.
	DropGroup DropReason = DropReason(kvevents.NumDropReasons) + iota
	// DropUnknownType: an event class this router does not know.
	DropUnknownType
	// DropUnknownMedium: a medium that maps to no tier.
	DropUnknownMedium
	// DropUnanchored: a parent block the index never saw.
	DropUnanchored
	// DropBadEvent: the index refused the event (index.ErrBadEvent).
	DropBadEvent
	numDropReasons
)

// String names the reason as the status document shows it.
func (r DropReason) String() string {
	switch r {
	case DropGroup:
		return "non_full_attention_group"
	case DropUnknownType:
		return "unknown_type"
	case DropUnknownMedium:
		return "unknown_medium"
	case DropUnanchored:
		return "unanchored"
	case DropBadEvent:
		return "bad_event"
	}
	if r < DropReason(kvevents.NumDropReasons) {
		return kvevents.DropReason(r).String()
	}
	return "unknown"
}

func (s *EventStats) drop(r DropReason) { s.Dropped[r].Add(1) }

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
	WindowBlocks  uint64 `json:"window_blocks"`
	// Dropped maps a reason to the events dropped for it (reasons with a
	// zero count are left out).
	Dropped map[string]uint64 `json:"dropped_events,omitempty"`
}

// Snapshot copies the counters.
func (s *EventStats) Snapshot() EventCounts {
	c := EventCounts{
		Batches: s.Batches.Load(), Events: s.Events.Load(), StoredBlocks: s.StoredBlocks.Load(),
		RemovedBlocks: s.RemovedBlocks.Load(), Cleared: s.Cleared.Load(), UnknownTypes: s.UnknownTypes.Load(),
		UnknownMedium: s.UnknownMedium.Load(), Unanchored: s.Unanchored.Load(), DecodeErrors: s.DecodeErrors.Load(),
		ApplyErrors: s.ApplyErrors.Load(), WindowBlocks: s.WindowBlocks.Load(),
	}
	for r := DropReason(1); r < numDropReasons; r++ {
		if n := s.Dropped[r].Load(); n > 0 {
			if c.Dropped == nil {
				c.Dropped = make(map[string]uint64)
			}
			c.Dropped[r.String()] = n
		}
	}
	return c
}

// Apply feeds one decoded batch from server into the sink (the router's
// index). Events the index cannot place (dropped by the decoder, unknown
// medium or type, a parent it never saw, a group that gives no prefix hit)
// are counted per reason and skipped; the rest of the batch still applies.
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
	hw, hybrid := w.(sink.HybridWriter)
	for i := range b.Events {
		ev := &b.Events[i]
		if ev.Drop != kvevents.DropNone {
			st.drop(DropReason(ev.Drop))
			continue
		}
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
				st.drop(DropUnknownMedium)
				continue
			}
			kind := ev.KVCacheSpecKind
			if hybrid && ev.GroupIdx >= 0 {
				if ev.Kind == kvevents.KindStored && kind != "" {
					hw.SetGroup(ev.GroupIdx, kind)
				} else if kind == "" {
					kind = hw.Group(ev.GroupIdx) // BlockRemoved carries the index only
				}
			}
			if kind != "" && kind != kvevents.SpecFullAttention {
				if err := applyWindow(hw, hybrid, ev, tier, kind, st); err != nil {
					return err
				}
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
				st.drop(DropUnanchored)
			case errors.Is(err, index.ErrBadEvent):
				st.ApplyErrors.Add(1)
				st.drop(DropBadEvent)
			case err != nil:
				return err
			default:
				st.StoredBlocks.Add(uint64(len(ev.BlockHashes)))
			}
		default:
			st.UnknownTypes.Add(1)
			st.drop(DropUnknownType)
		}
	}
	return nil
}

// applyWindow handles an event of a group whose blocks give no prefix hit
// on their own. A sliding-window group on the GPU tier goes to the
// writer's window residency (the engine's hit also needs the window's
// last blocks); anything else is dropped: it must not reach the index,
// whose records are the full-attention blocks (vLLM hashes a block alike
// in every group, so a window group's removal would delete them).
func applyWindow(hw sink.HybridWriter, hybrid bool, ev *kvevents.Event, tier kvevents.Tier, kind string, st *EventStats) error {
	if !hybrid || kind != kvevents.SpecSlidingWindow || tier != kvevents.TierGPU {
		st.drop(DropGroup)
		return nil
	}
	if ev.Kind == kvevents.KindRemoved {
		return hw.WindowRemoved(ev.BlockHashes)
	}
	need := 0
	if ev.HasSlidingWindow && ev.SlidingWindow > 1 && ev.BlockSize > 0 {
		need = (ev.SlidingWindow - 1 + ev.BlockSize - 1) / ev.BlockSize
	}
	if need == 0 {
		st.drop(DropGroup) // no window size to reason with
		return nil
	}
	if err := hw.WindowStored(ev.BlockHashes, need); err != nil {
		return err
	}
	st.WindowBlocks.Add(uint64(len(ev.BlockHashes)))
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
