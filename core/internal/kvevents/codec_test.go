package kvevents

import (
	"bytes"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"testing"
)

// Reference §2.7 byte-level examples.
const (
	goldenTS   = 1789095808.8378847
	goldenHash = 0xDEADBEEFCAFEBABE

	// (a) positional payload, tag + 7 fields, dp_rank 0 (62 bytes).
	goldenA = "93cb41daa8dbe0359fe79198ab426c6f636b53746f72656491cfdeadbeefcafebabec0dc00100102030405060708090a0b0c0d0e0f1010c0a3475055c000"
	// (b) map payload with the 0.26 fields (202 bytes).
	goldenB    = "93cb41daa8dbe0359fe7918ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cfdeadbeefcafebabeb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473dc00100102030405060708090a0b0c0d0e0f10aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797391c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e00"
	goldenHead = "93cb41daa8dbe0359fe791" // batch(3), ts, events array(1)
)

func hs(s string) string { return hex.EncodeToString([]byte(s)) }

func goldenEventA() Event {
	e := stored([]uint64{goldenHash}, seq32(1, 16), 16)
	e.Medium = "GPU"
	return e
}

func goldenEventB() Event {
	e := goldenEventA()
	e.ExtraKeys = []byte{0x91, 0xc0}
	e.GroupIdx = 0
	e.KVCacheSpecKind = "full_attention"
	return e
}

func goldenBatch(e Event) *Batch { return &Batch{TS: goldenTS, Events: []Event{e}, DPRank: 0} }

func TestEncodeGolden(t *testing.T) {
	removed := Event{Kind: KindRemoved, TypeName: "BlockRemoved", BlockHashes: []uint64{goldenHash}, Medium: "GPU", LoraID: -1, GroupIdx: -1}
	removedGroup := removed
	removedGroup.GroupIdx = 0
	cleared := Event{Kind: KindCleared, TypeName: "AllBlocksCleared", LoraID: -1, GroupIdx: -1}
	tail := "00" // dp_rank 0
	cases := []struct {
		name   string
		batch  *Batch
		layout Layout
		want   string
	}{
		{"a/positional", goldenBatch(goldenEventA()), LayoutArray, goldenA},
		{"b/map", goldenBatch(goldenEventB()), LayoutMap, goldenB},
		{"b-content/positional-11", goldenBatch(goldenEventB()), LayoutArray,
			goldenHead + "9bab" + hs("BlockStored") + "91cfdeadbeefcafebabec0dc00100102030405060708090a0b0c0d0e0f1010c0a3475055c0" +
				"91c000ae" + hs("full_attention") + tail},
		{"a-content/map", goldenBatch(goldenEventA()), LayoutMap,
			goldenHead + "88a4" + hs("type") + "ab" + hs("BlockStored") + "ac" + hs("block_hashes") + "91cfdeadbeefcafebabe" +
				"b1" + hs("parent_block_hash") + "c0a9" + hs("token_ids") + "dc00100102030405060708090a0b0c0d0e0f10" +
				"aa" + hs("block_size") + "10a7" + hs("lora_id") + "c0a6" + hs("medium") + "a3475055a9" + hs("lora_name") + "c0" + tail},
		{"no-dp-rank", &Batch{TS: goldenTS, Events: []Event{goldenEventA()}, DPRank: -1}, LayoutArray,
			"92" + goldenA[2:len(goldenA)-2]},
		{"removed/positional", goldenBatch(removed), LayoutArray,
			goldenHead + "93ac" + hs("BlockRemoved") + "91cfdeadbeefcafebabea3475055" + tail},
		{"removed/map", goldenBatch(removed), LayoutMap,
			goldenHead + "83a4" + hs("type") + "ac" + hs("BlockRemoved") + "ac" + hs("block_hashes") + "91cfdeadbeefcafebabe" +
				"a6" + hs("medium") + "a3475055" + tail},
		{"removed-group/map", goldenBatch(removedGroup), LayoutMap,
			goldenHead + "84a4" + hs("type") + "ac" + hs("BlockRemoved") + "ac" + hs("block_hashes") + "91cfdeadbeefcafebabe" +
				"a6" + hs("medium") + "a3475055a9" + hs("group_idx") + "00" + tail},
		{"cleared/positional", goldenBatch(cleared), LayoutArray, goldenHead + "91b0" + hs("AllBlocksCleared") + tail},
		{"cleared/map", goldenBatch(cleared), LayoutMap, goldenHead + "81a4" + hs("type") + "b0" + hs("AllBlocksCleared") + tail},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Encode(tc.batch, tc.layout)
			if err != nil {
				t.Fatal(err)
			}
			if want := mustHex(tc.want); !bytes.Equal(got, want) {
				t.Fatalf("encoding differs\n got %x\nwant %x", got, want)
			}
			back := mustDecode(t, got)
			if d := diffBatch(tc.batch, back); d != "" {
				t.Fatalf("round trip: %s", d)
			}
			prefixed, err := AppendEncode([]byte("xy"), tc.batch, tc.layout)
			if err != nil || !bytes.Equal(prefixed[2:], got) || string(prefixed[:2]) != "xy" {
				t.Fatalf("AppendEncode mismatch: %x, %v", prefixed, err)
			}
		})
	}
	if n := len(mustHex(goldenA)); n != 62 {
		t.Errorf("golden (a) is %d bytes, reference says 62", n)
	}
	if n := len(mustHex(goldenB)); n != 202 {
		t.Errorf("golden (b) is %d bytes, reference says 202", n)
	}
}

