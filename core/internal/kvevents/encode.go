package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Encode serialises b exactly as vLLM's msgspec encoder does (reference
// §2.5): the batch is always a positional array [ts, events(, dp_rank)],
// dp_rank omitted when b.DPRank == -1; events follow layout:
//
//   - LayoutArray: [class name, fields in declaration order...], dropping
//     only trailing fields equal to their default (the first 7 BlockStored
//     fields and both BlockRemoved fields have no default and are always
//     written, nil when absent);
//   - LayoutMap: {"type": class name, fields in declaration order...},
//     dropping every defaulted field equal to its default.
//
// Absent values (LoraID/GroupIdx -1, Medium/LoraName/KVCacheSpecKind "",
// HasParent/HasSlidingWindow false, empty ExtraKeys) are written as nil.
// Integers use the smallest msgpack form (hashes >= 2^63 as uint64 0xcf),
// ts is always float64 (0xcb). Events of KindUnknown cannot be encoded.
func Encode(b *Batch, layout Layout) ([]byte, error) {
	return AppendEncode(make([]byte, 0, encodedSizeHint(b)), b, layout)
}

// AppendEncode appends the encoding of b (see Encode) to dst.
func AppendEncode(dst []byte, b *Batch, layout Layout) ([]byte, error) {
	if b == nil {
		return dst, errors.New("kvevents: encode: nil batch")
	}
	if layout != LayoutArray && layout != LayoutMap {
		return dst, fmt.Errorf("kvevents: encode: unknown layout %d", layout)
	}
	n := 2
	if b.DPRank != -1 {
		n = 3
	}
	dst = appendArrayLen(dst, n)
	dst = appendFloat64(dst, b.TS)
	dst = appendArrayLen(dst, len(b.Events))
	var err error
	for i := range b.Events {
		if dst, err = appendEvent(dst, &b.Events[i], layout); err != nil {
			return dst, fmt.Errorf("kvevents: encode: events[%d]: %w", i, err)
		}
	}
	if n == 3 {
		dst = appendInt(dst, int64(b.DPRank))
	}
	return dst, nil
}

func encodedSizeHint(b *Batch) int {
	if b == nil {
		return 0
	}
	n := 16
	for i := range b.Events {
		e := &b.Events[i]
		n += 64 + 9*len(e.BlockHashes) + 5*len(e.TokenIDs) + len(e.ExtraKeys) + len(e.LoraName)
	}
	if e := len(b.Events); e > 0 {
		n += 200 * e // map keys
	}
	return n
}

// isDefault reports whether field f of e equals its msgspec default. Fields
// without a default are never "default".
func isDefault(e *Event, f fieldID) bool {
	switch f {
	case fExtraKeys:
		return len(e.ExtraKeys) == 0
	case fGroupIdx:
		return e.GroupIdx == -1
	case fSpecKind:
		return e.KVCacheSpecKind == ""
	case fSlidingWindow:
		return !e.HasSlidingWindow
	}
	return false
}

func appendEvent(dst []byte, e *Event, layout Layout) ([]byte, error) {
	fields := kindFields(e.Kind)
	if e.Kind == KindUnknown || (e.Kind != KindCleared && fields == nil) {
		return dst, fmt.Errorf("cannot encode event kind %v (%q)", e.Kind, e.TypeName)
	}
	if len(e.ExtraKeys) > 0 {
		d := dec{b: e.ExtraKeys, ev: -1, idx: -1}
		if err := d.skip(); err != nil || d.off != len(e.ExtraKeys) {
			return dst, errors.New("ExtraKeys is not exactly one msgpack value")
		}
	}
	tag := e.Kind.String()
	if layout == LayoutArray {
		last := len(fields)
		for last > 0 && isDefault(e, fields[last-1]) {
			last--
		}
		dst = appendArrayLen(dst, 1+last)
		dst = appendStr(dst, tag)
		for _, f := range fields[:last] {
			dst = appendField(dst, e, f)
		}
		return dst, nil
	}
	n := 1
	for _, f := range fields {
		if !isDefault(e, f) {
			n++
		}
	}
	dst = appendMapLen(dst, n)
	dst = appendStr(dst, "type")
	dst = appendStr(dst, tag)
	for _, f := range fields {
		if isDefault(e, f) {
			continue
		}
		dst = appendStr(dst, fieldNames[f])
		dst = appendField(dst, e, f)
	}
	return dst, nil
}

