package collector

import (
	"testing"

	"github.com/kvc-router/kvc-router/core/internal/kvevents"
	"github.com/kvc-router/kvc-router/core/internal/router"
)

// TestApplyClearKeepsOtherServersCPUTier (issue 28's SGLang rollout test),
// through the batches a subscriber applies: an AllBlocksCleared in one
// server's batch leaves the other server's host-tier blocks (SGLang's
// CPU_PINNED, vLLM's CPU) matching there, on the CPU tier.
func TestApplyClearKeepsOtherServersCPUTier(t *testing.T) {
	p := seq(64+2, 1)
	hashes := []uint64{11, 12, 13, 14}
	cases := []struct {
		name string
		s1   []kvevents.Event // applied to s1, before s0's clear
	}{
		{"sglang host tier", []kvevents.Event{stored(hashes, nil, p[:64], "CPU_PINNED", "")}},
		{"vllm offload, token-less", []kvevents.Event{
			stored(hashes, nil, p[:64], "GPU", ""),
			{Kind: kvevents.KindStored, BlockHashes: hashes, Medium: "CPU", GroupIdx: -1, LoraID: -1},
			{Kind: kvevents.KindRemoved, BlockHashes: hashes, Medium: "GPU", GroupIdx: -1},
		}},
		{"offload with tokens", []kvevents.Event{
			stored(hashes, nil, p[:64], "GPU", ""),
			stored(hashes, nil, p[:64], "CPU", ""),
			{Kind: kvevents.KindRemoved, BlockHashes: hashes, Medium: "GPU", GroupIdx: -1},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRouter(t, "s0", "s1")
			var st EventStats
			// s0 holds the same prompt on GPU, then clears.
			if err := Apply(r, "s0", &kvevents.Batch{Events: []kvevents.Event{stored(hashes, nil, p[:64], "GPU", "")}}, &st); err != nil {
				t.Fatal(err)
			}
			if err := Apply(r, "s1", &kvevents.Batch{Events: tc.s1}, &st); err != nil {
				t.Fatal(err)
			}
			if err := Apply(r, "s0", &kvevents.Batch{Events: []kvevents.Event{{Kind: kvevents.KindCleared}}}, &st); err != nil {
				t.Fatal(err)
			}
			if c := st.Snapshot(); c.Cleared != 1 || len(c.Dropped) != 0 {
				t.Fatalf("counts %+v", c)
			}
			if _, err := r.Acquire(router.Request{Tokens: p, Pin: -1, Probe: true}); err != nil {
				t.Fatal(err)
			}
			hits := map[string][3]int{}
			for _, c := range r.LastDecision().Candidates {
				hits[c.Server] = c.HitBlocks
			}
			if hits["s1"] != [3]int{0, 4, 0} || hits["s0"] != [3]int{} {
				t.Fatalf("hits %v, want s1 [0 4 0] and s0 none; s1 holds %+v", hits, r.Residency("s1"))
			}
		})
	}
}
