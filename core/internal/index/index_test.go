package index

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/blockhash"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) Now() time.Time          { return c.t }
func (c *fakeClock) Advance(d time.Duration) { c.t = c.t.Add(d) }

func newTest(t testing.TB, cfg Config) (*Index, *fakeClock) {
	t.Helper()
	c := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	cfg.Now = c.Now
	return New(cfg), c
}

func toks(n int, base int32) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = base + int32(i)
	}
	return out
}

// engineHash fakes vLLM's hash: deterministic per (server, key).
func engineHash(id ServerID, key uint64) uint64 { return key*0x9E3779B97F4A7C15 + uint64(id) + 1 }

func storeRun(t testing.TB, ix *Index, id ServerID, tier Tier, tokens []int32, from, to, bs int, ns uint64) {
	t.Helper()
	keys := blockhash.Keys(tokens, bs, ns)
	hashes := make([]uint64, 0, to-from)
	for i := from; i < to; i++ {
		hashes = append(hashes, engineHash(id, keys[i]))
	}
	var parent uint64
	if from > 0 {
		parent = engineHash(id, keys[from-1])
	}
	if err := ix.Stored(id, tier, from > 0, parent, hashes, tokens[from*bs:to*bs], bs, ns); err != nil {
		t.Fatalf("Stored: %v", err)
	}
}

func match(ix *Index, keys []uint64, ids ...ServerID) []Match {
	out := make([]Match, len(ids))
	ix.MatchPrefix(keys, ids, out, nil)
	return out
}

func TestStoredRemovedCleared(t *testing.T) {
	ix, _ := newTest(t, Config{})
	a, _ := ix.AddServer("a", ServerOptions{})
	b, _ := ix.AddServer("b", ServerOptions{})
	p := toks(64, 1)
	keys := blockhash.Keys(p, 16, 7)

	storeRun(t, ix, a, GPU, p, 0, 2, 16, 7)
	storeRun(t, ix, a, GPU, p, 2, 4, 16, 7) // second run anchors on parent
	storeRun(t, ix, b, GPU, p, 0, 1, 16, 7)

	m := match(ix, keys, a, b)
	if m[0].Blocks != 4 || m[0].Tier[GPU] != 4 || m[1].Blocks != 1 {
		t.Fatalf("after stores: %+v", m)
	}
	// Removing block 1 on a cuts a's run to 1 even though 2,3 remain.
	if err := ix.Removed(a, GPU, []uint64{engineHash(a, keys[1])}); err != nil {
		t.Fatal(err)
	}
	if m = match(ix, keys, a); m[0].Blocks != 1 {
		t.Fatalf("after remove: %+v", m)
	}
	if err := ix.Cleared(a); err != nil {
		t.Fatal(err)
	}
	if m = match(ix, keys, a, b); m[0].Blocks != 0 || m[1].Blocks != 1 {
		t.Fatalf("after clear: %+v", m)
	}
	if st := ix.Status(); st.Entries != 1 {
		t.Fatalf("entries after clear = %d, want 1", st.Entries)
	}
}

func TestRefcountedDuplicates(t *testing.T) {
	ix, _ := newTest(t, Config{})
	a, _ := ix.AddServer("a", ServerOptions{})
	p := toks(32, 5)
	keys := blockhash.Keys(p, 16, 0)
	storeRun(t, ix, a, GPU, p, 0, 2, 16, 0)
	storeRun(t, ix, a, GPU, p, 0, 2, 16, 0) // a duplicate copy
	h := []uint64{engineHash(a, keys[0])}
	_ = ix.Removed(a, GPU, h)
	if m := match(ix, keys, a); m[0].Blocks != 2 {
		t.Fatalf("one copy evicted, other remains: got %+v", m)
	}
	_ = ix.Removed(a, GPU, h)
	if m := match(ix, keys, a); m[0].Blocks != 0 {
		t.Fatalf("both copies evicted: got %+v", m)
	}
}

