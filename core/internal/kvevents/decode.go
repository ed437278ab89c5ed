package kvevents

import (
	"encoding/binary"
	"errors"
	"math"
)

// Limits bounds what a decoder will accept, and so how much it can allocate.
// A zero field takes its DefaultLimits value. Independently of these bounds,
// every declared array/map/string length is checked against the bytes that
// remain before anything is allocated, so allocation is at most a small
// multiple of the payload size.
type Limits struct {
	// MaxPayloadBytes rejects larger payloads outright (default 64 MiB).
	MaxPayloadBytes int
	// MaxEvents bounds the events of one batch (default 1<<17).
	MaxEvents int
	// MaxHashesPerEvent bounds block_hashes of one event (default 1<<20).
	MaxHashesPerEvent int
	// MaxTokensPerEvent bounds token_ids of one event (default 1<<22, i.e. a
	// 4M-token run; vLLM emits one event per run of newly full blocks).
	MaxTokensPerEvent int
}

// DefaultLimits are the bounds used by Decode and DecodeInto.
var DefaultLimits = Limits{
	MaxPayloadBytes:   64 << 20,
	MaxEvents:         1 << 17,
	MaxHashesPerEvent: 1 << 20,
	MaxTokensPerEvent: 1 << 22,
}

func (l Limits) withDefaults() Limits {
	if l.MaxPayloadBytes <= 0 {
		l.MaxPayloadBytes = DefaultLimits.MaxPayloadBytes
	}
	if l.MaxEvents <= 0 {
		l.MaxEvents = DefaultLimits.MaxEvents
	}
	if l.MaxHashesPerEvent <= 0 {
		l.MaxHashesPerEvent = DefaultLimits.MaxHashesPerEvent
	}
	if l.MaxTokensPerEvent <= 0 {
		l.MaxTokensPerEvent = DefaultLimits.MaxTokensPerEvent
	}
	return l
}

// Decode parses one msgpack KVEventBatch payload (ZMQ frame 2) with
// DefaultLimits. See DecodeInto for the accepted layouts.
func Decode(payload []byte) (*Batch, error) {
	return DefaultLimits.Decode(payload)
}

// DecodeInto is Decode into b, reusing b.Events and each event's slices
// (block hashes, token ids, extra keys) to avoid allocation on the hot path.
// Anything previously obtained from b is overwritten. On error b holds a
// partial result and must not be used.
//
// Accepted input:
//
//   - the batch as a positional array [ts, events] or [ts, events, dp_rank]
//     (dp_rank may be nil; further elements are ignored), or as a map with keys
//     "ts", "events" and optional "data_parallel_rank" (unknown keys ignored);
//     ts may be a float or an int;
//
//   - each event as a positional array (class name, then fields in
//     declaration order; trailing fields may be missing, extra ones are
//     ignored) or as a map with a "type" key (any position) and field names
//     (missing fields take their default, unknown keys are ignored);
//
//   - hashes as any msgpack int (negative ones as two's complement) or as
//     bin/str (last 8 bytes big-endian, shorter values left-padded);
//
//   - unknown class names, kept as KindUnknown with TypeName set and no fields.
//
//   - token ids as ints, or as SGLang's speculative-decoding bigram pairs
//     [t_j, t_j+1] (Event.Bigram; TokenIDs gets t_j).
//
// Invariant checked for BlockStored with token ids and block_size > 0:
// ceil(len(token_ids)/block_size) == len(block_hashes). This admits vLLM's
// exact len(token_ids) == len(block_hashes)*block_size and LMCache's chunk
// events whose last chunk is partial ((n-1)*bs < len(token_ids) <= n*bs).
// An event of a non-full-attention group (kv_cache_spec_kind
// sliding_window, mamba) may list fewer hashes: those of the run's last
// blocks, the ones the group kept.
//
// Per event, not per batch: an event that violates the invariant, has a
// field of the wrong type or out of range, or exceeds a per-event limit is
// kept with Drop set (and DropErr saying why) and the batch decodes on.
// The batch is rejected only when the payload itself is unusable: not
// msgpack, truncated, trailing bytes, a wrong batch shape, or the
// payload / event-count limits. Every such error wraps ErrMalformed (and
// ErrLimit when only a Limits bound was exceeded) and is a *DecodeError
// naming the byte offset and the value.
func DecodeInto(payload []byte, b *Batch) error {
	return DefaultLimits.DecodeInto(payload, b)
}

