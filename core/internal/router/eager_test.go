package router

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvc-router/kvc-router/core/internal/blockhash"
	"github.com/kvc-router/kvc-router/core/internal/index"
)

// The router's keys come from the key memo (blockhash.Memo) and its index
// walk uses per-key summaries. Every candidate must see exactly the hits
// that eager hashing (blockhash.Keys) and a walk of the index for that
// server alone give, and the router must end with exactly the eager keys,
// so decisions and speculation are unchanged: GRPO siblings, next turns,
// prefixes, unrelated prompts, prompts under a block, mixed block sizes,
// with and without speculation and events.
func TestCandidatesMatchEagerKeys(t *testing.T) {
	for _, tc := range []struct {
		name      string
		speculate bool
		events    bool
		mixedBS   bool
	}{
		{"events", false, true, false},
		{"events+speculation", true, true, false},
		{"approximate", true, false, false},
		{"mixed block sizes", true, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(21, 22))
			spec := tc.speculate
			var ids []string
			servers := map[string]ServerSpec{}
			for i := 0; i < 6; i++ {
				id := fmt.Sprintf("s%d", i)
				ids = append(ids, id)
				if tc.mixedBS && i%3 == 2 {
					servers[id] = ServerSpec{BlockSize: 32}
				}
			}
			r := mustNew(t, Config{Mode: ModeKVCAware, Model: "m", EventsDefault: tc.events, Speculate: &spec, Servers: servers}, ids...)
			ns := blockhash.Namespace("m", "")
			bases := [][]int32{prompt(3000, 1), prompt(700, 50_000), prompt(90, 90_000)}
			fresh := int32(1_000_000)
			rnd := func(n int) []int32 {
				p := prompt(n, fresh)
				fresh += int32(n) + 1
				return p
			}
			hits := 0
			for step := 0; step < 400; step++ {
				base := bases[rng.IntN(len(bases))]
				var p []int32
				switch rng.IntN(5) {
				case 0:
					p = base
				case 1: // sibling
					p = append(append([]int32(nil), base[:rng.IntN(len(base)+1)]...), rnd(rng.IntN(400))...)
				case 2: // next turn
					p = append(append([]int32(nil), base...), rnd(1+rng.IntN(300))...)
				case 3: // prefix, possibly under one block
					p = base[:rng.IntN(len(base)+1)]
				case 4:
					p = rnd(rng.IntN(2000))
				}
				if tc.events && rng.IntN(4) == 0 {
					s := ids[rng.IntN(len(ids))]
					storeOn(t, r, s, p, r.blockSize(r.byID[s]))
				}
				// Eager answer for every server, before the acquire
				// (which speculates).
				want := map[string]index.Match{}
				wantKeys := map[int][]uint64{}
				for _, s := range ids {
					bs := r.blockSize(r.byID[s])
					keys := blockhash.Keys(p, bs, ns)
					wantKeys[bs] = keys
					out := make([]index.Match, 1)
					r.ix.MatchPrefix(keys[:blockhash.HittableBlocks(len(p), bs)], []index.ServerID{r.byID[s].ix}, out, nil)
					want[s] = out[0]
				}
				d, err := r.Acquire(Request{ID: fmt.Sprint("q", step), Tokens: p, Pin: -1})
				if err != nil {
					t.Fatal(err)
				}
				r.Release(d.Server)
				if d.Candidates != len(ids) {
					t.Fatalf("step %d: %d candidates", step, d.Candidates)
				}
				for i := 0; i < d.Candidates; i++ {
					c := r.cands[i]
					if c.Hit != want[c.ID] {
						t.Fatalf("step %d (%d tokens): %s hit %+v, eager %+v", step, len(p), c.ID, c.Hit, want[c.ID])
					}
					if c.Hit.Blocks > 0 {
						hits++
					}
				}
				for bs, keys := range wantKeys {
					if len(p) > 0 && !slices.Equal(r.keys[bs], keys) {
						t.Fatalf("step %d: keys at block size %d differ from eager keys (%d vs %d)", step, bs, len(r.keys[bs]), len(keys))
					}
				}
			}
			if hits < 400 {
				t.Fatalf("only %d candidate hits in 400 steps: the comparison proves little", hits)
			}
		})
	}
}