func TestTiers(t *testing.T) {
	ix, _ := newTest(t, Config{})
	a, _ := ix.AddServer("a", ServerOptions{})
	p := toks(48, 9)
	keys := blockhash.Keys(p, 16, 0)
	storeRun(t, ix, a, GPU, p, 0, 3, 16, 0)
	// Offload blocks 1 and 2 to CPU with a token-less event, then evict
	// them from GPU: they are credited at CPU.
	off := []uint64{engineHash(a, keys[1]), engineHash(a, keys[2])}
	if err := ix.Stored(a, CPU, false, 0, off, nil, 0, 0); err != nil {
		t.Fatal(err)
	}
	_ = ix.Removed(a, GPU, off)
	m := match(ix, keys, a)
	if m[0].Blocks != 3 || m[0].Tier != [NumTiers]int{1, 2, 0} {
		t.Fatalf("tier breakdown %+v", m[0])
	}
	// SSD copy of block 2, then CPU eviction of it: best tier is SSD.
	if err := ix.Stored(a, SSD, false, 0, off[1:], nil, 0, 0); err != nil {
		t.Fatal(err)
	}
	_ = ix.Removed(a, CPU, off[1:])
	if m = match(ix, keys, a); m[0].Tier != [NumTiers]int{1, 1, 1} {
		t.Fatalf("tier breakdown after ssd %+v", m[0])
	}
	// A token-less event for an unknown hash is counted, not applied.
	_ = ix.Stored(a, CPU, false, 0, []uint64{12345}, nil, 0, 0)
	if st := ix.Status(); st.Servers[0].Unresolved != 1 {
		t.Fatalf("unresolved = %d", st.Servers[0].Unresolved)
	}
}

func TestErrors(t *testing.T) {
	ix, _ := newTest(t, Config{})
	a, _ := ix.AddServer("a", ServerOptions{})
	cases := []struct {
		name string
		err  error
		want error
	}{
		{"unknown server", ix.Stored(99, GPU, false, 0, []uint64{1}, toks(16, 0), 16, 0), ErrUnknownServer},
		{"unanchored parent", ix.Stored(a, GPU, true, 777, []uint64{1}, toks(16, 0), 16, 0), ErrUnanchored},
		{"bad block size", ix.Stored(a, GPU, false, 0, []uint64{1}, toks(16, 0), 0, 0), ErrBadEvent},
		{"bad tier", ix.Stored(a, Tier(9), false, 0, []uint64{1}, toks(16, 0), 16, 0), ErrBadEvent},
		{"remove unknown server", ix.Removed(42, GPU, []uint64{1}), ErrUnknownServer},
		{"clear unknown server", ix.Cleared(42), ErrUnknownServer},
	}
	for _, c := range cases {
		if !errors.Is(c.err, c.want) {
			t.Errorf("%s: got %v want %v", c.name, c.err, c.want)
		}
	}
	if st := ix.Status(); st.Servers[0].Unanchored != 1 || st.Entries != 0 {
		t.Fatalf("status after errors: %+v", st)
	}
}

func TestSpeculation(t *testing.T) {
	ix, clk := newTest(t, Config{SpecTTL: 5 * time.Second, ApproxTTL: time.Minute})
	ev, _ := ix.AddServer("events", ServerOptions{})
	ap, _ := ix.AddServer("approx", ServerOptions{Approximate: true, Capacity: 4})
	keys := blockhash.Keys(toks(96, 1), 16, 0)

	ix.Speculate(ev, keys[:3])
	ix.Speculate(ap, keys[:3])
	if m := match(ix, keys, ev, ap); m[0].Blocks != 3 || m[1].Blocks != 3 || m[0].Tier[GPU] != 3 {
		t.Fatalf("fresh speculation: %+v", m)
	}
	clk.Advance(6 * time.Second)
	if m := match(ix, keys, ev, ap); m[0].Blocks != 0 || m[1].Blocks != 3 {
		t.Fatalf("after spec TTL: %+v", m)
	}
	clk.Advance(time.Minute)
	if m := match(ix, keys, ap); m[0].Blocks != 0 {
		t.Fatalf("after approx TTL: %+v", m)
	}
	// Capacity: the approximate server keeps only its 4 most recent keys.
	ix.Speculate(ap, keys[:6])
	if st := ix.Status(); st.Servers[1].Entries != 4 || st.EvictedCapacity == 0 {
		t.Fatalf("capacity not enforced: %+v", st.Servers[1])
	}
	// Expired speculative-only records are swept from the cold end by the
	// next speculation on that server.
	ix.Speculate(ev, keys[5:6])
	if st := ix.Status(); st.Servers[0].Entries != 1 {
		t.Fatalf("event server entries %d, want swept on next speculate", st.Servers[0].Entries)
	}
}