// Decode is the package-level Decode with these limits.
func (l Limits) Decode(payload []byte) (*Batch, error) {
	b := new(Batch)
	if err := l.DecodeInto(payload, b); err != nil {
		return nil, err
	}
	return b, nil
}

// DecodeInto is the package-level DecodeInto with these limits.
func (l Limits) DecodeInto(payload []byte, b *Batch) error {
	d := dec{b: payload, lim: l.withDefaults(), ev: -1, idx: -1}
	b.TS = 0
	b.DPRank = -1
	b.Events = b.Events[:0]
	if len(payload) > d.lim.MaxPayloadBytes {
		return d.limitf("payload of %d bytes exceeds limit %d", len(payload), d.lim.MaxPayloadBytes)
	}
	c, err := d.peek()
	if err != nil {
		return err
	}
	switch kindName(c) {
	case "array":
		err = d.arrayBatch(b)
	case "map":
		err = d.mapBatch(b)
	default:
		return d.errf("batch: want array or map, got %s", kindName(c))
	}
	if err != nil {
		return err
	}
	if d.off != len(d.b) {
		d.ev, d.field, d.idx = -1, "", -1
		return d.errf("trailing garbage: %d bytes after the batch", len(d.b)-d.off)
	}
	return nil
}

func (d *dec) arrayBatch(b *Batch) error {
	n, err := d.arrayLen("batch")
	if err != nil {
		return err
	}
	if n < 2 {
		return d.errf("batch array has %d elements, want [ts, events] or [ts, events, dp_rank]", n)
	}
	d.field = "ts"
	if b.TS, err = d.float("ts"); err != nil {
		return err
	}
	d.field = ""
	if err := d.events(b); err != nil {
		return err
	}
	if n >= 3 {
		d.field = "data_parallel_rank"
		if err := d.dpRank(b); err != nil {
			return err
		}
		d.field = ""
		for i := 3; i < n; i++ { // fields added by future versions
			if err := d.skip(); err != nil {
				return err
			}
		}
	}
	return nil
}

func (d *dec) mapBatch(b *Batch) error {
	n, err := d.mapLen("batch")
	if err != nil {
		return err
	}
	var haveTS, haveEvents bool
	for i := 0; i < n; i++ {
		d.field = ""
		k, err := d.strBytes("batch map key")
		if err != nil {
			return err
		}
		switch string(k) {
		case "ts":
			d.field = "ts"
			if b.TS, err = d.float("ts"); err != nil {
				return err
			}
			haveTS = true
		case "events":
			if err := d.events(b); err != nil {
				return err
			}
			haveEvents = true
		case "data_parallel_rank":
			d.field = "data_parallel_rank"
			if err := d.dpRank(b); err != nil {
				return err
			}
		default:
			if err := d.skip(); err != nil {
				return err
			}
		}
	}
	d.ev, d.field, d.idx = -1, "", -1
	if !haveTS {
		return d.errf("batch map has no \"ts\"")
	}
	if !haveEvents {
		return d.errf("batch map has no \"events\"")
	}
	return nil
}

func (d *dec) dpRank(b *Batch) error {
	if d.isNil() {
		b.DPRank = -1
		return nil
	}
	v, err := d.int64v("data_parallel_rank")
	if err != nil {
		return err
	}
	if v < 0 || v > math.MaxInt32 {
		return d.errf("data_parallel_rank %d out of range", v)
	}
	b.DPRank = int(v)
	return nil
}

