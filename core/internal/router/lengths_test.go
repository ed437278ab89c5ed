package router

import (
	"fmt"
	"testing"
	"time"
)

func lengthsConfig(maxInflight, maxSkips int) Config {
	c := admitConfig(maxInflight)
	c.Lengths = LengthsSpec{Enabled: true, MaxSkips: maxSkips}
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
	off := mustNew(t, Config{Mode: ModeKVCAware}, "s0")
	if off.Status().Lengths != nil {
		t.Fatal("lengths status present with lengths off")
	}
}