func appendField(dst []byte, e *Event, f fieldID) []byte {
	switch f {
	case fHashes:
		dst = appendArrayLen(dst, len(e.BlockHashes))
		for _, h := range e.BlockHashes {
			dst = appendUint(dst, h)
		}
	case fParent:
		if !e.HasParent {
			return append(dst, 0xc0)
		}
		dst = appendUint(dst, e.ParentBlockHash)
	case fTokens:
		dst = appendArrayLen(dst, len(e.TokenIDs))
		for _, t := range e.TokenIDs {
			dst = appendInt(dst, int64(t))
		}
	case fBlockSize:
		dst = appendInt(dst, int64(e.BlockSize))
	case fLoraID:
		if e.LoraID == -1 {
			return append(dst, 0xc0)
		}
		dst = appendInt(dst, e.LoraID)
	case fMedium:
		dst = appendOptStr(dst, e.Medium)
	case fLoraName:
		dst = appendOptStr(dst, e.LoraName)
	case fExtraKeys:
		if len(e.ExtraKeys) == 0 {
			return append(dst, 0xc0)
		}
		dst = append(dst, e.ExtraKeys...)
	case fGroupIdx:
		if e.GroupIdx == -1 {
			return append(dst, 0xc0)
		}
		dst = appendInt(dst, int64(e.GroupIdx))
	case fSpecKind:
		dst = appendOptStr(dst, e.KVCacheSpecKind)
	case fSlidingWindow:
		if !e.HasSlidingWindow {
			return append(dst, 0xc0)
		}
		dst = appendInt(dst, int64(e.SlidingWindow))
	}
	return dst
}

// NoneExtraKeys returns the msgpack encoding of [None]*blocks, the
// extra_keys value vLLM (since PR #33304) sends for text-only requests.
func NoneExtraKeys(blocks int) []byte {
	b := appendArrayLen(make([]byte, 0, 5+blocks), blocks)
	for i := 0; i < blocks; i++ {
		b = append(b, 0xc0)
	}
	return b
}

func appendArrayLen(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x90|byte(n))
	case n <= math.MaxUint16:
		return append(dst, 0xdc, byte(n>>8), byte(n))
	}
	return binary.BigEndian.AppendUint32(append(dst, 0xdd), uint32(n))
}

func appendMapLen(dst []byte, n int) []byte {
	switch {
	case n < 16:
		return append(dst, 0x80|byte(n))
	case n <= math.MaxUint16:
		return append(dst, 0xde, byte(n>>8), byte(n))
	}
	return binary.BigEndian.AppendUint32(append(dst, 0xdf), uint32(n))
}

func appendStr(dst []byte, s string) []byte {
	n := len(s)
	switch {
	case n < 32:
		dst = append(dst, 0xa0|byte(n))
	case n <= math.MaxUint8:
		dst = append(dst, 0xd9, byte(n))
	case n <= math.MaxUint16:
		dst = append(dst, 0xda, byte(n>>8), byte(n))
	default:
		dst = binary.BigEndian.AppendUint32(append(dst, 0xdb), uint32(n))
	}
	return append(dst, s...)
}

func appendOptStr(dst []byte, s string) []byte {
	if s == "" {
		return append(dst, 0xc0)
	}
	return appendStr(dst, s)
}

func appendUint(dst []byte, v uint64) []byte {
	switch {
	case v <= 0x7f:
		return append(dst, byte(v))
	case v <= math.MaxUint8:
		return append(dst, 0xcc, byte(v))
	case v <= math.MaxUint16:
		return append(dst, 0xcd, byte(v>>8), byte(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(dst, 0xce), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(dst, 0xcf), v)
}

func appendInt(dst []byte, v int64) []byte {
	switch {
	case v >= 0:
		return appendUint(dst, uint64(v))
	case v >= -32:
		return append(dst, byte(v))
	case v >= math.MinInt8:
		return append(dst, 0xd0, byte(v))
	case v >= math.MinInt16:
		return append(dst, 0xd1, byte(v>>8), byte(v))
	case v >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(dst, 0xd2), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(dst, 0xd3), uint64(v))
}

func appendFloat64(dst []byte, f float64) []byte {
	return binary.BigEndian.AppendUint64(append(dst, 0xcb), math.Float64bits(f))
}