func (d *dec) events(b *Batch) error {
	d.field = "events"
	n, err := d.arrayLen("events")
	if err != nil {
		return err
	}
	if n > d.lim.MaxEvents {
		return d.limitf("%d events exceed limit %d", n, d.lim.MaxEvents)
	}
	d.field = ""
	if cap(b.Events) < n {
		evs := make([]Event, n)
		copy(evs, b.Events[:cap(b.Events)]) // keep the old events' buffers
		b.Events = evs
	} else {
		b.Events = b.Events[:n]
	}
	for i := range b.Events {
		d.ev = i
		start := d.off
		err := d.event(&b.Events[i])
		if err == nil {
			continue
		}
		// One unusable event must not cost the batch its other events
		// (vLLM puts every KV-cache group's events of a step in one batch):
		// if the event is well-formed msgpack it is skipped whole and kept,
		// marked dropped. Only a payload that cannot be walked past the
		// event (truncated, invalid codes) rejects the batch.
		end := d.off
		d.off = start
		if serr := d.skip(); serr != nil {
			d.off = end
			return err
		}
		e := &b.Events[i]
		e.Drop, e.DropErr = dropReason(err), err
	}
	d.ev = -1
	return nil
}

// dropReason classifies an event-level decode error.
func dropReason(err error) DropReason {
	var de *DecodeError
	if errors.As(err, &de) {
		switch {
		case de.Limit:
			return DropLimit
		case de.tokenCount:
			return DropTokenCount
		}
	}
	return DropMalformed
}

// field identifiers, in BlockStored declaration order.
type fieldID uint8

const (
	fHashes fieldID = iota
	fParent
	fTokens
	fBlockSize
	fLoraID
	fMedium
	fLoraName
	fExtraKeys
	fGroupIdx
	fSpecKind
	fSlidingWindow
	fNone // unknown / not a field of this kind
)

var fieldNames = [...]string{
	fHashes:        "block_hashes",
	fParent:        "parent_block_hash",
	fTokens:        "token_ids",
	fBlockSize:     "block_size",
	fLoraID:        "lora_id",
	fMedium:        "medium",
	fLoraName:      "lora_name",
	fExtraKeys:     "extra_keys",
	fGroupIdx:      "group_idx",
	fSpecKind:      "kv_cache_spec_kind",
	fSlidingWindow: "kv_cache_spec_sliding_window",
}

// Declaration order of each kind's fields (positional layout).
var (
	storedFields  = []fieldID{fHashes, fParent, fTokens, fBlockSize, fLoraID, fMedium, fLoraName, fExtraKeys, fGroupIdx, fSpecKind, fSlidingWindow}
	removedFields = []fieldID{fHashes, fMedium, fGroupIdx}
)

func kindFields(k Kind) []fieldID {
	switch k {
	case KindStored:
		return storedFields
	case KindRemoved:
		return removedFields
	}
	return nil
}

// fieldByName maps a map key to a field of kind k, or fNone.
func fieldByName(k Kind, name []byte) fieldID {
	var f fieldID
	switch string(name) {
	case "block_hashes":
		f = fHashes
	case "parent_block_hash":
		f = fParent
	case "token_ids":
		f = fTokens
	case "block_size":
		f = fBlockSize
	case "lora_id":
		f = fLoraID
	case "medium":
		f = fMedium
	case "lora_name":
		f = fLoraName
	case "extra_keys":
		f = fExtraKeys
	case "group_idx":
		f = fGroupIdx
	case "kv_cache_spec_kind":
		f = fSpecKind
	case "kv_cache_spec_sliding_window":
		f = fSlidingWindow
	default:
		return fNone
	}
	switch k {
	case KindStored:
		return f
	case KindRemoved:
		if f == fHashes || f == fMedium || f == fGroupIdx {
			return f
		}
	}
	return fNone
}

