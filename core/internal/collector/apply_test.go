package collector

import (
	"errors"
	"testing"

	"github.com/kvc-router/kvc-router/core/internal/blockhash"
	"github.com/kvc-router/kvc-router/core/internal/kvevents"
	"github.com/kvc-router/kvc-router/core/internal/router"
)

func newRouter(t testing.TB, servers ...string) *router.Router {
	t.Helper()
	f := false
	r, err := router.New(router.Config{Mode: router.ModeKVCAware, Model: "m", EventsDefault: true, Speculate: &f})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.AddServers(servers); err != nil {
		t.Fatal(err)
	}
	return r
}

func seq(n int, base int32) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = base + int32(i)
	}
	return out
}

func stored(hashes []uint64, parent *uint64, tokens []int32, medium, lora string) kvevents.Event {
	ev := kvevents.Event{Kind: kvevents.KindStored, TypeName: "BlockStored", BlockHashes: hashes, TokenIDs: tokens,
		BlockSize: 16, LoraID: -1, Medium: medium, LoraName: lora, GroupIdx: -1}
	if parent != nil {
		ev.HasParent, ev.ParentBlockHash = true, *parent
	}
	return ev
}

// grouped is a vLLM 0.32 per-group BlockStored (hybrid models).
func grouped(ev kvevents.Event, group int, kind string, window int) kvevents.Event {
	ev.GroupIdx, ev.KVCacheSpecKind = group, kind
	if window > 0 {
		ev.SlidingWindow, ev.HasSlidingWindow = window, true
	}
	return ev
}

func hit(t *testing.T, r *router.Router, tokens []int32, lora string) (string, int) {
	t.Helper()
	d, err := r.Acquire(router.Request{Tokens: tokens, Pin: -1, Lora: lora, Probe: true})
	if err != nil {
		t.Fatal(err)
	}
	r.Release(d.Server)
	return d.Server, d.HitBlocks[0] + d.HitBlocks[1] + d.HitBlocks[2]
}

