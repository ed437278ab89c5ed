package index

import (
	"testing"

	"github.com/kvc-router/kvc-router/core/internal/blockhash"
)

// TestWindowHit pins the sliding-window scan against hand-worked cases of
// vLLM's SlidingWindowManager.find_longest_cache_hit (need = contiguous
// blocks a hit must end on).
func TestWindowHit(t *testing.T) {
	cases := []struct {
		name string
		held string // one char per block of the full-attention hit: x held, . not
		need int
		want int
	}{
		{"all-held", "xxxx", 2, 4},
		{"last-two", "..xx", 2, 4},
		{"only-last", "...x", 2, 0},
		{"run-inside", ".xx.", 2, 3},
		{"leading-short-run", "x...", 2, 1},
		{"leading-run-wins-nothing-else", "x.x.", 2, 1},
		{"need-one", "x..x.", 1, 4},
		{"none", "....", 2, 0},
		{"empty", "", 2, 0},
		{"need-three", "xxx.xx", 3, 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := windowHit(len(tc.held), tc.need, func(i int) bool { return tc.held[i] == 'x' })
			if got != tc.want {
				t.Fatalf("windowHit(%q, need %d) = %d, want %d", tc.held, tc.need, got, tc.want)
			}
		})
	}
}

// TestTrimWindow: a hybrid server whose window group kept only a run's last
// blocks serves the whole prompt of that run, nothing of a prompt that
// shares only its first blocks, and the window follows removals and clears.
func TestTrimWindow(t *testing.T) {
	ix, _ := newTest(t, Config{})
	a, _ := ix.AddServer("a", ServerOptions{})
	b, _ := ix.AddServer("b", ServerOptions{})
	const bs = 4
	ns := blockhash.Namespace("m", "")
	run := toks(6*bs, 100)
	storeRun(t, ix, a, GPU, run, 0, 6, bs, ns)
	storeRun(t, ix, b, GPU, run, 0, 6, bs, ns)
	keys := blockhash.Keys(run, bs, ns)
	// Server a's window group kept blocks 4 and 5 (need 2).
	if err := ix.WindowStored(a, []uint64{engineHash(a, keys[4]), engineHash(a, keys[5])}, 2); err != nil {
		t.Fatal(err)
	}
	check := func(name string, n int, wantA, wantB int) {
		t.Helper()
		m := match(ix, keys[:n], a, b)
		ix.TrimWindow(a, keys[:n], &m[0])
		ix.TrimWindow(b, keys[:n], &m[1]) // no window group: untouched
		if m[0].Blocks != wantA || m[0].Tier[GPU] != wantA || m[1].Blocks != wantB {
			t.Fatalf("%s: a %+v (want %d), b %+v (want %d)", name, m[0], wantA, m[1], wantB)
		}
	}
	check("whole run", 6, 6, 6)
	check("first four blocks only", 4, 0, 4)
	check("first block", 1, 0, 1)
	if err := ix.WindowRemoved(a, []uint64{engineHash(a, keys[5])}); err != nil {
		t.Fatal(err)
	}
	check("block 5 left the window", 6, 0, 6)
	if err := ix.WindowStored(a, []uint64{engineHash(a, keys[0]), engineHash(a, keys[5])}, 2); err != nil {
		t.Fatal(err)
	}
	check("window has 0, 4, 5", 6, 6, 6)
	check("window has 0 only below 4", 3, 1, 3)
	if err := ix.Cleared(a); err != nil {
		t.Fatal(err)
	}
	storeRun(t, ix, a, GPU, run, 0, 6, bs, ns)
	check("cleared window holds nothing", 6, 0, 6)
}
