package kvevents

import (
	"bytes"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// randUint returns a uint64 whose width is itself random, so every msgpack
// integer form is exercised.
func randUint(r *rand.Rand) uint64 {
	switch r.IntN(6) {
	case 0:
		return r.Uint64N(128)
	case 1:
		return r.Uint64N(256)
	case 2:
		return r.Uint64N(1 << 16)
	case 3:
		return r.Uint64N(1 << 32)
	case 4:
		return r.Uint64() | 1<<63
	}
	return r.Uint64()
}

func randInt32(r *rand.Rand) int32 {
	switch r.IntN(4) {
	case 0:
		return int32(r.IntN(128))
	case 1:
		return int32(r.IntN(152000))
	case 2:
		return -int32(r.IntN(1 << 20))
	}
	return int32(r.Uint32())
}

var testMedia = []string{"", "GPU", "CPU", "STORAGE", "SHARED_STORAGE", "cuda:0", "cpu", "weird-medium"}

// randomBatch builds a valid batch (invariants hold) over every field.
func randomBatch(r *rand.Rand) *Batch {
	b := &Batch{TS: r.Float64() * 2e9, DPRank: -1}
	if r.IntN(4) == 0 {
		b.TS = float64(r.IntN(1 << 30))
	}
	if r.IntN(2) == 0 {
		b.DPRank = r.IntN(300)
	}
	n := r.IntN(12)
	if r.IntN(20) == 0 {
		n = 16 + r.IntN(40) // array16 headers
	}
	for range n {
		e := Event{LoraID: -1, GroupIdx: -1}
		switch k := r.IntN(10); {
		case k < 6:
			e.Kind, e.TypeName = KindStored, "BlockStored"
			nh := r.IntN(5)
			if r.IntN(10) == 0 {
				nh = r.IntN(40)
			}
			for range nh {
				e.BlockHashes = append(e.BlockHashes, randUint(r))
			}
			if r.IntN(2) == 0 {
				e.HasParent, e.ParentBlockHash = true, randUint(r)
			}
			e.BlockSize = []int{0, 1, 16, 16, 256, 1056}[r.IntN(6)]
			if e.BlockSize > 0 && nh > 0 && r.IntN(4) != 0 {
				nt := nh * e.BlockSize
				if r.IntN(4) == 0 { // LMCache partial last chunk
					nt -= r.IntN(e.BlockSize)
				}
				if nt > 20000 {
					nt = 0
				}
				for range nt {
					e.TokenIDs = append(e.TokenIDs, randInt32(r))
				}
			}
			if r.IntN(3) == 0 {
				e.LoraID = int64(randUint(r) >> 1)
				if r.IntN(2) == 0 {
					e.LoraID = -e.LoraID - 2
				}
			}
			if r.IntN(3) == 0 {
				e.LoraName = strings.Repeat("lora", r.IntN(20))
			}
			switch r.IntN(4) {
			case 1:
				e.ExtraKeys = NoneExtraKeys(nh)
			case 2:
				e.ExtraKeys = arr(arr(str("salt"), u(3), mp(str("k"), f64(1))), nilv)
			}
			if r.IntN(2) == 0 {
				e.GroupIdx = r.IntN(4)
			}
			if r.IntN(2) == 0 {
				e.KVCacheSpecKind = []string{"full_attention", "sliding_window", "mamba", "other"}[r.IntN(4)]
			}
			if r.IntN(3) == 0 {
				e.HasSlidingWindow, e.SlidingWindow = true, int(randInt32(r))
			}
		case k < 9:
			e.Kind, e.TypeName = KindRemoved, "BlockRemoved"
			for range 1 + r.IntN(3) {
				e.BlockHashes = append(e.BlockHashes, randUint(r))
			}
			if r.IntN(3) == 0 {
				e.GroupIdx = r.IntN(70000)
			}
		default:
			e.Kind, e.TypeName = KindCleared, "AllBlocksCleared"
		}
		if e.Kind != KindCleared {
			e.Medium = testMedia[r.IntN(len(testMedia))]
		}
		b.Events = append(b.Events, e)
	}
	return b
}

func TestRoundTripRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var reuse Batch
	for i := range 400 {
		want := randomBatch(r)
		for _, layout := range []Layout{LayoutArray, LayoutMap} {
			p, err := Encode(want, layout)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Decode(p)
			if err != nil {
				t.Fatalf("batch %d layout %d: %v\n%x", i, layout, err, p)
			}
			if d := diffBatch(want, got); d != "" {
				t.Fatalf("batch %d layout %d: %s", i, layout, d)
			}
			if err := DecodeInto(p, &reuse); err != nil {
				t.Fatal(err)
			}
			if d := diffBatch(want, &reuse); d != "" {
				t.Fatalf("batch %d layout %d (reused): %s", i, layout, d)
			}
			again, _ := Encode(got, layout)
			if !bytes.Equal(again, p) {
				t.Fatalf("batch %d layout %d: re-encoding differs", i, layout)
			}
		}
	}
}