func TestEncodeIntWidths(t *testing.T) {
	cases := []struct {
		v    int64
		want string
	}{
		{0, "00"}, {127, "7f"}, {128, "cc80"}, {255, "ccff"}, {256, "cd0100"}, {65535, "cdffff"},
		{65536, "ce00010000"}, {1<<32 - 1, "ceffffffff"}, {1 << 32, "cf0000000100000000"},
		{-1, "ff"}, {-32, "e0"}, {-33, "d0df"}, {-128, "d080"}, {-129, "d1ff7f"}, {-32768, "d18000"},
		{-32769, "d2ffff7fff"}, {-1 << 31, "d280000000"}, {-1<<31 - 1, "d3ffffffff7fffffff"},
	}
	for _, tc := range cases {
		if got := hex.EncodeToString(appendInt(nil, tc.v)); got != tc.want {
			t.Errorf("appendInt(%d) = %s, want %s", tc.v, got, tc.want)
		}
	}
	if got := hex.EncodeToString(appendUint(nil, 1<<63)); got != "cf8000000000000000" {
		t.Errorf("hash 2^63 = %s", got)
	}
	if got := hex.EncodeToString(appendStr(nil, strings.Repeat("x", 32))[:2]); got != "d920" {
		t.Errorf("str8 header = %s", got)
	}
	if got := hex.EncodeToString(appendArrayLen(nil, 70000)); got != "dd00011170" {
		t.Errorf("array32 header = %s", got)
	}
}

func TestEncodeErrors(t *testing.T) {
	unknown := &Batch{Events: []Event{{Kind: KindUnknown, TypeName: "Foo"}}, DPRank: -1}
	if _, err := Encode(unknown, LayoutArray); err == nil {
		t.Error("unknown kind encoded")
	}
	bad := goldenEventB()
	bad.ExtraKeys = []byte{0x92, 0xc0} // truncated
	if _, err := Encode(goldenBatch(bad), LayoutMap); err == nil {
		t.Error("bad ExtraKeys encoded")
	}
	if _, err := Encode(goldenBatch(goldenEventA()), Layout(7)); err == nil {
		t.Error("bad layout accepted")
	}
	if _, err := Encode(nil, LayoutArray); err == nil {
		t.Error("nil batch accepted")
	}
}

func TestNoneExtraKeys(t *testing.T) {
	if got := hex.EncodeToString(NoneExtraKeys(2)); got != "92c0c0" {
		t.Errorf("NoneExtraKeys(2) = %s", got)
	}
	if got := NoneExtraKeys(16); !bytes.Equal(got[:3], []byte{0xdc, 0, 16}) || len(got) != 19 {
		t.Errorf("NoneExtraKeys(16) = %x", got)
	}
}

// positional BlockStored body builder: tag then the given fields.
func posStored(fields ...[]byte) []byte {
	return arr(append([][]byte{str("BlockStored")}, fields...)...)
}