// kindOf maps a class name to its Kind and a non-allocating TypeName.
func kindOf(tag []byte) (Kind, string) {
	switch string(tag) {
	case "BlockStored":
		return KindStored, "BlockStored"
	case "BlockRemoved":
		return KindRemoved, "BlockRemoved"
	case "AllBlocksCleared":
		return KindCleared, "AllBlocksCleared"
	}
	return KindUnknown, string(tag)
}

// resetEvent clears e to every field's default, keeping slice capacity.
func resetEvent(e *Event) {
	*e = Event{
		BlockHashes: e.BlockHashes[:0],
		TokenIDs:    e.TokenIDs[:0],
		ExtraKeys:   e.ExtraKeys[:0],
		LoraID:      -1,
		GroupIdx:    -1,
	}
}

func (d *dec) event(e *Event) error {
	resetEvent(e)
	d.field, d.idx = "", -1
	c, err := d.peek()
	if err != nil {
		return err
	}
	switch kindName(c) {
	case "array":
		err = d.arrayEvent(e)
	case "map":
		err = d.mapEvent(e)
	default:
		return d.errf("event: want array or map, got %s", kindName(c))
	}
	if err != nil {
		return err
	}
	d.field, d.idx = "", -1
	if e.Kind == KindStored && len(e.TokenIDs) > 0 && e.BlockSize > 0 {
		nt, bs := len(e.TokenIDs), e.BlockSize
		blocks := nt / bs
		if nt%bs != 0 {
			blocks++
		}
		nh := len(e.BlockHashes)
		// A sliding-window (or other non-full) group's event lists only the
		// blocks the group kept, the last ones of the run, while token_ids
		// cover the whole run (vLLM 0.32, hybrid models).
		if nh != blocks && !(e.KVCacheSpecKind != "" && e.KVCacheSpecKind != SpecFullAttention && nh < blocks) {
			err := d.errf("BlockStored has %d token ids for %d block hashes of block_size %d", nt, nh, bs)
			err.(*DecodeError).tokenCount = true
			return err
		}
	}
	return nil
}

func (d *dec) arrayEvent(e *Event) error {
	n, err := d.arrayLen("event")
	if err != nil {
		return err
	}
	if n == 0 {
		return d.errf("event: empty array has no type tag")
	}
	d.field = "type"
	tag, err := d.strBytes("event type tag")
	if err != nil {
		return err
	}
	e.Kind, e.TypeName = kindOf(tag)
	fields := kindFields(e.Kind)
	for i := 1; i < n; i++ {
		if i-1 < len(fields) {
			if err := d.field1(e, fields[i-1]); err != nil {
				return err
			}
			continue
		}
		d.field, d.idx = "", -1
		if err := d.skip(); err != nil { // extra fields from newer versions
			return err
		}
	}
	return nil
}

func (d *dec) mapEvent(e *Event) error {
	n, err := d.mapLen("event")
	if err != nil {
		return err
	}
	start := d.off
	// msgspec writes "type" first; other encoders may not, so fall back to a scan.
	found := false
	for i := 0; i < n && !found; i++ {
		d.field = ""
		k, err := d.strBytes("event map key")
		if err != nil {
			return err
		}
		if string(k) == "type" {
			d.field = "type"
			tag, err := d.strBytes("event type tag")
			if err != nil {
				return err
			}
			e.Kind, e.TypeName = kindOf(tag)
			found = true
			break
		}
		if err := d.skip(); err != nil {
			return err
		}
	}
	if !found {
		d.field = ""
		return d.errf("event map has no \"type\" key")
	}
	d.off = start
	for i := 0; i < n; i++ {
		d.field, d.idx = "", -1
		k, err := d.strBytes("event map key")
		if err != nil {
			return err
		}
		if string(k) == "type" { // decoded above; a duplicate is ignored
			if err := d.skip(); err != nil {
				return err
			}
			continue
		}
		f := fieldByName(e.Kind, k)
		if f == fNone {
			if err := d.skip(); err != nil {
				return err
			}
			continue
		}
		if err := d.field1(e, f); err != nil {
			return err
		}
	}
	return nil
}

