package router

import (
	"fmt"
	"testing"
	"time"
)

func TestLatencyHistBuckets(t *testing.T) {
	cases := []struct {
		d    time.Duration
		want int // bucket index; len(LatencyBounds) is +Inf
	}{
		{0, 0},
		{time.Microsecond, 0}, // bounds are inclusive (le)
		{time.Microsecond + 1, 1},
		{3 * time.Microsecond, 2},
		{time.Millisecond, 9},
		{100 * time.Millisecond, len(LatencyBounds) - 1},
		{time.Second, len(LatencyBounds)},
		{-time.Microsecond, 0}, // a clock step back counts as fastest, adds nothing to the sum
	}
	for _, c := range cases {
		var h latencyHist
		h.observe(c.d)
		if h.counts[c.want] != 1 {
			t.Errorf("%v: counts %v, want bucket %d", c.d, h.counts, c.want)
		}
	}
}

func TestLatencyStatusCumulative(t *testing.T) {
	var h latencyHist
	for _, d := range []time.Duration{500 * time.Nanosecond, 3 * time.Microsecond, 3 * time.Microsecond, time.Second} {
		h.observe(d)
	}
	st := h.status()
	if len(st.Bounds) != len(st.Buckets) || st.Count != 4 {
		t.Fatalf("%+v", st)
	}
	want := []uint64{1, 1, 3, 3}
	for i, w := range want {
		if st.Buckets[i] != w {
			t.Fatalf("bucket %d (le %g) = %d, want %d: %+v", i, st.Bounds[i], st.Buckets[i], w, st)
		}
	}
	if last := st.Buckets[len(st.Buckets)-1]; last != 3 { // the 1 s decision is only in +Inf (Count)
		t.Fatalf("last finite bucket %d", last)
	}
	if st.Sum < 1.0000065 || st.Sum > 1.0000066 {
		t.Fatalf("sum %v", st.Sum)
	}
}

// Every routed decision is timed, and the per-tier credit adds up to the total.
func TestStatusDecisionLatencyAndTierCredit(t *testing.T) {
	r := mustNew(t, Config{Mode: ModeKVCAware}, "s0", "s1")
	a := prompt(1024, 1)
	for i := 0; i < 20; i++ {
		acq(t, r, fmt.Sprint("a", i), a...)
	}
	st := r.Status()
	c := st.Counters
	if st.DecisionSeconds.Count != c.Acquires || c.Acquires != 20 || st.DecisionSeconds.Sum <= 0 {
		t.Fatalf("latency %+v, counters %+v", st.DecisionSeconds, c)
	}
	if c.PredictedHits == 0 || c.PredictedHitsGPU+c.PredictedHitsCPU+c.PredictedHitsSSD != c.PredictedHits {
		t.Fatalf("tier credit %+v", c)
	}
	r.RemoveServers([]string{"s0", "s1"})
	if _, err := r.Acquire(Request{ID: "x", Pin: -1}); err == nil {
		t.Fatal("acquire on an empty pool succeeded")
	}
	if st := r.Status(); st.DecisionSeconds.Count != 21 {
		t.Fatalf("the failed decision was not timed: %+v", st.DecisionSeconds)
	}
}