func TestDecodeLayouts(t *testing.T) {
	tok16 := ints(seq(1, 16)...)
	hash1 := uints(goldenHash)
	a := goldenEventA()
	b := goldenEventB()
	// Old layouts: no lora_name (97), no medium either (96).
	noLoraName := a
	noMedium := a
	noMedium.Medium = ""
	withTail := b
	withTail.HasSlidingWindow, withTail.SlidingWindow = true, 4096
	cpuOffload := stored([]uint64{1, 2}, nil, 0)
	cpuOffload.Medium = "CPU"
	lmcache := stored([]uint64{0xffffffffffffffff, 7}, seq32(0, 300), 256)
	lmcache.HasParent, lmcache.Medium = true, "cpu"
	removedOld := Event{Kind: KindRemoved, TypeName: "BlockRemoved", BlockHashes: []uint64{5, 6}, LoraID: -1, GroupIdx: -1}
	removedFull := removedOld
	removedFull.Medium, removedFull.GroupIdx = "GPU", 3
	cleared := Event{Kind: KindCleared, TypeName: "AllBlocksCleared", LoraID: -1, GroupIdx: -1}
	unknownEv := Event{Kind: KindUnknown, TypeName: "BlockMoved", LoraID: -1, GroupIdx: -1}
	sha := bytes.Repeat([]byte{0xab}, 24)
	sha = append(sha, 1, 2, 3, 4, 5, 6, 7, 8)
	bytesHashes := stored([]uint64{0x0102030405060708, 0x0a0b0c, 0}, nil, 0)
	bytesHashes.HasParent, bytesHashes.ParentBlockHash = true, 0xcafe
	negHashes := stored([]uint64{0xfffffffffffffffe, 0xffffffff80000000, 0x8000000000000000}, nil, 0)
	intWidths := stored([]uint64{0, 0x7f, 0xcc, 0xcdcd, 0xcececece}, nil, 0)
	ts := f64(goldenTS)
	one := func(e []byte) []byte { return arr(e) }

	cases := []struct {
		name    string
		payload []byte
		want    *Batch
	}{
		{"golden-a", mustHex(goldenA), goldenBatch(a)},
		{"golden-b", mustHex(goldenB), goldenBatch(b)},
		{"batch-2-elements", arr(ts, one(posStored(hash1, nilv, tok16, u(16), nilv, str("GPU"), nilv))),
			&Batch{TS: goldenTS, Events: []Event{a}, DPRank: -1}},
		{"batch-nil-dp-rank", arr(ts, one(posStored(hash1, nilv, tok16, u(16), nilv, str("GPU"), nilv)), nilv),
			&Batch{TS: goldenTS, Events: []Event{a}, DPRank: -1}},
		{"batch-4-elements-extra-ignored", arr(ts, arr(), u(2), mp(str("x"), arr(u(1)))),
			&Batch{TS: goldenTS, DPRank: 2}},
		{"batch-map", mp(str("events"), one(posStored(hash1, nilv, tok16, u(16), nilv, str("GPU"), nilv)),
			str("future"), mp(str("a"), arr(nilv, u(1))), str("data_parallel_rank"), u(5), str("ts"), ts),
			&Batch{TS: goldenTS, Events: []Event{a}, DPRank: 5}},
		{"batch-map-nil-dp", mp(str("ts"), u(1789095808), str("events"), arr(), str("data_parallel_rank"), nilv),
			&Batch{TS: 1789095808, DPRank: -1}},
		{"ts-int", arr(u(12), arr(), u(0)), &Batch{TS: 12, DPRank: 0}},
		{"ts-float32", arr(raw("ca3fc00000"), arr()), &Batch{TS: 1.5, DPRank: -1}},
		{"positional-97-no-lora-name", arr(ts, one(posStored(hash1, nilv, tok16, u(16), nilv, str("GPU"))), u(0)),
			goldenBatch(noLoraName)},
		{"positional-96-no-medium", arr(ts, one(posStored(hash1, nilv, tok16, u(16), nilv)), u(0)),
			goldenBatch(noMedium)},
		{"positional-hashes-only", arr(ts, one(posStored(uints(1, 2))), u(0)),
			goldenBatch(stored([]uint64{1, 2}, nil, 0))},
		{"positional-12-with-extras", arr(ts, one(posStored(hash1, nilv, tok16, u(16), nilv, str("GPU"), nilv,
			raw("91c0"), u(0), str("full_attention"), u(4096), mp(str("locality"), arr(arr(str("x")))), str("more"))), u(0)),
			goldenBatch(withTail)},
		{"map-type-not-first-unknown-keys", arr(ts, one(mp(
			str("event_version"), u(2),
			str("block_hashes"), hash1,
			str("ownership"), mp(str("k"), arr(bin([]byte{1}), f64(1))),
			str("type"), str("BlockStored"),
			str("token_ids"), tok16, str("block_size"), u(16), str("medium"), str("GPU"))), u(0)),
			goldenBatch(a)},
		{"map-explicit-nils", arr(ts, one(mp(str("type"), str("BlockStored"), str("block_hashes"), hash1,
			str("parent_block_hash"), nilv, str("token_ids"), tok16, str("block_size"), u(16), str("lora_id"), nilv,
			str("medium"), str("GPU"), str("lora_name"), nilv, str("extra_keys"), nilv, str("group_idx"), nilv,
			str("kv_cache_spec_kind"), nilv, str("kv_cache_spec_sliding_window"), nilv)), u(0)),
			goldenBatch(a)},
		{"map-removed-ignores-stored-fields", arr(ts, one(mp(str("type"), str("BlockRemoved"), str("block_hashes"), uints(5, 6),
			str("token_ids"), str("not a list, but not a BlockRemoved field either"), str("medium"), str("GPU"), str("group_idx"), u(3))), u(0)),
			goldenBatch(removedFull)},
		{"removed-old-positional", arr(ts, one(arr(str("BlockRemoved"), uints(5, 6))), u(0)), goldenBatch(removedOld)},
		{"removed-positional-extra", arr(ts, one(arr(str("BlockRemoved"), uints(5, 6), str("GPU"), u(3), nilv)), u(0)), goldenBatch(removedFull)},
		{"cleared-both", arr(ts, arr(arr(str("AllBlocksCleared")), mp(str("type"), str("AllBlocksCleared"), str("x"), u(1))), u(0)),
			&Batch{TS: goldenTS, Events: []Event{cleared, cleared}, DPRank: 0}},
		{"unknown-types-kept", arr(ts, arr(arr(str("BlockMoved"), arr(u(1)), mp()), mp(str("a"), u(1), str("type"), str("BlockMoved"))), u(0)),
			&Batch{TS: goldenTS, Events: []Event{unknownEv, unknownEv}, DPRank: 0}},
		{"bytes-and-str-hashes", arr(ts, one(posStored(arr(bin(sha), bin([]byte{0x0a, 0x0b, 0x0c}), bin(nil)), str("\xca\xfe"))), u(0)),
			goldenBatch(bytesHashes)},
		{"negative-hashes", arr(ts, one(posStored(arr(raw("fe"), raw("d280000000"), raw("d38000000000000000")))), u(0)),
			goldenBatch(negHashes)},
		{"int-hash-widths", arr(ts, one(posStored(arr(raw("00"), raw("7f"), raw("cccc"), raw("cdcdcd"), raw("ce cececece")))), u(0)),
			goldenBatch(intWidths)},
		{"cpu-offload-no-tokens", arr(ts, one(posStored(uints(1, 2), nilv, arr(), u(0), nilv, str("CPU"), nilv)), u(0)),
			goldenBatch(cpuOffload)},
		{"lmcache-partial-chunk-neg-hash-zero-parent", arr(ts, one(posStored(arr(i64(-1), u(7)), u(0), ints(seq(0, 300)...), u(256), nilv, str("cpu"), nilv)), u(0)),
			goldenBatch(lmcache)},
		{"lmcache-partial-single-chunk", arr(ts, one(posStored(uints(9), nilv, ints(seq(0, 15)...), u(16))), u(0)),
			goldenBatch(stored([]uint64{9}, seq32(0, 15), 16))},
		{"token-widths", arr(ts, one(posStored(uints(1), nilv, arr(raw("00"), raw("cc80"), raw("cd0100"), raw("ce7fffffff"),
			raw("ff"), raw("d280000000"), raw("cf0000000000000005"), raw("d3fffffffffffffff0")), u(8))), u(0)),
			goldenBatch(stored([]uint64{1}, []int32{0, 128, 256, 1<<31 - 1, -1, -1 << 31, 5, -16}, 8))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := mustDecode(t, tc.payload)
			if d := diffBatch(tc.want, got); d != "" {
				t.Fatal(d)
			}
			// Reusing a batch that held other data must give the same result.
			reused := mustDecode(t, mustHex(goldenB))
			reused.Events = append(reused.Events, goldenEventB(), goldenEventA())
			if err := DecodeInto(tc.payload, reused); err != nil {
				t.Fatal(err)
			}
			if d := diffBatch(tc.want, reused); d != "" {
				t.Fatalf("reused batch: %s", d)
			}
		})
	}
}