// field1 decodes the value of field f into e.
func (d *dec) field1(e *Event, f fieldID) error {
	d.field, d.idx = fieldNames[f], -1
	switch f {
	case fHashes:
		return d.hashes(e)
	case fParent:
		if d.isNil() {
			e.HasParent, e.ParentBlockHash = false, 0
			return nil
		}
		v, err := d.hash("parent_block_hash")
		if err != nil {
			return err
		}
		e.HasParent, e.ParentBlockHash = true, v
	case fTokens:
		return d.tokens(e)
	case fBlockSize:
		if d.isNil() {
			e.BlockSize = 0
			return nil
		}
		v, err := d.int64v("block_size")
		if err != nil {
			return err
		}
		if v < 0 || v > math.MaxInt32 {
			return d.errf("block_size %d out of range", v)
		}
		e.BlockSize = int(v)
	case fLoraID:
		if d.isNil() {
			e.LoraID = -1
			return nil
		}
		v, err := d.int64v("lora_id")
		if err != nil {
			return err
		}
		e.LoraID = v
	case fMedium:
		s, err := d.optStr()
		if err != nil {
			return err
		}
		e.Medium = internMedium(s)
	case fLoraName:
		s, err := d.optStr()
		if err != nil {
			return err
		}
		e.LoraName = string(s)
	case fExtraKeys:
		e.ExtraKeys = e.ExtraKeys[:0]
		if d.isNil() {
			return nil
		}
		c, err := d.peek()
		if err != nil {
			return err
		}
		if kindName(c) != "array" {
			return d.errf("extra_keys: want array or nil, got %s", kindName(c))
		}
		start := d.off
		if err := d.skip(); err != nil {
			return err
		}
		e.ExtraKeys = append(e.ExtraKeys, d.b[start:d.off]...)
	case fGroupIdx:
		if d.isNil() {
			e.GroupIdx = -1
			return nil
		}
		v, err := d.int64v("group_idx")
		if err != nil {
			return err
		}
		if v < math.MinInt32 || v > math.MaxInt32 {
			return d.errf("group_idx %d out of range", v)
		}
		e.GroupIdx = int(v)
	case fSpecKind:
		s, err := d.optStr()
		if err != nil {
			return err
		}
		e.KVCacheSpecKind = internSpecKind(s)
	case fSlidingWindow:
		if d.isNil() {
			e.HasSlidingWindow, e.SlidingWindow = false, 0
			return nil
		}
		v, err := d.int64v("kv_cache_spec_sliding_window")
		if err != nil {
			return err
		}
		if v < math.MinInt32 || v > math.MaxInt32 {
			return d.errf("kv_cache_spec_sliding_window %d out of range", v)
		}
		e.HasSlidingWindow, e.SlidingWindow = true, int(v)
	}
	return nil
}

// optStr reads a str or nil (returned as nil).
func (d *dec) optStr() ([]byte, error) {
	if d.isNil() {
		return nil, nil
	}
	return d.strBytes(d.field)
}

func (d *dec) hashes(e *Event) error {
	e.BlockHashes = e.BlockHashes[:0]
	if d.isNil() {
		return nil
	}
	n, err := d.arrayLen("block_hashes")
	if err != nil {
		return err
	}
	if n > d.lim.MaxHashesPerEvent {
		return d.limitf("%d block hashes exceed limit %d", n, d.lim.MaxHashesPerEvent)
	}
	hs := grow(e.BlockHashes, n)
	for i := range hs {
		b := d.b
		if off := d.off; off+9 <= len(b) && b[off] == 0xcf {
			hs[i] = binary.BigEndian.Uint64(b[off+1:])
			d.off = off + 9
			continue
		}
		d.idx = i
		if hs[i], err = d.hash("block hash"); err != nil {
			return err
		}
	}
	d.idx = -1
	e.BlockHashes = hs
	return nil
}

