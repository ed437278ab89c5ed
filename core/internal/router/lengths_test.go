package router

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"
)

// lengthsConfig: admission with longest-first always open (min_corr 0);
// the gate's own tests set min_corr.
func lengthsConfig(maxInflight, maxSkips int) Config {
	c := admitConfig(maxInflight)
	open := 0.0
	c.Lengths = LengthsSpec{Enabled: true, MaxSkips: maxSkips, MinCorr: &open}
	return c
}

// ReleaseDone teaches each prompt's length; the learnt history survives a
// weight sync's index reset, and a freed slot then goes to the held
// request whose prompt ran longest (not the oldest, not a sibling).
func TestLengthsLongestFirst(t *testing.T) {
	r := mustNew(t, lengthsConfig(1, 1000), "s0")
	short, long, mid := prompt(64, 1), prompt(64, 5000), prompt(64, 9000)
	for _, c := range []struct {
		id     string
		tokens []int32
		n      int
	}{{"x1", short, 50}, {"x2", long, 900}, {"x3", mid, 300}} {
		if _, q := submit(t, r, c.id, 0, c.tokens); q {
			t.Fatalf("%s held on an idle fleet", c.id)
		}
		if _, ok := r.ReleaseDone("s0", c.id, c.n, nil); !ok {
			t.Fatalf("release of %s failed", c.id)
		}
	}
	if c := r.LengthCounters(); c.Observed != 3 || c.Prompts != 3 {
		t.Fatalf("counters %+v", c)
	}
	r.ResetCache() // weight sync: new step, history kept
	if e := r.PredictTokens(long); e.Tokens != 900 || !e.History {
		t.Fatalf("long prompt predicts %+v after the reset", e)
	}
	if _, q := submit(t, r, "occupy", 1, prompt(64, 20000)); q {
		t.Fatal("first request held")
	}
	for i, tk := range [][]int32{short, mid, long} {
		if _, q := submit(t, r, fmt.Sprint("h", i), uint64(10+i), tk); !q {
			t.Fatalf("h%d not held at the cap", i)
		}
	}
	var order []uint64
	got, _ := r.ReleaseDone("s0", "occupy", 10, nil)
	for len(got) > 0 {
		order = append(order, got[0].Ticket)
		got, _ = r.ReleaseDone("s0", fmt.Sprint("h", got[0].Ticket-10), 0, nil)
	}
	if fmt.Sprint(order) != "[12 11 10]" {
		t.Fatalf("admission order %v, want longest first [12 11 10]", order)
	}
	if c := r.LengthCounters(); c.LongestPicks != 3 || c.StarvedPicks != 0 {
		t.Fatalf("counters %+v", c)
	}
}

// A caller's hint outranks learnt lengths, and a request passed over
// MaxSkips times goes next whatever its prediction.
func TestLengthsHintAndNoStarvation(t *testing.T) {
	r := mustNew(t, lengthsConfig(1, 2), "s0")
	if _, q := submit(t, r, "occupy", 1, prompt(64, 1)); q {
		t.Fatal("first request held")
	}
	hinted := func(id string, ticket uint64, seed int32, hint float64) {
		t.Helper()
		if _, q, err := r.Submit(Request{ID: id, Tokens: prompt(64, seed), Pin: -1, Hint: hint}, ticket); err != nil || !q {
			t.Fatalf("%s: held %v err %v", id, q, err)
		}
	}
	hinted("tiny", 2, 100, 1) // oldest, shortest: passed over until it starves
	for i := 0; i < 4; i++ {
		hinted(fmt.Sprint("big", i), uint64(3+i), int32(1000*(i+1)), float64(100*(i+1)))
	}
	var order []string
	id := "occupy"
	for {
		got, _ := r.ReleaseDone("s0", id, 5, nil)
		if len(got) == 0 {
			break
		}
		switch tk := got[0].Ticket; {
		case tk == 2:
			id = "tiny"
		default:
			id = fmt.Sprint("big", tk-3)
		}
		order = append(order, id)
	}
	// big3 and big2 pass tiny (and big0, big1) over twice: from then on
	// every one of them has waited long enough and they go oldest first.
	if fmt.Sprint(order) != "[big3 big2 tiny big0 big1]" {
		t.Fatalf("order %v", order)
	}
	if c := r.LengthCounters(); c.StarvedPicks != 3 || c.LongestPicks != 2 {
		t.Fatalf("counters %+v", c)
	}
}

