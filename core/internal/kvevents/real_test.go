package kvevents

import (
	"os"
	"path/filepath"
	"testing"
)

// TestRealVLLM032Captures decodes what a real vLLM 0.32.0 published (see
// testdata/vllm-0.32-cpu/README.md): per-group events of a hybrid model
// decode whole, nothing dropped.
func TestRealVLLM032Captures(t *testing.T) {
	type want struct {
		kinds   []Kind
		hashes  []int
		tokens  []int
		groups  []int
		spec    []string
		windows []int
	}
	cases := map[string]want{
		"llama-batch-0.msgpack":  {[]Kind{KindStored}, []int{3}, []int{96}, []int{0}, []string{SpecFullAttention}, []int{0}},
		"llama-batch-1.msgpack":  {[]Kind{KindStored}, []int{1}, []int{32}, []int{0}, []string{SpecFullAttention}, []int{0}},
		"llama-batch-2.msgpack":  {[]Kind{KindCleared, KindStored}, []int{0, 1}, []int{0, 32}, []int{-1, 0}, []string{"", SpecFullAttention}, []int{0, 0}},
		"hybrid-batch-0.msgpack": {[]Kind{KindStored, KindStored}, []int{3, 2}, []int{96, 96}, []int{0, 1}, []string{SpecFullAttention, SpecSlidingWindow}, []int{0, 48}},
		"hybrid-batch-1.msgpack": {[]Kind{KindStored, KindStored}, []int{4, 4}, []int{128, 128}, []int{0, 1}, []string{SpecFullAttention, SpecSlidingWindow}, []int{0, 48}},
	}
	for name, w := range cases {
		t.Run(name, func(t *testing.T) {
			p, err := os.ReadFile(filepath.Join("testdata", "vllm-0.32-cpu", name))
			if err != nil {
				t.Fatal(err)
			}
			b, err := Decode(p)
			if err != nil {
				t.Fatal(err)
			}
			if b.DPRank != 0 || len(b.Events) != len(w.kinds) {
				t.Fatalf("batch %+v", b)
			}
			for i, e := range b.Events {
				if e.Drop != DropNone || e.Kind != w.kinds[i] || len(e.BlockHashes) != w.hashes[i] || len(e.TokenIDs) != w.tokens[i] ||
					e.GroupIdx != w.groups[i] || e.KVCacheSpecKind != w.spec[i] || e.SlidingWindow != w.windows[i] {
					t.Fatalf("event %d: %+v", i, e)
				}
				if e.Kind == KindStored && (e.BlockSize != 32 || e.Medium != "GPU") {
					t.Fatalf("event %d: block size %d medium %q", i, e.BlockSize, e.Medium)
				}
			}
		})
	}
}
