package router

import (
	"fmt"
	"testing"

	"github.com/kvc-router/kvc-router/core/internal/lengths"
)

// Issue 29 row 7: 60k held requests cancelled or drained. Before, both
// removed from a slice under the router lock (19 s and 27 s). Run:
//
//	go test -run '^$' -bench AdmissionHeld60k ./core/internal/router/
const benchHeld = 60_000

// heldRouter is 8 servers at a cap of 4 each, with benchHeld requests held:
// GRPO-like groups of 8 samples of one 256-token prompt.
func heldRouter(b *testing.B) (*Router, []string) {
	return heldRouterWith(b, admitConfig(4), nil)
}

// heldRouterWith is heldRouter under cfg; prepare runs on the empty
// router first.
func heldRouterWith(b *testing.B, cfg Config, prepare func(*Router)) (*Router, []string) {
	b.Helper()
	names := make([]string, 8)
	for i := range names {
		names[i] = fmt.Sprint("s", i)
	}
	r := mustNew(b, cfg, names...)
	if prepare != nil {
		prepare(r)
	}
	for i := 0; i < 8*4; i++ {
		if _, q, err := r.Submit(Request{ID: fmt.Sprint("run", i), Tokens: prompt(256, int32(-1000*(i+1))), Pin: -1}, uint64(1<<40+i)); err != nil || q {
			b.Fatal("could not fill the fleet")
		}
	}
	for i := 0; i < benchHeld; i++ {
		if _, q, err := r.Submit(Request{ID: fmt.Sprint("h", i), Tokens: prompt(256, int32(1000*(i/8))), Pin: -1}, uint64(i)); err != nil || !q {
			b.Fatalf("request %d not held: %v", i, err)
		}
	}
	return r, names
}

func BenchmarkAdmissionHeld60kCancel(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		r, _ := heldRouter(b)
		b.StartTimer()
		for i := 0; i < benchHeld; i++ { // oldest first: the slice's worst case
			if !r.Cancel(uint64(i)) {
				b.Fatal("not held")
			}
		}
	}
}

func BenchmarkAdmissionHeld60kDrain(b *testing.B) {
	for b.Loop() {
		b.StopTimer()
		r, names := heldRouter(b)
		b.StartTimer()
		drain(b, r, names)
	}
}

// drain releases a slot on each server in turn until nothing is held, each
// release admitting one held request.
func drain(b *testing.B, r *Router, names []string) {
	var out []Admitted
	for n := 0; r.Held() > 0; n++ {
		out, _ = r.ReleaseAdmit(names[n%len(names)], out[:0])
		if len(out) != 1 {
			b.Fatalf("release %d admitted %d", n, len(out))
		}
	}
}

// The same drain with longest-first admission over every held request
// (lengths on, each prompt's length known from an earlier step, so every
// pick ranks all 60k): compare with BenchmarkAdmissionHeld60kDrain in the
// same run. A scan of the whole queue per pick would cost 60k x 60k.
func BenchmarkAdmissionHeld60kDrainLongestFirst(b *testing.B) {
	cfg := admitConfig(4)
	open := 0.0 // one sample per prompt measures no correlation: keep the order open
	cfg.Lengths = LengthsSpec{Enabled: true, MinCorr: &open}
	teach := func(r *Router) {
		for g := 0; g < benchHeld/8; g++ {
			r.lens.tok.Observe(lengths.KeyOf(prompt(256, int32(1000*g))), 1+(g*7919)%16384)
		}
		r.ResetCache() // the lengths become history
	}
	for b.Loop() {
		b.StopTimer()
		r, names := heldRouterWith(b, cfg, teach)
		b.StartTimer()
		drain(b, r, names)
		if c := r.LengthCounters(); c.LongestPicks+c.StarvedPicks != benchHeld {
			b.Fatalf("%d of %d picks longest-first", c.LongestPicks+c.StarvedPicks, benchHeld)
		}
	}
}

// The same drain with admission's group spread acting (responses up to
// 32 x the prompt, an earlier step measured alike samples), so every pick
// that meets a sibling cached on the freed server also counts the group's
// placements over the pool: compare with BenchmarkAdmissionHeld60kDrain in
// the same run. A sibling passed over does not end the pick's scan of the
// oldest admission.window held requests, so picks match more prompts: on
// a 2-CPU host it measured 3.5 x the plain drain (about 55 us an
// admission), most of it those prefix matches. Server health is read once
// per pick, not per group: it was a quarter of the time.
func BenchmarkAdmissionHeld60kDrainGroupSpread(b *testing.B) {
	cfg := admitConfig(4)
	cfg.ResponseTokens = 8192
	alike := func(r *Router) {
		for g := 0; g < 16; g++ {
			for j := 0; j < 4; j++ {
				r.lens.tok.Observe(lengths.KeyOf(prompt(256, int32(-1<<24+1000*g))), 100*(g+1)+j)
			}
		}
		r.ResetCache() // a weight sync: the step's correlation is measured
	}
	for b.Loop() {
		b.StopTimer()
		r, names := heldRouterWith(b, cfg, alike)
		b.StartTimer()
		drain(b, r, names)
		if r.Status().Admission.GroupSpread == 0 {
			b.Fatal("the group spread never acted")
		}
	}
}