// Without output counts the acquire-to-release time is learnt; releases
// of requests the router never saw are counted, not fatal; an unknown
// held set keeps admission's own order.
func TestLengthsTimedAndFallback(t *testing.T) {
	now := time.Unix(0, 0)
	c := lengthsConfig(1, 100)
	c.Now = func() time.Time { return now }
	r := mustNew(t, c, "s0")
	if _, q := submit(t, r, "a", 1, prompt(64, 1)); q {
		t.Fatal("held")
	}
	now = now.Add(1500 * time.Millisecond)
	r.ReleaseDone("s0", "a", 0, nil)
	r.ReleaseDone("s0", "ghost", 7, nil)
	if st := r.LengthCounters(); st.ObservedTimed != 1 || st.Unmatched != 1 || st.Observed != 0 {
		t.Fatalf("counters %+v", st)
	}
	if err := (&Config{Mode: ModeKVCAware, Lengths: LengthsSpec{Weight: 2}}).Normalise(); err == nil {
		t.Fatal("lengths.weight 2 accepted")
	}
	for _, bad := range []float64{-0.1, 1.5} {
		err := (&Config{Mode: ModeKVCAware, Lengths: LengthsSpec{MinCorr: &bad}}).Normalise()
		if err == nil || !strings.Contains(err.Error(), "lengths.min_corr") {
			t.Fatalf("lengths.min_corr %v: %v", bad, err)
		}
	}
	// Nothing known about any held prompt: siblings first, as without lengths.
	// A frozen clock: a1's acquire-to-release time is 0 ms and teaches
	// nothing (on the wall clock a loaded host made it 1 ms, a learnt
	// duration for a's prompt, and longest-first then applied).
	c2 := lengthsConfig(1, 100)
	c2.Now = func() time.Time { return now }
	r2 := mustNew(t, c2, "s0", "s1")
	a, b := prompt(64, 1), prompt(64, 5000)
	sa, _ := submit(t, r2, "a1", 1, a)
	submit(t, r2, "b1", 2, b)
	submit(t, r2, "b2", 3, b)
	submit(t, r2, "a2", 4, a)
	got, _ := r2.ReleaseDone(sa, "a1", 0, nil)
	if len(got) != 1 || got[0].Ticket != 4 {
		t.Fatalf("admitted %+v, want a's sibling (ticket 4)", got)
	}
	if st := r2.LengthCounters(); st.ObservedTimed != 0 || st.Observed != 0 {
		t.Fatalf("something was learnt: %+v", st)
	}
}