func (d *dec) tokens(e *Event) error {
	e.TokenIDs = e.TokenIDs[:0]
	if d.isNil() {
		return nil
	}
	n, err := d.arrayLen("token_ids")
	if err != nil {
		return err
	}
	if n > d.lim.MaxTokensPerEvent {
		return d.limitf("%d token ids exceed limit %d", n, d.lim.MaxTokensPerEvent)
	}
	ts := grow(e.TokenIDs, n)
	b := d.b
	off := d.off
	for i := range ts {
		if off >= len(b) {
			d.off, d.idx = off, i
			return d.truncated(1)
		}
		c := b[off]
		switch {
		case c <= 0x7f:
			ts[i] = int32(c)
			off++
			continue
		case c == 0xce && off+5 <= len(b):
			v := binary.BigEndian.Uint32(b[off+1:])
			if v <= math.MaxInt32 {
				ts[i] = int32(v)
				off += 5
				continue
			}
		case c == 0xcd && off+3 <= len(b):
			ts[i] = int32(binary.BigEndian.Uint16(b[off+1:]))
			off += 3
			continue
		case c == 0xcc && off+2 <= len(b):
			ts[i] = int32(b[off+1])
			off += 2
			continue
		}
		// Slow path: other widths, negatives, bigram pairs, errors.
		d.off, d.idx = off, i
		if c == 0x92 { // SGLang EAGLE/MTP bigram key [t_j, t_j+1]
			d.off++
			e.Bigram = true
			v, err := d.tokenID()
			if err != nil {
				return err
			}
			if _, err := d.tokenID(); err != nil {
				return err
			}
			ts[i] = v
			off = d.off
			continue
		}
		bits, signed, err := d.integer("token id")
		if err != nil {
			return err
		}
		v := int64(bits)
		if (!signed && bits > math.MaxInt32) || v < math.MinInt32 || v > math.MaxInt32 {
			d.off = off
			if signed {
				return d.errf("token id %d outside int32", v)
			}
			return d.errf("token id %d outside int32", bits)
		}
		ts[i] = int32(v)
		off = d.off
	}
	d.off, d.idx = off, -1
	e.TokenIDs = ts
	return nil
}

// tokenID reads one token id (any int width) that must fit int32.
func (d *dec) tokenID() (int32, error) {
	at := d.off
	bits, signed, err := d.integer("token id")
	if err != nil {
		return 0, err
	}
	v := int64(bits)
	if (!signed && bits > math.MaxInt32) || v < math.MinInt32 || v > math.MaxInt32 {
		d.off = at
		return 0, d.errf("token id %d outside int32", bits)
	}
	return int32(v), nil
}

// grow returns s resized to n, reusing its array when large enough and
// otherwise allocating exactly n elements.
func grow[T any](s []T, n int) []T {
	if cap(s) >= n {
		return s[:n]
	}
	return make([]T, n)
}

// internMedium returns a constant string for well-known media.
func internMedium(s []byte) string {
	switch string(s) {
	case "":
		return ""
	case "GPU":
		return "GPU"
	case "CPU":
		return "CPU"
	case "STORAGE":
		return "STORAGE"
	case "DISK":
		return "DISK"
	case "SHARED_STORAGE":
		return "SHARED_STORAGE"
	case "OBJECT_STORE":
		return "OBJECT_STORE"
	case "CPU_PINNED":
		return "CPU_PINNED"
	case "EXTERNAL":
		return "EXTERNAL"
	case "cpu":
		return "cpu"
	case "cuda":
		return "cuda"
	case "cuda:0":
		return "cuda:0"
	}
	return string(s)
}

// Known kv_cache_spec_kind values (vLLM's KV-cache group kinds).
const (
	SpecFullAttention = "full_attention"
	SpecSlidingWindow = "sliding_window"
	SpecMamba         = "mamba"
)

func internSpecKind(s []byte) string {
	switch string(s) {
	case "":
		return ""
	case SpecFullAttention:
		return SpecFullAttention
	case SpecSlidingWindow:
		return SpecSlidingWindow
	case SpecMamba:
		return SpecMamba
	}
	return string(s)
}
