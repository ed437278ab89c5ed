package collector

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kvc-router/kvc-router/core/internal/kvevents"
)

func realPayload(t *testing.T, name string) []byte {
	t.Helper()
	p, err := os.ReadFile(filepath.Join("..", "kvevents", "testdata", "vllm-0.32-cpu", name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRealHybridHits replays a real vLLM 0.32 hybrid model's events (full
// attention + sliding window 48, block 32) and checks the router predicts
// the hits the engine served: 96 tokens for the repeated 100-token prompt,
// 0 for a prompt sharing only its first 70 tokens (the window group kept
// blocks 1-2, not block 0; a full-attention-only index says 64).
func TestRealHybridHits(t *testing.T) {
	r := newRouter(t, "a", "b")
	var st EventStats
	if err := ApplyPayload(r, "b", realPayload(t, "hybrid-batch-0.msgpack"), &st); err != nil {
		t.Fatal(err)
	}
	p := seq(100, 1000)
	q := append(seq(70, 1000), seq(60, 5000)...)
	if s, h := hit(t, r, p, ""); s != "b" || h != 3 {
		t.Fatalf("repeated prompt: %s with %d blocks, want b with 3 (96 tokens served)", s, h)
	}
	if _, h := hit(t, r, q, ""); h != 0 {
		t.Fatalf("prefix-sharing prompt: %d blocks predicted, the engine served 0", h)
	}
	c := st.Snapshot()
	if c.DecodeErrors != 0 || len(c.Dropped) != 0 || c.StoredBlocks != 3 || c.WindowBlocks != 2 {
		t.Fatalf("counts %+v", c)
	}
	// The engine then computed q whole: both groups stored its 4 blocks.
	if err := ApplyPayload(r, "b", realPayload(t, "hybrid-batch-1.msgpack"), &st); err != nil {
		t.Fatal(err)
	}
	if s, h := hit(t, r, q, ""); s != "b" || h != 4 {
		t.Fatalf("q after its own run: %s with %d blocks, want b with 4", s, h)
	}
}

// TestRealLlamaResetArrivesWithNextStep: vLLM publishes AllBlocksCleared
// only with its next step's batch, which also stores that step's blocks.
func TestRealLlamaResetArrivesWithNextStep(t *testing.T) {
	r := newRouter(t, "a", "b")
	var st EventStats
	for _, n := range []string{"llama-batch-0.msgpack", "llama-batch-1.msgpack"} {
		if err := ApplyPayload(r, "b", realPayload(t, n), &st); err != nil {
			t.Fatal(err)
		}
	}
	long := append(seq(100, 1000), seq(29, 0)...) // block 3 differs: 3 blocks hit
	if _, h := hit(t, r, long, ""); h != 3 {
		t.Fatalf("before reset: %d blocks", h)
	}
	if err := ApplyPayload(r, "b", realPayload(t, "llama-batch-2.msgpack"), &st); err != nil {
		t.Fatal(err)
	}
	if _, h := hit(t, r, long, ""); h != 0 {
		t.Fatalf("after AllBlocksCleared: %d blocks", h)
	}
	if s, h := hit(t, r, append(seq(40, 2000), 7), ""); s != "b" || h != 1 {
		t.Fatalf("the step after the reset: %s %d", s, h)
	}
	if c := st.Snapshot(); c.Cleared != 1 || c.StoredBlocks != 5 {
		t.Fatalf("counts %+v", c)
	}
}

func sglangPayload(t *testing.T, name string) []byte {
	t.Helper()
	p, err := os.ReadFile(filepath.Join("..", "kvevents", "testdata", "sglang-0.5.23", name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestSGLangPayloads applies batches encoded by SGLang 0.5.23's own event
// classes and encoder: its host and shared-pool tiers keep a run routable
// after the GPU copies go, and a speculative-decoding (EAGLE/MTP) radix
// tree's bigram token pairs key the pages like plain tokens.
func TestSGLangPayloads(t *testing.T) {
	r := newRouter(t, "a", "b")
	var st EventStats
	if err := ApplyPayload(r, "b", sglangPayload(t, "tiers.msgpack"), &st); err != nil {
		t.Fatal(err)
	}
	if s, h := hit(t, r, seq(13, 1000), ""); s != "b" || h != 3 {
		t.Fatalf("CPU_PINNED/EXTERNAL copies: %s with %d pages, want b with 3", s, h)
	}
	if err := ApplyPayload(r, "b", sglangPayload(t, "eagle.msgpack"), &st); err != nil {
		t.Fatal(err)
	}
	c := st.Snapshot()
	if c.DecodeErrors != 0 || c.UnknownMedium != 0 || len(c.Dropped) != 0 || c.Cleared != 1 || c.StoredBlocks != 3+6+2 {
		t.Fatalf("counts %+v", c)
	}
	if _, h := hit(t, r, seq(9, 2000), ""); h != 0 {
		t.Fatalf("after AllBlocksCleared: %d", h)
	}
	// The bigram pages without the clear that follows them.
	var b kvevents.Batch
	if err := kvevents.DecodeInto(sglangPayload(t, "eagle.msgpack"), &b); err != nil {
		t.Fatal(err)
	}
	b.Events = b.Events[:1]
	if !b.Events[0].Bigram || len(b.Events[0].TokenIDs) != 8 || b.DPRank != 1 {
		t.Fatalf("bigram event %+v", b.Events[0])
	}
	if err := Apply(r, "a", &b, &st); err != nil {
		t.Fatal(err)
	}
	if s, h := hit(t, r, seq(9, 2000), ""); s != "a" || h != 2 {
		t.Fatalf("bigram pages: %s with %d, want a with 2", s, h)
	}
}