// A request without an id is never remembered (a release could not name
// it), a release without an id is a plain release, and Status reports the
// learner's counters (null with lengths off).
func TestLengthsNamelessAndStatus(t *testing.T) {
	r := mustNew(t, lengthsConfig(4, 100), "s0")
	s, _ := submit(t, r, "", 1, prompt(64, 1))
	submit(t, r, "a", 2, prompt(64, 9))
	if _, ok := r.ReleaseDone(s, "", 50, nil); !ok {
		t.Fatal("nameless release not counted on its server")
	}
	if _, ok := r.ReleaseDone(s, "a", 40, nil); !ok {
		t.Fatal("release of a not counted")
	}
	st := r.Status()
	if st.Lengths == nil || st.Lengths.Observed != 1 || st.Lengths.Unmatched != 0 || st.Lengths.Prompts != 1 {
		t.Fatalf("status lengths %+v", st.Lengths)
	}
	if st.TotalInflight != 0 {
		t.Fatalf("in flight %d after both releases", st.TotalInflight)
	}
	if e := r.PredictTokens(prompt(64, 1)); e.History || e.Siblings > 0 {
		t.Fatalf("the nameless request's prompt was learnt: %+v", e)
	}
	// lengths off: the defaults' group_spread_min_corr and
	// task_spread_min_corr still measure the correlations (a
	// correlation-only learner); either gate alone asks for it; nothing to
	// gate, no learner.
	if l := mustNew(t, Config{Mode: ModeKVCAware}, "s0").Status().Lengths; l == nil || !l.CorrOnly {
		t.Fatalf("lengths off, defaults: status lengths %+v, want a correlation-only learner", l)
	}
	for _, params := range []string{`{"group_spread":0}`, `{"task_spread":0}`} {
		one := mustNew(t, Config{Mode: ModeKVCAware, Strategies: []StrategySpec{{Name: "kvc_aware", Weight: 1, Params: []byte(params)}}}, "s0")
		if l := one.Status().Lengths; l == nil || !l.CorrOnly {
			t.Fatalf("%s: status lengths %+v, want a correlation-only learner for the other gate", params, l)
		}
	}
	off := mustNew(t, Config{Mode: ModeKVCAware, Strategies: []StrategySpec{{Name: "kvc_aware", Weight: 1, Params: []byte(`{"group_spread":0,"task_spread":0}`)}}}, "s0")
	if off.Status().Lengths != nil {
		t.Fatal("lengths status present with lengths off and both spreads 0")
	}
}

// Without output counts, a server fed by KV events shows each request's
// output as its blocks fill: the release teaches those tokens, siblings
// sharing a prompt each get their own chain, blocks that do not extend a
// followed tip count for nobody, and a server without events falls back
// to the time.
func TestLengthsFromKVEvents(t *testing.T) {
	const bs = 16
	cfg := Config{Mode: ModeKVCAware, Model: "m", BlockSize: bs, Lengths: LengthsSpec{Enabled: true}}
	r := mustNew(t, cfg, "ev", "plain")
	if !r.SetEventFeed("ev", true) {
		t.Fatal("no event feed for ev")
	}
	w := writerOf(t, r, "ev")
	p := prompt(40, 7) // 2 full blocks, 8 prompt tokens in the first output block
	ph := []uint64{101, 102}
	if err := w.Stored(0, false, 0, ph, p[:32], bs, ""); err != nil {
		t.Fatal(err)
	}
	acquire := func(id, server string) {
		t.Helper()
		pin := map[string]int{"ev": 0, "plain": 1}[server] // pool order
		if d, err := r.Acquire(Request{ID: id, Tokens: p, Pin: pin}); err != nil || d.Server != server {
			t.Fatalf("%s went to %q (%v), want %s", id, d.Server, err, server)
		}
	}
	out := func(seed int32, n int) []int32 { return prompt(n, seed) }
	acquire("a", "ev")
	acquire("b", "ev")
	// a: its first output block (8 prompt + 8 output tokens), then two more.
	first := append(append([]int32{}, p[32:]...), out(5000, 8)...)
	for _, ev := range []struct {
		parent uint64
		hash   uint64
		tokens []int32
	}{
		{102, 201, first},
		{201, 202, out(5100, 16)},
		{202, 203, out(5200, 16)},
		// b: its own first block, a different chain.
		{102, 301, append(append([]int32{}, p[32:]...), out(6000, 8)...)},
		// Extends a block nobody follows: counts for nobody.
		{999, 401, out(7000, 16)},
	} {
		if err := w.Stored(0, true, ev.parent, []uint64{ev.hash}, ev.tokens, bs, ""); err != nil && ev.parent != 999 {
			t.Fatal(err)
		}
	}
	if _, ok := r.ReleaseDone("ev", "a", 0, nil); !ok {
		t.Fatal("release of a failed")
	}
	if e := r.PredictTokens(p); e.Tokens != 3*bs-8 || e.Siblings != 1 {
		t.Fatalf("after a: predicts %+v, want 40 tokens from 1 sibling", e)
	}
	if _, ok := r.ReleaseDone("ev", "b", 0, nil); !ok {
		t.Fatal("release of b failed")
	}
	if e := r.PredictTokens(p); e.Tokens != (40+8)/2.0 || e.Siblings != 2 {
		t.Fatalf("after b: predicts %+v, want the mean of 40 and 8", e)
	}
	// A count, when sent, wins over the events; on a server without
	// events the time is learnt.
	acquire("c", "ev")
	if err := w.Stored(0, true, 102, []uint64{501}, append(append([]int32{}, p[32:]...), out(8000, 8)...), bs, ""); err != nil {
		t.Fatal(err)
	}
	r.ReleaseDone("ev", "c", 100, nil)
	acquire("d", "plain")
	r.ReleaseDone("plain", "d", 0, nil)
	if c := r.LengthCounters(); c.ObservedEvents != 2 || c.Observed != 1 || c.ObservedTimed > 1 {
		t.Fatalf("counters %+v: want 2 from events, 1 count, at most 1 time", c)
	}
}

