package router

import (
	"fmt"
	"testing"
)

// kvcRouterWith is a kvc_aware router over servers, its config edited by
// edit (nil: kvcConfig as is).
func kvcRouterWith(t *testing.T, edit func(*Config), servers ...string) *Router {
	t.Helper()
	cfg := kvcConfig()
	if edit != nil {
		edit(&cfg)
	}
	return mustNew(t, cfg, servers...)
}

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
			r := kvcRouterWith(t, tc.cfg, servers...)
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
// GRPO step leaves them) a piled server's sessions stay, by either rule:
// s0 is bound to far more sessions than s2 and s3 and has a long prompt in
// flight where they have none.
func TestSessionMovesNeedMultiTurnEvidence(t *testing.T) {
	r := mustNew(t, kvcConfig(), "s0", "s1", "s2", "s3")
	for k := 0; k < 200; k++ {
		bindAt(t, r, fmt.Sprint("grpo-", k), k%2) // bound, never seen again
	}
	for k := 0; k < 4; k++ {
		bindAt(t, r, fmt.Sprint("agent-", k), 0)
	}
	if _, err := r.Acquire(Request{ID: "agent-1", Tokens: prompt(5000, 3), Pin: -1}); err != nil {
		t.Fatal(err)
	}
	d, err := r.Acquire(Request{ID: "agent-0", Tokens: prompt(96, 5), Pin: -1})
	if err != nil {
		t.Fatal(err)
	}
	if c := r.Status().Counters; d.Server != "s0" || c.SessionMoves != 0 || c.SessionMovesTokens != 0 {
		t.Fatalf("moved to %s with two later turns in 204 sessions (%d moves)", d.Server, c.SessionMoves)
	}
}

// TestSessionMovesByTokens: session counts are even (two sessions per
// server), but s0 has a long prompt in flight. A session bound to s0 moves
// to the server with the fewest prompt tokens in flight (s2) when s0's
// excess is at least session_move_tokens times its own prompt and at least
// minMoveExcessTokens.
func TestSessionMovesByTokens(t *testing.T) {
	servers := []string{"s0", "s1", "s2", "s3"}
	f := func(v float64) *float64 { return &v }
	off := false
	cases := []struct {
		name  string
		cfg   func(*Config)
		held  int    // s0's prompt tokens in flight (0: 12,000)
		own   int    // the moving session's next prompt, in tokens
		want  string // where the turn lands
		moved uint64 // session_moves_tokens after the turn
	}{
		// 4 x 2,900 is under s0's 12,000-token excess over s2.
		{name: "default moves a short context", own: 2900, want: "s2", moved: 1},
		// 4 x 3,100 = 12,400 exceeds the excess: the prefill would cost more.
		{name: "a long context stays", own: 3100, want: "s0"},
		{name: "lower setting moves it", cfg: func(c *Config) { c.SessionMoveTokens = f(2) }, own: 4800, want: "s2", moved: 1},
		{name: "at the setting exactly it moves", cfg: func(c *Config) { c.SessionMoveTokens = f(3) }, own: 4000, want: "s2", moved: 1},
		// A tiny prompt: 4 x 10 is far under the excess, but 4,000 tokens
		// are under the floor; 4,096 are not.
		{name: "an excess under the floor stays", held: 4000, own: 10, want: "s0"},
		{name: "an excess at the floor moves", held: 4096, own: 10, want: "s2", moved: 1},
		{name: "0 disables", cfg: func(c *Config) { c.SessionMoveTokens = f(0) }, own: 200, want: "s0"},
		{name: "session_moves off disables", cfg: func(c *Config) { c.SessionMoves = &off }, own: 200, want: "s0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := kvcRouterWith(t, tc.cfg, servers...)
			for s := range servers {
				for k := 0; k < 2; k++ {
					bindAt(t, r, fmt.Sprintf("sess-%d-%d", s, k), s)
				}
			}
			held := tc.held
			if held == 0 {
				held = 12000
			}
			// Later turns stay in flight: s0 holds held tokens, s1 and s3
			// a short prompt each, s2 none (the target).
			hold := func(id string, n int, base int32) {
				if _, err := r.Acquire(Request{ID: id, Tokens: prompt(n, base), Pin: -1}); err != nil {
					t.Fatal(err)
				}
			}
			hold("sess-0-1", held, 7)
			hold("sess-3-0", 100, 9)
			hold("sess-1-0", 100, 11)
			d, err := r.Acquire(Request{ID: "sess-0-0", Tokens: prompt(tc.own, 13), Pin: -1})
			if err != nil {
				t.Fatal(err)
			}
			if d.Server != tc.want {
				t.Fatalf("turn landed on %s, want %s", d.Server, tc.want)
			}
			if got := r.Status().Counters.SessionMovesTokens; got != tc.moved {
				t.Fatalf("session_moves_tokens %d, want %d", got, tc.moved)
			}
			if tc.moved > 0 && *r.sessions["s0"] != 1 {
				t.Fatalf("s0 still bound to %d sessions after the move, want 1", *r.sessions["s0"])
			}
		})
	}
}

// Effective reports the default where it applies and 0 where sessions
// never move.
func TestSessionMoveTokensEffective(t *testing.T) {
	off := false
	for _, tc := range []struct {
		cfg  Config
		want float64
	}{
		{kvcConfig(), DefaultSessionMoveTokens},
		{Config{Mode: ModeDefault}, 0},
		{Config{Mode: ModeKVCAware, SessionMoves: &off}, 0},
	} {
		eff, err := tc.cfg.Effective()
		if err != nil {
			t.Fatal(err)
		}
		if eff.SessionMoveTokens == nil || *eff.SessionMoveTokens != tc.want {
			t.Fatalf("mode %q: effective session_move_tokens %v, want %v", tc.cfg.Mode, eff.SessionMoveTokens, tc.want)
		}
	}
}
