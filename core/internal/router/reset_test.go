package router

import (
	"fmt"
	"testing"
)

// TestLateResetKeepsTheRolloutsPlacements: after a weight sync (ResetCache)
// vLLM's AllBlocksCleared arrives with the engine's first step of the next
// rollout, when the router has already placed requests there that the
// engine has not yet prefilled. Their siblings still follow them; a clear
// that no weight sync announced (an engine restart) drops that speculation.
func TestLateResetKeepsTheRolloutsPlacements(t *testing.T) {
	on := true
	cfg := kvcConfig()
	cfg.Speculate = &on
	cases := []struct {
		name     string
		resets   int  // ResetCache calls before the step
		clears   int  // the holder's clears after its first placements
		followed bool // the next sibling goes to the same server
	}{
		{"no clear", 1, 0, true},
		{"the sync's late clear", 1, 1, true},
		{"a second clear is not the sync's", 1, 2, false},
		{"a clear without a sync", 0, 1, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := mustNew(t, cfg, "s0", "s1", "s2")
			for i := 0; i < c.resets; i++ {
				r.ResetCache()
			}
			p := prompt(16*8+1, 11)
			first := ""
			for i := 0; i < 3; i++ {
				d, err := r.Acquire(Request{ID: fmt.Sprintf("g0-%d", i), Tokens: p, Pin: -1})
				if err != nil {
					t.Fatal(err)
				}
				if first == "" {
					first = d.Server
				} else if got := d.Server; got != first {
					t.Fatalf("sibling %d went to %s, the group's first to %s", i, got, first)
				}
			}
			w := writerOf(t, r, first)
			for i := 0; i < c.clears; i++ {
				if err := w.Cleared(); err != nil {
					t.Fatal(err)
				}
			}
			d, err := r.Acquire(Request{ID: "g0-3", Tokens: p, Pin: -1})
			if err != nil {
				t.Fatal(err)
			}
			if got := d.Server == first; got != c.followed {
				t.Fatalf("followed the group to %s: %v, want %v (went to %s, hit blocks %v)", first, got, c.followed,
					d.Server, d.HitBlocks)
			}
		})
	}
}