// Collectors write events without the router's lock while callers acquire
// and release: following output chains must stay race-free (go test -race)
// and lose no release.
func TestLengthsFromKVEventsConcurrent(t *testing.T) {
	const bs, n = 16, 200
	r := mustNew(t, Config{Mode: ModeKVCAware, Model: "m", BlockSize: bs, Lengths: LengthsSpec{Enabled: true}}, "ev")
	r.SetEventFeed("ev", true)
	w := writerOf(t, r, "ev")
	p := prompt(32, 3)
	if err := w.Stored(0, false, 0, []uint64{1, 2}, p, bs, ""); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < n; i++ {
			_ = w.Stored(0, true, 2, []uint64{uint64(1000 + i)}, prompt(bs, int32(100*i)), bs, "")
		}
	}()
	for i := 0; i < n; i++ {
		id := fmt.Sprint("r", i)
		if _, err := r.Acquire(Request{ID: id, Tokens: p, Pin: -1}); err != nil {
			t.Fatal(err)
		}
		r.ReleaseDone("ev", id, 0, nil)
	}
	<-done
	if c := r.LengthCounters(); c.ObservedEvents+c.ObservedTimed > n || c.Unmatched != 0 {
		t.Fatalf("counters %+v after %d releases", c, n)
	}
	if r.lens.prog.n.Load() != 0 {
		t.Fatalf("%d requests still followed after every release", r.lens.prog.n.Load())
	}
}

