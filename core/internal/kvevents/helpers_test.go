package kvevents

import (
	"encoding/hex"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

// Tiny msgpack builders for hand-made payloads. They reuse the encoder's
// primitives, which are independently pinned by the golden hex tests and
// cross-checked against vmihailenco/msgpack in crosscheck_test.go.

func cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func arr(elems ...[]byte) []byte {
	return cat(append([][]byte{appendArrayLen(nil, len(elems))}, elems...)...)
}

// mp builds a map from alternating key, value parts.
func mp(kv ...[]byte) []byte {
	if len(kv)%2 != 0 {
		panic("mp: odd number of parts")
	}
	return cat(append([][]byte{appendMapLen(nil, len(kv)/2)}, kv...)...)
}

func str(s string) []byte  { return appendStr(nil, s) }
func u(v uint64) []byte    { return appendUint(nil, v) }
func i64(v int64) []byte   { return appendInt(nil, v) }
func f64(v float64) []byte { return appendFloat64(nil, v) }
func bin(p []byte) []byte  { return cat([]byte{0xc4, byte(len(p))}, p) }
func raw(h string) []byte  { return mustHex(h) }

var nilv = []byte{0xc0}

func ints(vs ...int64) []byte {
	parts := make([][]byte, len(vs))
	for i, v := range vs {
		parts[i] = i64(v)
	}
	return arr(parts...)
}

func uints(vs ...uint64) []byte {
	parts := make([][]byte, len(vs))
	for i, v := range vs {
		parts[i] = u(v)
	}
	return arr(parts...)
}

func seq(from, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(from + i)
	}
	return out
}

func seq32(from, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(from + i)
	}
	return out
}

func mustHex(s string) []byte {
	s = strings.NewReplacer(" ", "", "\n", "", "\t", "").Replace(s)
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

// stored returns a BlockStored with every optional field absent.
func stored(hashes []uint64, tokens []int32, bs int) Event {
	return Event{Kind: KindStored, TypeName: "BlockStored", BlockHashes: hashes, TokenIDs: tokens,
		BlockSize: bs, LoraID: -1, GroupIdx: -1}
}

// diffBatch describes the first difference between two batches ("" if equal),
// treating nil and empty slices alike.
func diffBatch(want, got *Batch) string {
	if math.Float64bits(want.TS) != math.Float64bits(got.TS) {
		return fmt.Sprintf("ts: want %v got %v", want.TS, got.TS)
	}
	if want.DPRank != got.DPRank {
		return fmt.Sprintf("dp_rank: want %d got %d", want.DPRank, got.DPRank)
	}
	if len(want.Events) != len(got.Events) {
		return fmt.Sprintf("events: want %d got %d", len(want.Events), len(got.Events))
	}
	for i := range want.Events {
		if d := diffEvent(&want.Events[i], &got.Events[i]); d != "" {
			return fmt.Sprintf("events[%d]: %s", i, d)
		}
	}
	return ""
}

func diffEvent(w, g *Event) string {
	switch {
	case w.Kind != g.Kind:
		return fmt.Sprintf("kind: want %v got %v", w.Kind, g.Kind)
	case w.TypeName != g.TypeName:
		return fmt.Sprintf("type name: want %q got %q", w.TypeName, g.TypeName)
	case !slices.Equal(w.BlockHashes, g.BlockHashes):
		return fmt.Sprintf("block_hashes: want %x got %x", w.BlockHashes, g.BlockHashes)
	case w.HasParent != g.HasParent || w.ParentBlockHash != g.ParentBlockHash:
		return fmt.Sprintf("parent: want %v/%x got %v/%x", w.HasParent, w.ParentBlockHash, g.HasParent, g.ParentBlockHash)
	case !slices.Equal(w.TokenIDs, g.TokenIDs):
		return fmt.Sprintf("token_ids: want %v got %v", w.TokenIDs, g.TokenIDs)
	case w.BlockSize != g.BlockSize:
		return fmt.Sprintf("block_size: want %d got %d", w.BlockSize, g.BlockSize)
	case w.LoraID != g.LoraID:
		return fmt.Sprintf("lora_id: want %d got %d", w.LoraID, g.LoraID)
	case w.Medium != g.Medium:
		return fmt.Sprintf("medium: want %q got %q", w.Medium, g.Medium)
	case w.LoraName != g.LoraName:
		return fmt.Sprintf("lora_name: want %q got %q", w.LoraName, g.LoraName)
	case !slices.Equal(w.ExtraKeys, g.ExtraKeys):
		return fmt.Sprintf("extra_keys: want %x got %x", w.ExtraKeys, g.ExtraKeys)
	case w.GroupIdx != g.GroupIdx:
		return fmt.Sprintf("group_idx: want %d got %d", w.GroupIdx, g.GroupIdx)
	case w.KVCacheSpecKind != g.KVCacheSpecKind:
		return fmt.Sprintf("kv_cache_spec_kind: want %q got %q", w.KVCacheSpecKind, g.KVCacheSpecKind)
	case w.HasSlidingWindow != g.HasSlidingWindow || w.SlidingWindow != g.SlidingWindow:
		return fmt.Sprintf("sliding window: want %v/%d got %v/%d", w.HasSlidingWindow, w.SlidingWindow, g.HasSlidingWindow, g.SlidingWindow)
	}
	return ""
}

func mustDecode(t testing.TB, p []byte) *Batch {
	t.Helper()
	b, err := Decode(p)
	if err != nil {
		t.Fatalf("decode %x: %v", p, err)
	}
	return b
}