func TestSpeculationConfirmedAndContradicted(t *testing.T) {
	ix, clk := newTest(t, Config{SpecTTL: time.Second})
	a, _ := ix.AddServer("a", ServerOptions{})
	p := toks(48, 3)
	keys := blockhash.Keys(p, 16, 0)
	ix.Speculate(a, keys)
	storeRun(t, ix, a, GPU, p, 0, 2, 16, 0) // events confirm blocks 0,1
	_ = ix.Removed(a, GPU, []uint64{engineHash(a, keys[1])})
	clk.Advance(2 * time.Second)
	// Block 0 confirmed and outlives the TTL; block 1 was contradicted.
	if m := match(ix, keys, a); m[0].Blocks != 1 {
		t.Fatalf("got %+v, want 1 block", m)
	}
}

func TestBudgetEviction(t *testing.T) {
	ix, _ := newTest(t, Config{MaxEntries: 10})
	a, _ := ix.AddServer("a", ServerOptions{})
	p := toks(16*30, 1)
	keys := blockhash.Keys(p, 16, 0)
	storeRun(t, ix, a, GPU, p, 0, 30, 16, 0)
	st := ix.Status()
	if st.Entries != 10 || st.EvictedBudget != 20 || st.Servers[0].Bridged != 10 {
		t.Fatalf("budget: %+v", st)
	}
	// The oldest (leading) blocks went first, so the prefix is gone.
	if m := match(ix, keys, a); m[0].Blocks != 0 {
		t.Fatalf("match after eviction %+v", m)
	}
}

func TestRemoveServerAndReuse(t *testing.T) {
	ix, _ := newTest(t, Config{})
	a, _ := ix.AddServer("a", ServerOptions{})
	p := toks(32, 1)
	storeRun(t, ix, a, GPU, p, 0, 2, 16, 0)
	ix.RemoveServer(a)
	if _, ok := ix.Lookup("a"); ok {
		t.Fatal("removed server still registered")
	}
	b, _ := ix.AddServer("b", ServerOptions{})
	if b != a {
		t.Fatalf("id not reused: %d vs %d", b, a)
	}
	if m := match(ix, blockhash.Keys(p, 16, 0), b); m[0].Blocks != 0 {
		t.Fatalf("new server inherited residency: %+v", m)
	}
	if st := ix.Status(); st.Entries != 0 || st.Keys != 0 {
		t.Fatalf("leftover entries: %+v", st)
	}
}

// model is a naive, map-based statement of the index's semantics used as the
// oracle of the property test.
type model struct {
	bridge map[ServerID]map[uint64]uint64    // engine hash -> key
	cnt    map[ServerID]map[uint64][3]int    // key -> copies per tier
	spec   map[ServerID]map[uint64]time.Time // key -> expiry
	engine map[ServerID]map[uint64]uint64    // key -> engine hash
	reset  map[ServerID]bool                 // a weight sync awaits the server's clear
}

func newModel() *model {
	return &model{map[ServerID]map[uint64]uint64{}, map[ServerID]map[uint64][3]int{}, map[ServerID]map[uint64]time.Time{}, map[ServerID]map[uint64]uint64{}, map[ServerID]bool{}}
}

// cleared is Index.Cleared: the first clear after a weight sync keeps the
// live speculation (its bridges gone), any other drops everything.
func (m *model) cleared(id ServerID, now time.Time) {
	if !m.reset[id] {
		m.add(id)
		return
	}
	m.reset[id] = false
	spec := m.spec[id]
	m.add(id)
	for k, exp := range spec {
		if exp.After(now) {
			m.spec[id][k] = exp
		}
	}
}

func (m *model) add(id ServerID) {
	m.bridge[id], m.cnt[id], m.spec[id], m.engine[id] = map[uint64]uint64{}, map[uint64][3]int{}, map[uint64]time.Time{}, map[uint64]uint64{}
}