// Longest-first ranks every held request, not only the oldest Window: in
// an oversubscribed step the longest prompt is as likely to be held at the
// back of the queue (window 2 here; four shorter requests ahead of it). A
// release that teaches a held prompt within the step re-ranks its held
// siblings.
func TestLengthsLongestFirstBeyondWindow(t *testing.T) {
	c := lengthsConfig(1, 1000)
	c.Admission.Window = 2
	r := mustNew(t, c, "s0")
	short, long, fresh := prompt(64, 1), prompt(64, 5000), prompt(64, 9000)
	for _, p := range []struct {
		id     string
		tokens []int32
		n      int
	}{{"x1", short, 50}, {"x2", long, 900}} {
		submit(t, r, p.id, 0, p.tokens)
		r.ReleaseDone("s0", p.id, p.n, nil)
	}
	r.ResetCache() // a new step: both prompts have history
	submit(t, r, "occupy", 1, prompt(64, 20000))
	for i, tk := range [][]int32{short, short, short, short, long, fresh, fresh} {
		if _, q := submit(t, r, fmt.Sprint("h", i), uint64(10+i), tk); !q {
			t.Fatalf("h%d not held at the cap", i)
		}
	}
	got, _ := r.ReleaseDone("s0", "occupy", 10, nil)
	if len(got) != 1 || got[0].Ticket != 14 {
		t.Fatalf("admitted %+v, want the long prompt held fifth (ticket 14)", got)
	}
	// h4 finishes; nothing is known of fresh yet, so the mean of what was
	// seen (50, 900, 10, 1000) ranks it: 490 > 50, the oldest fresh goes.
	got, _ = r.ReleaseDone("s0", "h4", 1000, nil)
	if len(got) != 1 || got[0].Ticket != 15 {
		t.Fatalf("admitted %+v, want the unknown prompt at the mean (ticket 15)", got)
	}
	// h5 teaches fresh 20 tokens within the step: its held sibling now
	// ranks below short's history (50) and goes last.
	var order []uint64
	id := "h5"
	for {
		got, _ = r.ReleaseDone("s0", id, 20, nil)
		if len(got) == 0 {
			break
		}
		order = append(order, got[0].Ticket)
		id = fmt.Sprint("h", got[0].Ticket-10)
	}
	if fmt.Sprint(order) != "[10 11 12 13 16]" {
		t.Fatalf("order %v, want short's four oldest first, then fresh's re-ranked sibling", order)
	}
	if c := r.LengthCounters(); c.LongestPicks != 7 || c.StarvedPicks != 0 {
		t.Fatalf("counters %+v", c)
	}
}

// Longest-first against a brute-force scan of the whole free queue, over
// random submits, releases (with and without counts), cancels and step
// boundaries: every admission is the held request the scan ranks first
// (the oldest past MaxSkips picks, else the longest prediction, the
// oldest of equals; nothing when no held prompt is known).
func TestLengthsLongestFirstMatchesScan(t *testing.T) {
	for seed := int64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewSource(seed))
		c := lengthsConfig(2, 1+rng.Intn(40))
		c.Admission.Window = 1 << 20 // aging by Window never applies
		now := time.Unix(0, 0)
		c.Now = func() time.Time { return now }
		r := mustNew(t, c, "s0")
		prompts := make([][]int32, 12)
		for i := range prompts {
			prompts[i] = prompt(48, int32(1000*i))
		}
		var running []string
		next := uint64(1)
		checked := 0
		for op := 0; op < 600; op++ {
			now = now.Add(time.Duration(1+rng.Intn(50)) * time.Millisecond)
			switch k := rng.Intn(10); {
			case k < 5:
				id := fmt.Sprint("r", next)
				req := Request{ID: id, Tokens: prompts[rng.Intn(len(prompts))], Pin: -1}
				if rng.Intn(8) == 0 {
					req.Hint = float64(1 + rng.Intn(3000))
				}
				_, q, err := r.Submit(req, next)
				if err != nil {
					t.Fatal(err)
				}
				if !q {
					running = append(running, id)
				}
				next++
			case k < 9 && len(running) > 0:
				i := rng.Intn(len(running))
				id := running[i]
				running = append(running[:i], running[i+1:]...)
				n := 0
				if rng.Intn(4) > 0 {
					n = 1 + rng.Intn(2000)
				}
				snap := snapFree(r)
				got, _ := r.ReleaseDone("s0", id, n, nil)
				want, ok := scanRank(r, snap)
				for _, a := range got {
					running = append(running, fmt.Sprint("r", a.Ticket))
				}
				if ok {
					checked++
					if len(got) != 1 || got[0].Ticket != want {
						t.Fatalf("seed %d op %d: admitted %+v, the scan ranks ticket %d first", seed, op, got, want)
					}
				}
			case k == 9 && rng.Intn(3) == 0:
				r.ResetCache()
			default:
				r.Cancel(uint64(1 + rng.Intn(int(next))))
			}
		}
		if checked < 50 {
			t.Fatalf("seed %d: only %d admissions checked", seed, checked)
		}
	}
}