func TestDecodeMalformed(t *testing.T) {
	ts := f64(goldenTS)
	tok16 := ints(seq(1, 16)...)
	ev := func(e []byte) []byte { return arr(ts, arr(e), u(0)) }
	small := Limits{MaxEvents: 2, MaxHashesPerEvent: 2, MaxTokensPerEvent: 32, MaxPayloadBytes: 1 << 10}
	cases := []struct {
		name    string
		payload []byte
		lim     Limits
		substr  string
		limit   bool
	}{
		{"empty", nil, Limits{}, "truncated", false},
		{"batch-int", u(3), Limits{}, "batch: want array or map, got int", false},
		{"batch-str", str("x"), Limits{}, "want array or map, got str", false},
		{"batch-1-element", arr(ts), Limits{}, "batch array has 1 elements", false},
		{"batch-0-element", arr(), Limits{}, "batch array has 0 elements", false},
		{"ts-str", arr(str("now"), arr()), Limits{}, "ts: want float or int, got str", false},
		{"ts-nil", arr(nilv, arr()), Limits{}, "got nil", false},
		{"events-map", arr(ts, mp()), Limits{}, "events: want array, got map", false},
		{"events-nil", arr(ts, nilv), Limits{}, "events: want array, got nil", false},
		{"dp-rank-str", arr(ts, arr(), str("0")), Limits{}, "data_parallel_rank: want int", false},
		{"dp-rank-negative", arr(ts, arr(), i64(-2)), Limits{}, "data_parallel_rank -2 out of range", false},
		{"map-batch-no-events", mp(str("ts"), ts), Limits{}, `no "events"`, false},
		{"map-batch-no-ts", mp(str("events"), arr()), Limits{}, `no "ts"`, false},
		{"map-batch-int-key", mp(u(1), ts), Limits{}, "batch map key: want str", false},
		{"event-int", ev(u(1)), Limits{}, "events[0] at byte", false},
		{"event-empty-array", ev(arr()), Limits{}, "empty array has no type tag", false},
		{"event-tag-int", ev(arr(u(1), arr())), Limits{}, "event type tag: want str, got int", false},
		{"event-map-no-type", ev(mp(str("block_hashes"), arr())), Limits{}, `no "type" key`, false},
		{"event-map-type-int", ev(mp(str("type"), u(1))), Limits{}, "event type tag: want str", false},
		{"event-map-int-key", ev(mp(str("type"), str("BlockStored"), u(1), u(2))), Limits{}, "event map key: want str", false},
		{"hashes-map", ev(posStored(mp())), Limits{}, "events[0].block_hashes at byte", false},
		{"hash-float", ev(posStored(arr(f64(1)))), Limits{}, "block_hashes[0]", false},
		{"hash-bool", ev(posStored(arr(u(1), raw("c3")))), Limits{}, "want int, bytes or str hash, got bool", false},
		{"parent-array", ev(posStored(arr(), arr())), Limits{}, "parent_block_hash", false},
		{"tokens-str", ev(posStored(uints(1), nilv, str("abc"))), Limits{}, "token_ids: want array, got str", false},
		{"token-str", ev(posStored(uints(1), nilv, arr(u(1), str("x")), u(2))), Limits{}, "token_ids[1]", false},
		{"token-over-int32", ev(posStored(uints(1), nilv, arr(raw("ce80000000")), u(1))), Limits{}, "token id 2147483648 outside int32", false},
		{"token-under-int32", ev(posStored(uints(1), nilv, arr(raw("d3ffffffff7fffffff")), u(1))), Limits{}, "token id -2147483649 outside int32", false},
		{"token-u64", ev(posStored(uints(1), nilv, arr(raw("cfffffffffffffffff")), u(1))), Limits{}, "outside int32", false},
		{"token-float", ev(posStored(uints(1), nilv, arr(f64(1)), u(1))), Limits{}, "token id: want int, got float", false},
		{"block-size-negative", ev(posStored(uints(1), nilv, tok16, i64(-16))), Limits{}, "block_size -16 out of range", false},
		{"block-size-str", ev(posStored(uints(1), nilv, tok16, str("16"))), Limits{}, "block_size: want int", false},
		{"tokens-long", ev(posStored(uints(1), nilv, ints(seq(1, 17)...), u(16))), Limits{}, "17 token ids for 1 block hashes", false},
		{"tokens-short-by-a-block", ev(posStored(uints(1, 2, 3), nilv, ints(seq(1, 32)...), u(16))), Limits{}, "32 token ids for 3 block hashes", false},
		{"tokens-without-hashes", ev(posStored(arr(), nilv, ints(seq(1, 16)...), u(16))), Limits{}, "16 token ids for 0 block hashes", false},
		{"lora-id-str", ev(posStored(uints(1), nilv, tok16, u(16), str("1"))), Limits{}, "lora_id: want int", false},
		{"medium-int", ev(posStored(uints(1), nilv, tok16, u(16), nilv, u(1))), Limits{}, "medium: want str, got int", false},
		{"lora-name-bin", ev(posStored(uints(1), nilv, tok16, u(16), nilv, nilv, bin([]byte("x")))), Limits{}, "lora_name: want str, got bin", false},
		{"extra-keys-int", ev(posStored(uints(1), nilv, tok16, u(16), nilv, nilv, nilv, u(1))), Limits{}, "extra_keys: want array or nil", false},
		{"extra-keys-truncated", ev(posStored(uints(1), nilv, tok16, u(16), nilv, nilv, nilv, raw("92c0"))), Limits{}, "truncated", false},
		{"group-idx-float", ev(posStored(uints(1), nilv, tok16, u(16), nilv, nilv, nilv, nilv, f64(0))), Limits{}, "group_idx: want int", false},
		{"spec-kind-int", ev(posStored(uints(1), nilv, tok16, u(16), nilv, nilv, nilv, nilv, nilv, u(0))), Limits{}, "kv_cache_spec_kind: want str", false},
		{"window-str", ev(posStored(uints(1), nilv, tok16, u(16), nilv, nilv, nilv, nilv, nilv, nilv, str("4096"))), Limits{}, "kv_cache_spec_sliding_window: want int", false},
		{"trailing-garbage", append(mustHex(goldenA), 0x00), Limits{}, "trailing garbage: 1 bytes", false},
		{"two-batches", append(mustHex(goldenA), mustHex(goldenA)...), Limits{}, "trailing garbage: 62 bytes", false},
		{"invalid-code-in-skipped", arr(ts, arr(), u(0), raw("c1")), Limits{}, "invalid msgpack code 0xc1", false},
		{"huge-array32", raw("dd ffffffff"), Limits{}, "declares 4294967295 elements", false},
		{"huge-events", arr(ts, raw("dd 7fffffff")), Limits{}, "declares 2147483647 elements", false},
		{"huge-tokens", ev(posStored(uints(1), nilv, raw("dd 00100000 01"))), Limits{}, "declares 1048576 elements", false},
		{"huge-map32", raw("df ffffffff"), Limits{}, "declares 4294967295 entries", false},
		{"huge-str", ev(arr(raw("db ffffffff"))), Limits{}, "truncated", false},
		{"huge-bin-hash", ev(posStored(arr(raw("c6 7fffffff 00")))), Limits{}, "truncated", false},
		{"huge-skipped-ext", arr(ts, arr(), u(0), raw("c9 ffffffff 01")), Limits{}, "truncated", false},
		{"huge-nested-skip", arr(ts, arr(), u(0), raw("dd 0000ffff 91 91")), Limits{}, "65535 values pending", false},
		{"limit-payload", mustHex(goldenB), Limits{MaxPayloadBytes: 100}, "payload of 202 bytes exceeds limit 100", true},
		{"limit-events", arr(ts, arr(arr(str("AllBlocksCleared")), arr(str("AllBlocksCleared")), arr(str("AllBlocksCleared")))), small, "3 events exceed limit 2", true},
		{"limit-hashes", ev(posStored(uints(1, 2, 3))), small, "3 block hashes exceed limit 2", true},
		{"limit-tokens", ev(posStored(uints(1, 2), nilv, ints(seq(0, 33)...))), small, "33 token ids exceed limit 32", true},
	}
	// Every strict prefix of valid payloads is truncated input.
	for _, g := range []string{goldenA, goldenB} {
		p := mustHex(g)
		for n := 0; n < len(p); n++ {
			cases = append(cases, struct {
				name    string
				payload []byte
				lim     Limits
				substr  string
				limit   bool
			}{"prefix-" + g[len(g)-6:] + "-" + strconv.Itoa(n), p[:n], Limits{}, "", false})
		}
	}
	// Well-formed msgpack events that cannot be used are dropped alone: the
	// batch decodes, the event carries the reason and the error.
	dropped := map[string]DropReason{
		"tokens-long": DropTokenCount, "tokens-short-by-a-block": DropTokenCount, "tokens-without-hashes": DropTokenCount,
		"limit-hashes": DropLimit, "limit-tokens": DropLimit,
	}
	for _, n := range []string{"event-int", "event-empty-array", "event-tag-int", "event-map-no-type", "event-map-type-int",
		"event-map-int-key", "hashes-map", "hash-float", "hash-bool", "parent-array", "tokens-str", "token-str",
		"token-over-int32", "token-under-int32", "token-u64", "token-float", "block-size-negative", "block-size-str",
		"lora-id-str", "medium-int", "lora-name-bin", "extra-keys-int", "group-idx-float", "spec-kind-int", "window-str"} {
		dropped[n] = DropMalformed
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var b Batch
			err := tc.lim.DecodeInto(tc.payload, &b)
			if want, ok := dropped[tc.name]; ok {
				if err != nil {
					t.Fatalf("batch rejected (%v); want the event dropped alone", err)
				}
				if len(b.Events) != 1 || b.Events[0].Drop != want {
					t.Fatalf("events %+v; want one dropped for %v", b.Events, want)
				}
				derr := b.Events[0].DropErr
				if !errors.Is(derr, ErrMalformed) || errors.Is(derr, ErrLimit) != tc.limit || !strings.Contains(derr.Error(), tc.substr) {
					t.Fatalf("drop error %v: want ErrMalformed, limit %v, mentioning %q", derr, tc.limit, tc.substr)
				}
				return
			}
			if err == nil {
				t.Fatalf("accepted %x", tc.payload)
			}
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			if errors.Is(err, ErrLimit) != tc.limit {
				t.Fatalf("errors.Is(err, ErrLimit) = %v, want %v (%v)", !tc.limit, tc.limit, err)
			}
			var de *DecodeError
			if !errors.As(err, &de) || de.Offset < 0 || de.Offset > len(tc.payload) {
				t.Fatalf("bad DecodeError %#v", de)
			}
			if !strings.Contains(err.Error(), tc.substr) {
				t.Fatalf("error %q does not mention %q", err, tc.substr)
			}
			if _, err2 := tc.lim.Decode(tc.payload); err2 == nil || err2.Error() != err.Error() {
				t.Fatalf("Decode and DecodeInto disagree: %v vs %v", err2, err)
			}
		})
	}
}

