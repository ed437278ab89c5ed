package index

import (
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/blockhash"
)

// TestClearedAfterWeightSync: vLLM publishes a weight sync's
// AllBlocksCleared with the engine's next step, after the router has
// reset its index (ClearAll) and placed the next rollout's first requests.
// That first clear keeps the live speculation those placements made and
// drops every confirmed copy; any other clear drops everything.
func TestClearedAfterWeightSync(t *testing.T) {
	const bs = 16
	p, q := toks(64, 1), toks(64, 5000) // 4 blocks each
	type env struct {
		ix  *Index
		clk *fakeClock
		a   ServerID
		b   ServerID
	}
	var (
		sync      = func(e env) { e.ix.ClearAll() }
		specP     = func(e env) { e.ix.Speculate(e.a, blockhash.Keys(p, bs, 0)) }
		storeQ    = func(e env) { storeRun(t, e.ix, e.a, GPU, q, 0, 4, bs, 0) }
		storeP    = func(e env) { storeRun(t, e.ix, e.a, GPU, p, 0, 4, bs, 0) }
		storeQb   = func(e env) { storeRun(t, e.ix, e.b, GPU, q, 0, 4, bs, 0) }
		clearA    = func(e env) { must(t, e.ix.Cleared(e.a)) }
		forgetA   = func(e env) { must(t, e.ix.Forget(e.a)) } // the collector's own clear (a gap)
		expire    = func(e env) { e.clk.Advance(6 * time.Second) }
		removeP   = func(e env) { must(t, e.ix.Removed(e.a, GPU, hashesOf(e.a, p, bs))) }
		gpu4      = Match{Blocks: 4, Tier: [NumTiers]int{4}}
		none      = Match{}
		clearedAB = func(e env) []uint64 {
			st := e.ix.Status()
			return []uint64{st.Servers[0].ResetClears, st.Servers[0].KeptSpeculative}
		}
	)
	cases := []struct {
		name       string
		ops        []func(env)
		p, q, qb   Match  // a's match of p and q, b's match of q
		resetClear uint64 // a's clears taken as the sync's reset
		kept       uint64
	}{
		{"clear without a sync drops speculation", []func(env){specP, clearA}, none, none, none, 0, 0},
		{"sync, placement, late clear keeps it", []func(env){sync, specP, clearA}, gpu4, none, none, 1, 4},
		{"a late event of the old weights is dropped", []func(env){sync, storeQ, specP, clearA}, gpu4, none, none, 1, 4},
		{"only the first clear after a sync is the reset", []func(env){sync, specP, clearA, specP, clearA}, none, none, none, 1, 4},
		{"a second sync expects a clear again", []func(env){sync, clearA, sync, specP, clearA}, gpu4, none, none, 2, 4},
		{"expired speculation goes", []func(env){sync, specP, expire, clearA}, none, none, none, 1, 0},
		{"the clear is one server's", []func(env){sync, storeQb, specP, clearA}, gpu4, none, gpu4, 1, 4},
		{"kept speculation confirms by the next step's events", []func(env){sync, specP, clearA, storeP, expire}, gpu4, none, none, 1, 4},
		{"and its eviction then ends it", []func(env){sync, specP, clearA, storeP, removeP}, none, none, none, 1, 4},
		{"confirmed and speculated before the clear: the copy goes", []func(env){sync, specP, storeP, clearA, expire}, none, none, none, 1, 4},
		{"a gap's clear drops everything", []func(env){sync, specP, storeQ, forgetA}, none, none, none, 0, 0},
		{"and leaves the sync's reset to come", []func(env){sync, forgetA, specP, clearA}, gpu4, none, none, 1, 4},
		{"a gap's clear without a sync", []func(env){specP, forgetA, specP, clearA}, none, none, none, 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ix, clk := newTest(t, Config{SpecTTL: 5 * time.Second})
			a, _ := ix.AddServer("a", ServerOptions{})
			b, _ := ix.AddServer("b", ServerOptions{})
			e := env{ix, clk, a, b}
			for _, op := range c.ops {
				op(e)
			}
			got := []Match{match(ix, blockhash.Keys(p, bs, 0), a)[0], match(ix, blockhash.Keys(q, bs, 0), a)[0],
				match(ix, blockhash.Keys(q, bs, 0), b)[0]}
			if want := []Match{c.p, c.q, c.qb}; got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
				t.Fatalf("matches (a:p, a:q, b:q) %+v, want %+v", got, want)
			}
			if n := clearedAB(e); n[0] != c.resetClear || n[1] != c.kept {
				t.Fatalf("reset_clears %d kept_speculative %d, want %d %d", n[0], n[1], c.resetClear, c.kept)
			}
			if err := ix.checkSummaries(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func hashesOf(id ServerID, tokens []int32, bs int) []uint64 {
	keys := blockhash.Keys(tokens, bs, 0)
	out := make([]uint64, len(keys))
	for i, k := range keys {
		out[i] = engineHash(id, k)
	}
	return out
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