func (m *model) drop(id ServerID, key uint64) {
	if e, ok := m.engine[id][key]; ok {
		delete(m.bridge[id], e)
	}
	delete(m.cnt[id], key)
	delete(m.spec[id], key)
	delete(m.engine[id], key)
}

func (m *model) resident(id ServerID, key uint64, now time.Time) (Tier, bool) {
	c := m.cnt[id][key]
	exp, spec := m.spec[id][key]
	switch {
	case c[0] > 0 || (spec && exp.After(now)):
		return GPU, true
	case c[1] > 0:
		return CPU, true
	case c[2] > 0:
		return SSD, true
	}
	return 0, false
}

func TestPropertyAgainstModel(t *testing.T) {
	for seed := uint64(1); seed <= 30; seed++ {
		rng := rand.New(rand.NewPCG(seed, 99))
		ix, clk := newTest(t, Config{SpecTTL: 3 * time.Second})
		m := newModel()
		var ids []ServerID
		for i := 0; i < 3; i++ {
			id, _ := ix.AddServer(string(rune('a'+i)), ServerOptions{})
			ids = append(ids, id)
			m.add(id)
		}
		const bs = 4
		// Prompts share prefixes: built from a small alphabet of blocks.
		prompt := func() []int32 {
			n := 1 + rng.IntN(6)
			var p []int32
			for i := 0; i < n; i++ {
				p = append(p, toks(bs, int32(100*rng.IntN(3)))...)
			}
			return p
		}
		for step := 0; step < 400; step++ {
			id := ids[rng.IntN(len(ids))]
			switch op := rng.IntN(10); {
			case op < 4: // store a run
				p := prompt()
				keys := blockhash.Keys(p, bs, 0)
				from := rng.IntN(len(keys))
				tier := Tier(rng.IntN(2))
				hashes := make([]uint64, 0)
				for _, k := range keys[from:] {
					hashes = append(hashes, engineHash(id, k))
				}
				var parent uint64
				if from > 0 {
					parent = engineHash(id, keys[from-1])
				}
				err := ix.Stored(id, tier, from > 0, parent, hashes, p[from*bs:], bs, 0)
				if from > 0 {
					if _, ok := m.bridge[id][parent]; !ok {
						if !errors.Is(err, ErrUnanchored) {
							t.Fatalf("seed %d step %d: want unanchored, got %v", seed, step, err)
						}
						continue
					}
				}
				if err != nil {
					t.Fatalf("seed %d: %v", seed, err)
				}
				for i, k := range keys[from:] {
					e := hashes[i]
					if old, ok := m.engine[id][k]; ok && old != e {
						delete(m.bridge[id], old)
					}
					m.engine[id][k], m.bridge[id][e] = e, k
					c := m.cnt[id][k]
					c[tier]++
					m.cnt[id][k] = c
				}
			case op < 7: // remove some hashes
				var hs []uint64
				for e := range m.bridge[id] {
					if rng.IntN(3) == 0 {
						hs = append(hs, e)
					}
				}
				hs = append(hs, 424242) // unknown
				tier := Tier(rng.IntN(2))
				_ = ix.Removed(id, tier, hs)
				for _, e := range hs {
					k, ok := m.bridge[id][e]
					if !ok {
						continue
					}
					c := m.cnt[id][k]
					if c[tier] > 0 {
						c[tier]--
					}
					m.cnt[id][k] = c
					if c == [3]int{} {
						m.drop(id, k)
					}
				}
			case op < 9: // speculate
				keys := blockhash.Keys(prompt(), bs, 0)
				ix.Speculate(id, keys)
				for _, k := range keys {
					m.spec[id][k] = clk.Now().Add(3 * time.Second)
				}
			default:
				switch rng.IntN(8) {
				case 0, 1:
					_ = ix.Cleared(id)
					m.cleared(id, clk.Now())
				case 2:
					ix.ClearAll()
					for _, sid := range ids {
						m.add(sid)
						m.reset[sid] = true
					}
				case 3:
					_ = ix.Forget(id) // a collector's own clear: a pending sync stays pending
					m.add(id)
				default:
					clk.Advance(time.Duration(rng.IntN(200)) * tickDur) // expiry has tick resolution
				}
			}
			// Expired speculative-only entries are invisible to queries
			// whether or not the index has swept them; drop them in the model.
			for _, sid := range ids {
				for k, exp := range m.spec[sid] {
					if !exp.After(clk.Now()) {
						delete(m.spec[sid], k)
						if m.cnt[sid][k] == [3]int{} {
							m.drop(sid, k)
						}
					}
				}
			}
			// Compare every prompt over the alphabet.
			p := prompt()
			keys := blockhash.Keys(p, bs, 0)
			got := match(ix, keys, ids...)
			if err := ix.checkSummaries(); err != nil {
				t.Fatalf("seed %d step %d: %v", seed, step, err)
			}
			for i, sid := range ids {
				var want Match
				for _, k := range keys {
					tr, ok := m.resident(sid, k, clk.Now())
					if !ok {
						break
					}
					want.Blocks++
					want.Tier[tr]++
				}
				if got[i] != want {
					t.Fatalf("seed %d step %d server %d: got %+v want %+v", seed, step, sid, got[i], want)
				}
			}
		}
	}
}

