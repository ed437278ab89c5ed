package index

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/blockhash"
)

// TestClearedKeepsOtherServersCPUTier (issue 28's SGLang rollout test):
// Cleared drops one server's records. Another server's CPU-tier records of
// the same prompt (offloaded blocks) keep matching there in full, whether
// the cleared server held the prompt by events or by speculation, and
// after the speculation TTL has passed and expired entries were swept. Each
// sequence runs with server ids below and above 64 and with two or all
// servers as candidates, so every walk (summary fast path, chains, the
// general walk over more than 64 candidates) answers.
func TestClearedKeepsOtherServersCPUTier(t *testing.T) {
	const bs, nb = 16, 8
	const ttl = time.Second
	ns := blockhash.Namespace("m", "")
	p := toks(nb*bs, 5)
	keys := blockhash.Keys(p, bs, ns)
	other := blockhash.Keys(toks(nb*bs, 70_000), bs, ns)

	type env struct {
		t      *testing.T
		ix     *Index
		c      *fakeClock
		s0, s1 ServerID
	}
	hashesOf := func(id ServerID) []uint64 {
		h := make([]uint64, nb)
		for i, k := range keys {
			h[i] = engineHash(id, k)
		}
		return h
	}
	gpu0 := func(e env) { storeRun(e.t, e.ix, e.s0, GPU, p, 0, nb, bs, ns) }
	gpu1 := func(e env) { storeRun(e.t, e.ix, e.s1, GPU, p, 0, nb, bs, ns) }
	cpu1 := func(e env) { storeRun(e.t, e.ix, e.s1, CPU, p, 0, nb, bs, ns) }
	cpu1Tokenless := func(e env) {
		if err := e.ix.Stored(e.s1, CPU, false, 0, hashesOf(e.s1), nil, 0, 0); err != nil {
			e.t.Fatal(err)
		}
	}
	evict1 := func(e env) {
		if err := e.ix.Removed(e.s1, GPU, hashesOf(e.s1)); err != nil {
			e.t.Fatal(err)
		}
	}
	clear0 := func(e env) {
		if err := e.ix.Cleared(e.s0); err != nil {
			e.t.Fatal(err)
		}
	}
	spec0 := func(e env) { e.ix.Speculate(e.s0, keys) }
	spec1 := func(e env) { e.ix.Speculate(e.s1, keys) }
	// sweep speculates another prompt on both servers: Speculate sweeps
	// the expired entries at the cold end of the server's list.
	sweep := func(e env) {
		e.ix.Speculate(e.s0, other)
		e.ix.Speculate(e.s1, other)
	}
	past := func(e env) { e.c.Advance(ttl + 20*time.Millisecond) }
	cpu := func(n int) Match { return Match{Blocks: n, Tier: [NumTiers]int{CPU: n}} }
	gpu := func(n int) Match { return Match{Blocks: n, Tier: [NumTiers]int{GPU: n}} }

	seqs := []struct {
		name         string
		steps        []func(env)
		want1, want0 Match
	}{
		{"cpu only", []func(env){cpu1, clear0}, cpu(nb), Match{}},
		{"offloaded tokenless", []func(env){gpu1, cpu1Tokenless, evict1, clear0}, cpu(nb), Match{}},
		{"offloaded with tokens", []func(env){gpu1, cpu1, evict1, clear0}, cpu(nb), Match{}},
		{"s0 held it on gpu", []func(env){gpu0, gpu1, cpu1Tokenless, evict1, clear0}, cpu(nb), Match{}},
		{"s0 stored it last", []func(env){gpu1, cpu1Tokenless, evict1, gpu0, clear0}, cpu(nb), Match{}},
		{"s0 speculated, cleared", []func(env){cpu1, spec0, clear0}, cpu(nb), Match{}},
		{"s0 speculated first, cleared", []func(env){spec0, gpu1, cpu1Tokenless, evict1, clear0}, cpu(nb), Match{}},
		{"s0 cleared, speculated again", []func(env){cpu1, spec0, clear0, spec0}, cpu(nb), gpu(nb)},
		{"s1 speculated, unexpired counts as gpu", []func(env){spec1, gpu1, cpu1Tokenless, evict1, spec0, clear0}, gpu(nb), Match{}},
		{"ttl passes, then clear", []func(env){spec1, spec0, gpu1, cpu1Tokenless, evict1, past, clear0}, cpu(nb), Match{}},
		{"clear, ttl passes, sweeps", []func(env){spec0, spec1, gpu1, cpu1Tokenless, evict1, clear0, past, sweep}, cpu(nb), Match{}},
		{"respeculated, ttl passes, sweeps", []func(env){cpu1, spec0, clear0, spec0, spec1, past, sweep, past, sweep}, cpu(nb), Match{}},
		{"cleared before s1's events", []func(env){spec0, clear0, gpu1, cpu1Tokenless, evict1, past, sweep}, cpu(nb), Match{}},
	}
	layouts := []struct {
		name       string
		servers    int
		s0, s1     int
		candidates string // "pair" or "all"
	}{
		{"ids 0,1 pair", 2, 0, 1, "pair"},
		{"ids 1,0 pair", 2, 1, 0, "pair"},
		{"ids 0,1 of 70, all", 70, 0, 1, "all"},
		{"ids 65,66 pair", 70, 65, 66, "pair"},
		{"ids 3,66 pair", 70, 3, 66, "pair"},
		{"ids 66,3 pair", 70, 66, 3, "pair"},
		{"ids 3,66 of 70, all", 70, 3, 66, "all"},
	}
	for _, l := range layouts {
		for _, sq := range seqs {
			t.Run(fmt.Sprintf("%s/%s", l.name, sq.name), func(t *testing.T) {
				ix, c := newTest(t, Config{SpecTTL: ttl})
				var ids []ServerID
				for i := 0; i < l.servers; i++ {
					id, err := ix.AddServer(fmt.Sprintf("s%d", i), ServerOptions{})
					if err != nil {
						t.Fatal(err)
					}
					ids = append(ids, id)
				}
				e := env{t: t, ix: ix, c: c, s0: ids[l.s0], s1: ids[l.s1]}
				for _, step := range sq.steps {
					step(e)
				}
				cands := []ServerID{e.s0, e.s1}
				if l.candidates == "all" {
					cands = ids
				}
				out := match(ix, keys, cands...)
				got := map[ServerID]Match{}
				for i, id := range cands {
					got[id] = out[i]
				}
				if got[e.s1] != sq.want1 {
					t.Errorf("s1 %+v, want %+v; s1 holds %+v", got[e.s1], sq.want1, ix.Snapshot(e.s1))
				}
				if got[e.s0] != sq.want0 {
					t.Errorf("s0 %+v, want %+v; s0 holds %+v", got[e.s0], sq.want0, ix.Snapshot(e.s0))
				}
			})
		}
	}
}