func TestApply(t *testing.T) {
	p := seq(64, 1)
	parent := uint64(11)
	cases := []struct {
		name       string
		events     []kvevents.Event
		lora       string
		wantServer string
		wantHit    int
		check      func(t *testing.T, c EventCounts)
	}{
		{"stored runs chain through parent", []kvevents.Event{
			stored([]uint64{11}, nil, p[:16], "GPU", ""),
			stored([]uint64{12, 13}, &parent, p[16:48], "", ""),
		}, "", "b", 3, func(t *testing.T, c EventCounts) {
			if c.StoredBlocks != 3 || c.Events != 2 {
				t.Errorf("%+v", c)
			}
		}},
		{"removal cuts the prefix", []kvevents.Event{
			stored([]uint64{11, 12, 13}, nil, p[:48], "GPU", ""),
			{Kind: kvevents.KindRemoved, BlockHashes: []uint64{11}, Medium: "GPU"},
		}, "", "a", 0, nil},
		{"cleared drops everything", []kvevents.Event{
			stored([]uint64{11, 12, 13}, nil, p[:48], "GPU", ""),
			{Kind: kvevents.KindCleared},
		}, "", "a", 0, func(t *testing.T, c EventCounts) {
			if c.Cleared != 1 {
				t.Errorf("%+v", c)
			}
		}},
		{"unknown type and medium are counted and skipped", []kvevents.Event{
			{Kind: kvevents.KindUnknown, TypeName: "BlockMoved"},
			stored([]uint64{21}, nil, p[:16], "TAPE", ""),
			stored([]uint64{11, 12}, nil, p[:32], "GPU", ""),
		}, "", "b", 2, func(t *testing.T, c EventCounts) {
			if c.UnknownTypes != 1 || c.UnknownMedium != 1 || c.StoredBlocks != 2 {
				t.Errorf("%+v", c)
			}
		}},
		{"unanchored run is skipped", []kvevents.Event{
			stored([]uint64{12, 13}, &parent, p[16:48], "GPU", ""),
		}, "", "a", 0, func(t *testing.T, c EventCounts) {
			if c.Unanchored != 1 {
				t.Errorf("%+v", c)
			}
		}},
		{"lora events key in the adapter's namespace", []kvevents.Event{
			stored([]uint64{11, 12, 13}, nil, p[:48], "GPU", "alice"),
		}, "alice", "b", 3, nil},
		{"lora blocks do not serve the base model", []kvevents.Event{
			stored([]uint64{11, 12, 13}, nil, p[:48], "GPU", "alice"),
		}, "", "a", 0, nil},
		{"a dropped event costs only itself", []kvevents.Event{
			{Kind: kvevents.KindStored, Drop: kvevents.DropTokenCount, BlockHashes: []uint64{99}, TokenIDs: p[:48], BlockSize: 16},
			stored([]uint64{11, 12, 13}, nil, p[:48], "GPU", ""),
		}, "", "b", 3, func(t *testing.T, c EventCounts) {
			if c.Dropped["token_count_mismatch"] != 1 || c.StoredBlocks != 3 {
				t.Errorf("%+v", c)
			}
		}},
		{"block size learnt from events before any metrics", []kvevents.Event{
			func() kvevents.Event {
				e := stored([]uint64{11, 12}, nil, p[:64], "GPU", "")
				e.BlockSize = 32
				return e
			}(),
		}, "", "b", 1, nil}, // 64 prompt tokens at block 32: one hittable block
		{"hybrid: the window group keeps the run's last block, the whole prompt hits", []kvevents.Event{
			grouped(stored([]uint64{11, 12, 13}, nil, p[:48], "GPU", ""), 0, "full_attention", 0),
			grouped(stored([]uint64{13}, nil, p[:48], "GPU", ""), 1, "sliding_window", 17),
		}, "", "b", 3, func(t *testing.T, c EventCounts) {
			if c.WindowBlocks != 1 || c.StoredBlocks != 3 || len(c.Dropped) != 0 {
				t.Errorf("%+v", c)
			}
		}},
		{"hybrid: the hit ends where the window group holds a block", []kvevents.Event{
			grouped(stored([]uint64{11, 12, 13}, nil, p[:48], "GPU", ""), 0, "full_attention", 0),
			grouped(stored([]uint64{12}, nil, p[:48], "GPU", ""), 1, "sliding_window", 17),
		}, "", "b", 2, nil},
		{"hybrid: a window group's removal spares the full-attention block of the same hash", []kvevents.Event{
			grouped(stored([]uint64{11, 12, 13}, nil, p[:48], "GPU", ""), 0, "full_attention", 0),
			grouped(stored([]uint64{11, 12, 13}, nil, p[:48], "GPU", ""), 1, "sliding_window", 17),
			{Kind: kvevents.KindRemoved, BlockHashes: []uint64{11, 12}, Medium: "GPU", GroupIdx: 1},
		}, "", "b", 3, nil},
		{"a mamba group's events are dropped", []kvevents.Event{
			stored([]uint64{11, 12, 13}, nil, p[:48], "GPU", ""),
			grouped(stored([]uint64{13}, nil, p[:48], "GPU", ""), 1, "mamba", 0),
		}, "", "b", 3, func(t *testing.T, c EventCounts) {
			if c.Dropped["non_full_attention_group"] != 1 {
				t.Errorf("%+v", c)
			}
		}},
		{"sglang tiers: CPU_PINNED and EXTERNAL", []kvevents.Event{
			stored([]uint64{11, 12, 13}, nil, p[:48], "GPU", ""),
			{Kind: kvevents.KindStored, BlockHashes: []uint64{11, 12, 13}, Medium: "CPU_PINNED"},
			{Kind: kvevents.KindStored, BlockHashes: []uint64{11, 12, 13}, Medium: "EXTERNAL"},
			{Kind: kvevents.KindRemoved, BlockHashes: []uint64{11, 12, 13}, Medium: "GPU"},
		}, "", "b", 3, func(t *testing.T, c EventCounts) {
			if c.UnknownMedium != 0 {
				t.Errorf("%+v", c)
			}
		}},
		{"cpu tier counts", []kvevents.Event{
			stored([]uint64{11, 12, 13}, nil, p[:48], "GPU", ""),
			{Kind: kvevents.KindStored, BlockHashes: []uint64{11, 12, 13}, Medium: "CPU"},
			{Kind: kvevents.KindRemoved, BlockHashes: []uint64{11, 12, 13}, Medium: "GPU"},
		}, "", "b", 3, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newRouter(t, "a", "b")
			var st EventStats
			if err := Apply(r, "b", &kvevents.Batch{TS: 1, Events: c.events, DPRank: 0}, &st); err != nil {
				t.Fatal(err)
			}
			s, h := hit(t, r, p, c.lora)
			if s != c.wantServer || h != c.wantHit {
				t.Fatalf("routed to %s with %d hit blocks, want %s/%d", s, h, c.wantServer, c.wantHit)
			}
			if c.check != nil {
				c.check(t, st.Snapshot())
			}
		})
	}
}

func TestApplyPayloadAndErrors(t *testing.T) {
	r := newRouter(t, "a", "b")
	var st EventStats
	p := seq(48, 1)
	payload, err := kvevents.Encode(&kvevents.Batch{TS: 1, DPRank: 0, Events: []kvevents.Event{stored([]uint64{1, 2, 3}, nil, p, "GPU", "")}}, kvevents.LayoutMap)
	if err != nil {
		t.Fatal(err)
	}
	if err := ApplyPayload(r, "b", payload, &st); err != nil {
		t.Fatal(err)
	}
	if s, h := hit(t, r, append(p, 0), ""); s != "b" || h != 3 {
		t.Fatalf("got %s %d", s, h)
	}
	if err := ApplyPayload(r, "b", []byte{0x93, 0xff}, &st); err == nil || st.Snapshot().DecodeErrors != 1 {
		t.Fatalf("malformed payload: %v %+v", err, st.Snapshot())
	}
	if err := ApplyPayload(r, "ghost", payload, &st); !errors.Is(err, ErrUnknownServer) {
		t.Fatalf("unknown server: %v", err)
	}
	// The router keeps serving after bad input.
	if s, _ := hit(t, r, p, ""); s == "" {
		t.Fatal("no server")
	}
	_ = blockhash.DefaultBlockSize
}