func FuzzIndexOps(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11})
	f.Add([]byte{9, 9, 9, 1, 1, 1, 0, 0, 200, 3, 3, 7, 7, 7})
	f.Fuzz(func(t *testing.T, ops []byte) {
		ix, clk := newTest(t, Config{MaxEntries: 16})
		var ids []ServerID
		for i := 0; i < 2; i++ {
			id, _ := ix.AddServer(string(rune('a'+i)), ServerOptions{Approximate: i == 1, Capacity: 5})
			ids = append(ids, id)
		}
		for i := 0; i+2 < len(ops); i += 3 {
			id := ids[int(ops[i])%2]
			p := toks(int(ops[i+2]%40), int32(ops[i+1]%4))
			keys := blockhash.Keys(p, 4, 0)
			switch ops[i] % 7 {
			case 0, 1:
				hs := make([]uint64, len(keys))
				for j, k := range keys {
					hs[j] = engineHash(id, k)
				}
				_ = ix.Stored(id, Tier(ops[i+1]%3), false, 0, hs, p, 4, 0)
			case 2:
				hs := make([]uint64, len(keys))
				for j, k := range keys {
					hs[j] = engineHash(id, k)
				}
				_ = ix.Removed(id, Tier(ops[i+1]%3), hs)
			case 3:
				ix.Speculate(id, keys)
			case 4:
				_ = ix.Cleared(id)
			case 5:
				clk.Advance(time.Duration(ops[i+1]) * 100 * time.Millisecond)
			case 6:
				ix.ClearAll()
			}
			st := ix.Status()
			if st.Entries > 16 {
				t.Fatalf("budget exceeded: %d", st.Entries)
			}
			sum := 0
			for _, s := range st.Servers {
				sum += s.Entries
				if s.Approximate && s.Entries > 5 {
					t.Fatalf("capacity exceeded: %d", s.Entries)
				}
			}
			if sum != st.Entries {
				t.Fatalf("per-server entries %d != total %d", sum, st.Entries)
			}
			if err := ix.checkSummaries(); err != nil {
				t.Fatal(err)
			}
			out := match(ix, keys, ids...)
			for _, m := range out {
				if m.Blocks > len(keys) || m.Tier[0]+m.Tier[1]+m.Tier[2] != m.Blocks {
					t.Fatalf("inconsistent match %+v for %d keys", m, len(keys))
				}
			}
			// The masked walk (key summaries) answers as the general
			// per-record walk, which unknown ids past 64 force.
			long := append(append([]ServerID(nil), ids...), make([]ServerID, 70)...)
			for j := len(ids); j < len(long); j++ {
				long[j] = ServerID(1000 + j)
			}
			general := make([]Match, len(long))
			ix.MatchPrefix(keys, long, general, nil)
			for j := range ids {
				if general[j] != out[j] {
					t.Fatalf("server %d: masked %+v, general %+v", ids[j], out[j], general[j])
				}
			}
		}
	})
}