func TestErrorMessageNamesPlace(t *testing.T) {
	p := arr(f64(1), arr(arr(str("AllBlocksCleared")), arr(str("BlockStored"), uints(1), nilv, arr(u(1), str("x")), u(2))), u(0))
	b, err := Decode(p)
	if err != nil {
		t.Fatal(err)
	}
	const want = "kvevents: malformed batch: events[1].token_ids[1] at byte 47: token id: want int, got str"
	if got := b.Events[1].DropErr; got == nil || got.Error() != want || b.Events[1].Drop != DropMalformed {
		t.Fatalf("got  %v\nwant %s", got, want)
	}
	if b.Events[0].Kind != KindCleared || b.Events[0].Drop != DropNone {
		t.Fatalf("the good event was not kept: %+v", b.Events[0])
	}
}

func TestTierOf(t *testing.T) {
	cases := []struct {
		in   string
		want Tier
		ok   bool
	}{
		{"", TierGPU, true}, {"GPU", TierGPU, true}, {"gpu", TierGPU, true}, {"cuda", TierGPU, true},
		{"cuda:0", TierGPU, true}, {"CUDA:3", TierGPU, true}, {"CPU", TierCPU, true}, {"cpu", TierCPU, true},
		{"DISK", TierSSD, true}, {"disk", TierSSD, true}, {"STORAGE", TierSSD, true}, {"SHARED_STORAGE", TierSSD, true},
		{"object_store", TierSSD, true}, {"OBJECT_STORE", TierSSD, true},
		{"NVME", 0, false}, {"cudax", 0, false}, {"gpu0", 0, false}, {"cpu:0", 0, false}, {" GPU", 0, false},
	}
	for _, tc := range cases {
		got, ok := TierOf(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("TierOf(%q) = %v,%v want %v,%v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
	if TierGPU != 0 || TierCPU != 1 || TierSSD != 2 {
		t.Fatal("tier numbering is part of the contract")
	}
}
