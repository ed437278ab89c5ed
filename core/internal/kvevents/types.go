// Package kvevents holds vLLM's KV-cache event model and its msgpack wire
// codec. Both event layouts that vLLM has shipped are understood: positional
// arrays with the class name first (vLLM <= ~0.23) and tagged maps keyed by
// field name with a "type" entry (vLLM PR #42892, ~0.24+). The outer batch is
// positional in every known release; a map batch is accepted as well.
package kvevents

import "unsafe"

// Kind names the event class carried on the wire.
type Kind uint8

const (
	// KindUnknown is an event whose class name this package does not know.
	// Decoders keep it (so callers can count it) but carry no fields.
	KindUnknown Kind = iota
	// KindStored is vLLM's BlockStored.
	KindStored
	// KindRemoved is vLLM's BlockRemoved.
	KindRemoved
	// KindCleared is vLLM's AllBlocksCleared.
	KindCleared
)

// String returns vLLM's class name for the kind.
func (k Kind) String() string {
	switch k {
	case KindStored:
		return "BlockStored"
	case KindRemoved:
		return "BlockRemoved"
	case KindCleared:
		return "AllBlocksCleared"
	}
	return "Unknown"
}

// Event is one decoded KV-cache event. Hashes are normalised to uint64: an
// integer is taken as its 64 bits, a byte string as its last 8 bytes read
// big-endian (vLLM's own int conversion).
type Event struct {
	Kind Kind
	// TypeName is the class name as received; useful for unknown kinds.
	TypeName    string
	BlockHashes []uint64
	// HasParent is false when parent_block_hash was nil (run starts at block 0).
	HasParent       bool
	ParentBlockHash uint64
	TokenIDs        []int32
	BlockSize       int
	// LoraID is -1 when absent.
	LoraID   int64
	Medium   string // "" when absent (means GPU)
	LoraName string // "" when absent
	// GroupIdx is -1 when absent.
	GroupIdx int
	// ExtraKeys is the raw msgpack encoding of extra_keys (a list with one
	// entry per block, each a tuple or nil). It is empty when the field was
	// absent or nil. Decode copies it verbatim and Encode re-emits it verbatim;
	// NoneExtraKeys builds vLLM's text-only value [None, ...].
	ExtraKeys []byte
	// KVCacheSpecKind is kv_cache_spec_kind ("full_attention",
	// "sliding_window", "mamba"); "" when absent.
	KVCacheSpecKind string
	// SlidingWindow is kv_cache_spec_sliding_window; meaningful only when
	// HasSlidingWindow is true (the zero value means absent).
	SlidingWindow    int
	HasSlidingWindow bool
	// Bigram is true when token_ids arrived as SGLang's speculative-decoding
	// (EAGLE/MTP) bigram keys, one [t_j, t_j+1] pair per position; TokenIDs
	// then holds t_j of each pair, the token sequence the pairs are keyed on.
	Bigram bool

	// Drop is why this event cannot be used (DropNone when it can). The
	// decoder drops one event, never the batch around it: the other events
	// of the batch decode and apply as usual. A dropped event keeps Kind and
	// TypeName when they could be read; its other fields are unspecified.
	Drop DropReason
	// DropErr describes the problem (a *DecodeError) when Drop != DropNone.
	DropErr error
}

// DropReason says why the decoder dropped one event of a batch.
type DropReason uint8

const (
	// DropNone: the event decoded and can be applied.
	DropNone DropReason = iota
	// DropMalformed: a field has the wrong msgpack type or an out-of-range
	// value (the event itself is well-formed msgpack, so it can be skipped).
	DropMalformed
	// DropTokenCount: token_ids do not fit block_hashes x block_size
	// (vLLM: len(token_ids) == len(block_hashes)*block_size; LMCache and
	// SGLang may end on a partial block).
	DropTokenCount
	// DropLimit: the event exceeds a per-event Limits bound.
	DropLimit
	// NumDropReasons bounds the reasons (for per-reason counters).
	NumDropReasons
)

// String names the reason as counters and logs show it.
func (r DropReason) String() string {
	switch r {
	case DropNone:
		return "none"
	case DropMalformed:
		return "malformed_event"
	case DropTokenCount:
		return "token_count_mismatch"
	case DropLimit:
		return "event_limit"
	}
	return "unknown"
}

// Batch is one KVEventBatch: the payload of one ZMQ message.
type Batch struct {
	TS     float64
	Events []Event
	// DPRank is -1 when data_parallel_rank was absent or nil.
	DPRank int
}

// Retained approximates the bytes b holds for reuse by DecodeInto: its
// event array and the slices of the events in use. A caller that keeps one
// Batch across payloads drops it when this grows large (one giant batch
// would otherwise pin its buffers for the life of the connection); slices
// of events beyond len were counted when they were in use.
func (b *Batch) Retained() int {
	n := cap(b.Events) * int(unsafe.Sizeof(Event{}))
	for i := range b.Events {
		e := &b.Events[i]
		n += 8*cap(e.BlockHashes) + 4*cap(e.TokenIDs) + cap(e.ExtraKeys)
	}
	return n
}

// Layout selects the event encoding used by Encode.
type Layout uint8

const (
	// LayoutArray encodes events as positional arrays, tag first.
	LayoutArray Layout = iota
	// LayoutMap encodes events as maps with a "type" key.
	LayoutMap
)
