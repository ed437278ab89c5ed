package router

import (
	"fmt"
	"testing"
)

// bindAt binds session id to server index pin and finishes its request.
func bindAt(t *testing.T, r *Router, id string, pin int) {
	t.Helper()
	d, err := r.Acquire(Request{ID: id, Tokens: prompt(64, int32(pin*1000)), Pin: pin})
	if err != nil {
		t.Fatal(err)
	}
	r.Release(d.Server)
}

func TestSessionMoves(t *testing.T) {
	servers := []string{"s0", "s1", "s2", "s3"}
	off := false
	cases := []struct {
		name string
		cfg  func(*Config)
		// sessions bound per server index before the later turns
		layout []int
		// later turns: one per session, in binding order
		wantMoves uint64
		// every server's bound sessions after the turns, sorted by server
		wantCounts []int
	}{
		// Two tasks' four trajectories each on two of four servers (an
		// agent step with fewer tasks than servers): counts level out.
		{name: "piled sessions spread", layout: []int{4, 4, 0, 0}, wantMoves: 4, wantCounts: []int{2, 2, 2, 2}},
		// An imbalance within max(2, mean/2) stays.
		{name: "near balance stays", layout: []int{3, 2, 2, 2}, wantMoves: 0, wantCounts: []int{3, 2, 2, 2}},
		{name: "disabled", cfg: func(c *Config) { c.SessionMoves = &off }, layout: []int{4, 4, 0, 0}, wantMoves: 0,
			wantCounts: []int{4, 4, 0, 0}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := kvcConfig()
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			r := mustNew(t, cfg, servers...)
			var ids []string
			for s, n := range tc.layout {
				for k := 0; k < n; k++ {
					id := fmt.Sprintf("sess-%d-%d", s, k)
					bindAt(t, r, id, s)
					ids = append(ids, id)
				}
			}
			for _, id := range ids {
				d, err := r.Acquire(Request{ID: id, Tokens: prompt(96, 5), Pin: -1})
				if err != nil {
					t.Fatal(err)
				}
				r.Release(d.Server)
			}
			st := r.Status()
			if st.Counters.SessionMoves != tc.wantMoves {
				t.Fatalf("session moves %d, want %d", st.Counters.SessionMoves, tc.wantMoves)
			}
			for i, s := range servers {
				if got := *r.sessions[s]; got != tc.wantCounts[i] {
					t.Fatalf("%s has %d sessions, want %v", s, got, tc.wantCounts)
				}
			}
		})
	}
}

// Without evidence of later turns (many one-request sessions bound, as a
// GRPO step leaves them) a piled server's sessions stay.
func TestSessionMovesNeedMultiTurnEvidence(t *testing.T) {
	r := mustNew(t, kvcConfig(), "s0", "s1", "s2", "s3")
	for k := 0; k < 200; k++ {
		bindAt(t, r, fmt.Sprint("grpo-", k), k%2) // bound, never seen again
	}
	for k := 0; k < 4; k++ {
		bindAt(t, r, fmt.Sprint("agent-", k), 0)
	}
	d, err := r.Acquire(Request{ID: "agent-0", Tokens: prompt(96, 5), Pin: -1})
	if err != nil {
		t.Fatal(err)
	}
	if d.Server != "s0" || r.Status().Counters.SessionMoves != 0 {
		t.Fatalf("moved to %s with one later turn in 204 sessions", d.Server)
	}
}