// heldSnap is the free queue before a release: what the reference ranks.
type heldSnap struct {
	picks uint64
	items []snapItem
}

type snapItem struct {
	ticket uint64
	hl     heldLen
}

func snapFree(r *Router) heldSnap {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := heldSnap{picks: r.lens.picks}
	for h := r.aq.free.head; h != nil; h = h.next {
		s.items = append(s.items, snapItem{ticket: h.ticket, hl: *r.lens.held[h.ticket]})
	}
	return s
}

// scanRank is the reference: the ticket longest-first admits from the
// snapshot's queue, ranked by a scan of all of it with the learner as it
// stands (after the release taught it); ok = false when longest-first
// would not decide (nothing held, or nothing known of any held prompt).
func scanRank(r *Router, s heldSnap) (uint64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.lens
	best, bestP, known := -1, -1.0, false
	for i, it := range s.items {
		p, k := l.predicted(&it.hl)
		known = known || k
		if p > bestP {
			best, bestP = i, p
		}
	}
	if !known {
		return 0, false
	}
	if s.picks-s.items[0].hl.since >= uint64(l.maxSkips) {
		return s.items[0].ticket, true
	}
	return s.items[best].ticket, true
}

// lengths.min_corr: longest-first ranks by prompt only once a finished
// step measured that a prompt's samples are alike; where they are no more
// alike than any two (its history predicts nothing), or nothing could be
// measured, admission keeps its own order; min_corr 0 never closes it.
func TestLengthsLongestFirstGatedByCorr(t *testing.T) {
	zero := 0.0
	for _, tc := range []struct {
		name       string
		minCorr    *float64
		correlated bool
		prompts    int
		wantGated  bool
		wantFirst  uint64
	}{
		{"independent lengths keep it closed", nil, false, 12, true, 10},
		{"correlated lengths open it", nil, true, 12, false, 14},
		{"too few prompts to measure keep it closed", nil, true, 4, true, 10},
		{"min_corr 0 never closes", &zero, false, 12, false, 14},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := lengthsConfig(1, 1000)
			c.Lengths.MinCorr = tc.minCorr
			r := mustNew(t, c, "s0")
			// Step 1: 12 prompts x 4 samples (or too few to measure).
			// Correlated: each prompt's samples are alike. Independent:
			// every prompt mixes short and long samples; the last prompt
			// (long) has one more long one, so its history still ranks it
			// first.
			prompts := make([][]int32, 12)
			for i := range prompts {
				prompts[i] = prompt(64, int32(1000*(i+1)))
				if i < 12-tc.prompts {
					continue
				}
				for j := 0; j < 4; j++ {
					n := 40 + 10*j + 5*i
					if tc.correlated {
						n = 30*(i+1) + j
					} else if j%2 == 1 || (i == 11 && j == 0) {
						n = 900 + 10*j + i
					}
					id := fmt.Sprint("x", i, "-", j)
					submit(t, r, id, 0, prompts[i])
					r.ReleaseDone("s0", id, n, nil)
				}
			}
			r.ResetCache()
			lc := r.LengthCounters()
			if lc.LengthCorrKnown != (tc.prompts >= 8) || lc.LongestGated != tc.wantGated {
				t.Fatalf("after step 1: corr %v known %v gated %v, want gated %v",
					lc.LengthCorr, lc.LengthCorrKnown, lc.LongestGated, tc.wantGated)
			}
			short, long := prompts[12-tc.prompts], prompts[11]
			submit(t, r, "occupy", 1, prompt(64, 50000))
			for i, tk := range [][]int32{short, short, short, short, long} {
				if _, q := submit(t, r, fmt.Sprint("h", i), uint64(10+i), tk); !q {
					t.Fatalf("h%d not held at the cap", i)
				}
			}
			got, _ := r.ReleaseDone("s0", "occupy", 10, nil)
			if len(got) != 1 || got[0].Ticket != tc.wantFirst {
				t.Fatalf("admitted %+v, want ticket %d first", got, tc.wantFirst)
			}
			if picks := r.LengthCounters().LongestPicks; (picks == 0) != tc.wantGated {
				t.Fatalf("longest-first picks %d with gated %v", picks, tc.wantGated)
			}
		})
	}
}