// capture is one JSON KV-event capture from llm-d's integration tests.
type capture struct {
	EventType       string        `json:"event_type"`
	BlockHashes     []json.Number `json:"block_hashes"`
	ParentBlockHash *json.Number  `json:"parent_block_hash"`
	TokenIDs        []int32       `json:"token_ids"`
	BlockSize       int           `json:"block_size"`
	Medium          *string       `json:"medium"`
	LoraName        *string       `json:"lora_name"`
}

func loadCapture(t *testing.T, name string) Event {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var c capture
	if err := dec.Decode(&c); err != nil {
		t.Fatal(err)
	}
	if c.EventType != "BlockStored" {
		t.Fatalf("%s: event_type %q", name, c.EventType)
	}
	e := Event{Kind: KindStored, TypeName: c.EventType, TokenIDs: c.TokenIDs, BlockSize: c.BlockSize, LoraID: -1, GroupIdx: -1}
	for _, h := range c.BlockHashes {
		v, err := strconv.ParseUint(h.String(), 10, 64)
		if err != nil {
			t.Fatalf("%s: hash %s: %v", name, h, err)
		}
		e.BlockHashes = append(e.BlockHashes, v)
	}
	if c.ParentBlockHash != nil {
		v, err := strconv.ParseUint(c.ParentBlockHash.String(), 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		e.HasParent, e.ParentBlockHash = true, v
	}
	if c.Medium != nil {
		e.Medium = *c.Medium
	}
	if c.LoraName != nil {
		e.LoraName = *c.LoraName
	}
	return e
}

func TestCaptures(t *testing.T) {
	for _, tc := range []struct {
		file, loraName string
	}{{"kv_event_base.json", ""}, {"kv_event_lora.json", "Alice"}} {
		t.Run(tc.file, func(t *testing.T) {
			e := loadCapture(t, tc.file)
			if len(e.BlockHashes) != 25 || len(e.TokenIDs) != 400 || e.BlockSize != 16 || e.Medium != "GPU" ||
				e.HasParent || e.LoraName != tc.loraName {
				t.Fatalf("unexpected capture contents: %d hashes, %d tokens, bs %d, medium %q, parent %v, lora %q",
					len(e.BlockHashes), len(e.TokenIDs), e.BlockSize, e.Medium, e.HasParent, e.LoraName)
			}
			new026 := e // as vLLM 0.26 would send it
			new026.ExtraKeys, new026.GroupIdx, new026.KVCacheSpecKind = NoneExtraKeys(25), 0, "full_attention"
			for _, ev := range []Event{e, new026} {
				want := &Batch{TS: 1789095808.8378847, Events: []Event{ev}, DPRank: 0}
				for _, layout := range []Layout{LayoutArray, LayoutMap} {
					p, err := Encode(want, layout)
					if err != nil {
						t.Fatal(err)
					}
					got := mustDecode(t, p)
					if d := diffBatch(want, got); d != "" {
						t.Fatalf("layout %d: %s", layout, d)
					}
					// Independent decoder: the generic view must match the JSON.
					var generic []any
					if err := msgpack.Unmarshal(p, &generic); err != nil {
						t.Fatal(err)
					}
					var hashes []any
					if layout == LayoutArray {
						hashes = generic[1].([]any)[0].([]any)[1].([]any)
					} else {
						m := generic[1].([]any)[0].(map[string]any)
						if m["type"] != "BlockStored" || m["medium"] != "GPU" {
							t.Fatalf("generic map view: %v", m)
						}
						hashes = m["block_hashes"].([]any)
					}
					for i, h := range hashes {
						if asUint64(h) != ev.BlockHashes[i] {
							t.Fatalf("hash %d: msgpack says %v, JSON says %d", i, h, ev.BlockHashes[i])
						}
					}
				}
			}
		})
	}
}

func asUint64(v any) uint64 {
	switch x := v.(type) {
	case uint64:
		return x
	case int64:
		return uint64(x)
	case uint8:
		return uint64(x)
	case uint16:
		return uint64(x)
	case uint32:
		return uint64(x)
	case int8:
		return uint64(int64(x))
	case int16:
		return uint64(int64(x))
	case int32:
		return uint64(int64(x))
	}
	return math.MaxUint64 - 12345
}

// TestCrossCheckVmihailenco decodes payloads produced by an independent
// msgpack encoder, with both compact and fixed-width integers and with Go
// maps (random key order, so "type" is often not first).
func TestCrossCheckVmihailenco(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for i := range 200 {
		want := randomBatch(r)
		events := []any{}
		for j := range want.Events {
			e := &want.Events[j]
			events = append(events, genericEvent(e, j%2 == 0))
		}
		batch := []any{want.TS, events}
		if want.DPRank >= 0 {
			batch = append(batch, want.DPRank)
		}
		for _, compact := range []bool{false, true} {
			var buf bytes.Buffer
			enc := msgpack.NewEncoder(&buf)
			enc.UseCompactInts(compact)
			if err := enc.Encode(batch); err != nil {
				t.Fatal(err)
			}
			got, err := Decode(buf.Bytes())
			if err != nil {
				t.Fatalf("batch %d compact=%v: %v", i, compact, err)
			}
			if d := diffBatch(want, got); d != "" {
				t.Fatalf("batch %d compact=%v: %s", i, compact, d)
			}
		}
	}
}

func genericEvent(e *Event, asMap bool) any {
	var hashes []any
	for _, h := range e.BlockHashes {
		if h >= 1<<63 && len(hashes)%2 == 0 {
			hashes = append(hashes, int64(h)) // negative int, as LMCache sends
		} else {
			hashes = append(hashes, h)
		}
	}
	opt := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	var parent, lora, group, window, extra any
	if e.HasParent {
		parent = e.ParentBlockHash
	}
	if e.LoraID != -1 {
		lora = e.LoraID
	}
	if e.GroupIdx != -1 {
		group = e.GroupIdx
	}
	if e.HasSlidingWindow {
		window = e.SlidingWindow
	}
	if len(e.ExtraKeys) > 0 {
		extra = msgpack.RawMessage(e.ExtraKeys)
	}
	tokens := make([]any, len(e.TokenIDs))
	for i, tk := range e.TokenIDs {
		tokens[i] = tk
	}
	switch e.Kind {
	case KindStored:
		if asMap {
			return map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
				"token_ids": tokens, "block_size": e.BlockSize, "lora_id": lora, "medium": opt(e.Medium),
				"lora_name": opt(e.LoraName), "extra_keys": extra, "group_idx": group,
				"kv_cache_spec_kind": opt(e.KVCacheSpecKind), "kv_cache_spec_sliding_window": window,
				"unknown_future_key": []any{map[string]any{"x": 1.5}}}
		}
		return []any{"BlockStored", hashes, parent, tokens, e.BlockSize, lora, opt(e.Medium), opt(e.LoraName),
			extra, group, opt(e.KVCacheSpecKind), window, "extra-positional"}
	case KindRemoved:
		if asMap {
			return map[string]any{"block_hashes": hashes, "medium": opt(e.Medium), "group_idx": group, "type": "BlockRemoved"}
		}
		return []any{"BlockRemoved", hashes, opt(e.Medium), group}
	}
	if asMap {
		return map[string]any{"type": "AllBlocksCleared"}
	}
	return []any{"AllBlocksCleared"}
}