// Within a step: once the step's own finished responses span enough
// prompts, their correlation opens longest-first (or keeps it closed)
// without waiting for the step to end.
func TestLengthsLongestFirstGatedWithinStep(t *testing.T) {
	for _, correlated := range []bool{false, true} {
		t.Run(fmt.Sprint("correlated=", correlated), func(t *testing.T) {
			c := lengthsConfig(1, 1000)
			c.Lengths.MinCorr = nil // the default
			r := mustNew(t, c, "s0")
			prompts := make([][]int32, livePrompts+1)
			for i := range prompts {
				prompts[i] = prompt(64, int32(1000*(i+1)))
			}
			if !r.LengthCounters().LongestGated {
				t.Fatal("longest-first open before any correlation was measured")
			}
			// 65 prompts x 6 samples = 390 responses (the gate is read
			// every 64: at 384, 65 prompts and 319 beyond one per prompt).
			for j := 0; j < 6; j++ {
				for i, p := range prompts {
					n := 40 + 7*i + j
					if !correlated {
						n = 40 + j + i%3
						if j%2 == 1 {
							n = 900 + j + i%5
						}
					}
					id := fmt.Sprint("x", i, "-", j)
					submit(t, r, id, 0, p)
					r.ReleaseDone("s0", id, n, nil)
				}
			}
			lc := r.LengthCounters()
			if lc.LengthCorrKnown {
				t.Fatal("a step boundary measured a correlation; none happened")
			}
			if lc.LongestGated == correlated {
				t.Fatalf("within the step: gated %v with correlated lengths %v", lc.LongestGated, correlated)
			}
			submit(t, r, "occupy", 1, prompt(64, 1<<20))
			for i, p := range [][]int32{prompts[0], prompts[0], prompts[livePrompts]} {
				if _, q := submit(t, r, fmt.Sprint("h", i), uint64(10+i), p); !q {
					t.Fatalf("h%d not held", i)
				}
			}
			want := uint64(12) // the longest prompt's sibling, held last
			if !correlated {
				want = 10 // gated: admission's own order
			}
			if got, _ := r.ReleaseDone("s0", "occupy", 10, nil); len(got) != 1 || got[0].Ticket != want {
				t.Fatalf("admitted %+v, want ticket %d", got, want)
			}
		})
	}
}

// Without counts the gate reads the acquire-to-release times the order
// ranks by: prompts whose samples take alike times open it.
func TestLengthsGateReadsDurationsWithoutCounts(t *testing.T) {
	for _, correlated := range []bool{false, true} {
		now := time.Unix(0, 0)
		c := lengthsConfig(1, 1000)
		c.Lengths.MinCorr = nil
		c.Now = func() time.Time { return now }
		r := mustNew(t, c, "s0")
		for i := 0; i < 12; i++ {
			for j := 0; j < 4; j++ {
				ms := 100*(i+1) + j
				if !correlated {
					ms = 50 + j%2*900 + i%3
				}
				id := fmt.Sprint("x", i, "-", j)
				submit(t, r, id, 0, prompt(64, int32(1000*(i+1))))
				now = now.Add(time.Duration(ms) * time.Millisecond)
				r.ReleaseDone("s0", id, 0, nil)
			}
		}
		r.ResetCache()
		if lc := r.LengthCounters(); lc.ObservedTimed != 48 || lc.LongestGated == correlated {
			t.Fatalf("correlated durations %v: %+v", correlated, lc)
		}
	}
}
