package router

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
)

func admitConfig(maxInflight int) Config {
	return Config{Mode: ModeKVCAware, Model: "m", Admission: AdmissionSpec{Enabled: true, MaxInflight: maxInflight}}
}

func submit(t *testing.T, r *Router, id string, ticket uint64, tokens []int32) (string, bool) {
	t.Helper()
	d, queued, err := r.Submit(Request{ID: id, Tokens: tokens, Pin: -1}, ticket)
	if err != nil {
		t.Fatalf("submit %s: %v", id, err)
	}
	return d.Server, queued
}

func TestAdmissionHoldsOnlyWhenFull(t *testing.T) {
	r := mustNew(t, admitConfig(2), "s0", "s1")
	for i := 0; i < 4; i++ {
		if _, q := submit(t, r, fmt.Sprint("r", i), uint64(i), prompt(64, int32(1000*i))); q {
			t.Fatalf("request %d held while a server had room", i)
		}
	}
	if r.Inflight("s0") != 2 || r.Inflight("s1") != 2 {
		t.Fatalf("in flight %d/%d, want 2/2", r.Inflight("s0"), r.Inflight("s1"))
	}
	if _, q := submit(t, r, "r4", 4, prompt(64, 9000)); !q {
		t.Fatal("request routed past every server's cap")
	}
	got, _ := r.ReleaseAdmit("s1", nil)
	if len(got) != 1 || got[0].Ticket != 4 || got[0].Decision.Server != "s1" || got[0].Decision.Reason != ReasonAdmitted {
		t.Fatalf("admitted %+v, want ticket 4 on s1", got)
	}
	if st := r.Status().Admission; st.Held != 0 || st.Queued != 1 || st.Admitted != 1 || !st.Enabled {
		t.Fatalf("status %+v", st)
	}
}

// A freed slot goes to a sibling of a prompt its server holds before an
// older request of another prompt, and to a prompt no server holds before
// a sibling of one held elsewhere.
func TestAdmissionPicksSiblingsThenFreshPrompts(t *testing.T) {
	r := mustNew(t, admitConfig(1), "s0", "s1")
	a, b, c := prompt(64, 1), prompt(64, 5000), prompt(64, 9000)
	sa, _ := submit(t, r, "a1", 1, a)
	sb, _ := submit(t, r, "b1", 2, b)
	if sa == sb {
		t.Fatalf("a1 and b1 both on %s with cap 1", sa)
	}
	for i, q := range []struct {
		id     string
		tokens []int32
	}{{"a2", a}, {"c1", c}, {"b2", b}} {
		if _, held := submit(t, r, q.id, uint64(10+i), q.tokens); !held {
			t.Fatalf("%s not held", q.id)
		}
	}
	// sb frees: b2 (sibling there) beats the older a2 and c1.
	got, _ := r.ReleaseAdmit(sb, nil)
	if len(got) != 1 || got[0].Ticket != 12 {
		t.Fatalf("admitted %+v, want b2 (ticket 12)", got)
	}
	if got[0].Decision.HitBlocks[0] == 0 {
		t.Fatalf("b2's decision predicts no hit on its sibling's server: %+v", got[0].Decision)
	}
	// sb frees again: a2's prompt is held on sa, c1's nowhere: c1.
	got, _ = r.ReleaseAdmit(sb, nil)
	if len(got) != 1 || got[0].Ticket != 11 {
		t.Fatalf("admitted %+v, want c1 (ticket 11)", got)
	}
	// sa frees: a2.
	got, _ = r.ReleaseAdmit(sa, nil)
	if len(got) != 1 || got[0].Ticket != 10 || got[0].Decision.Server != sa {
		t.Fatalf("admitted %+v, want a2 (ticket 10) on %s", got, sa)
	}
}

func TestAdmissionStickySessionWaitsForItsServer(t *testing.T) {
	r := mustNew(t, admitConfig(1), "s0", "s1")
	if d, _, err := r.Submit(Request{ID: "sess", Tokens: prompt(64, 1), Pin: 0}, 1); err != nil || d.Server != "s0" {
		t.Fatalf("pinned session: %v %v", d.Server, err)
	}
	r.Release("s0")
	// Another request takes s0's only slot; the session's next turn waits
	// for s0 although s1 has room.
	if d, err := r.Acquire(Request{ID: "x", Tokens: prompt(64, 7000), Pin: 0}); err != nil || d.Server != "s0" {
		t.Fatalf("pinned x: %v %v", d.Server, err)
	}
	if _, held := submit(t, r, "sess", 2, prompt(96, 1)); !held {
		t.Fatal("the session's turn left its server while that server was full and not overloaded")
	}
	if d, _, err := r.Submit(Request{ID: "y", Tokens: prompt(64, 9000), Pin: -1}, 3); err != nil || d.Server != "s1" {
		t.Fatalf("a new request is held or misrouted while s1 has room: %v %v", d.Server, err)
	}
	got, _ := r.ReleaseAdmit("s1", nil)
	if len(got) != 0 {
		t.Fatalf("a slot on s1 went to a session bound to s0: %+v", got)
	}
	got, _ = r.ReleaseAdmit("s0", nil)
	if len(got) != 1 || got[0].Ticket != 2 || got[0].Decision.Server != "s0" {
		t.Fatalf("admitted %+v, want the session on s0", got)
	}
}

func TestAdmissionCancelAndQueueLimit(t *testing.T) {
	cfg := admitConfig(1)
	cfg.Admission.MaxQueue = 2
	r := mustNew(t, cfg, "s0")
	submit(t, r, "a", 1, nil)
	submit(t, r, "b", 2, nil)
	submit(t, r, "c", 3, nil)
	if _, _, err := r.Submit(Request{ID: "d", Pin: -1}, 4); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("err %v, want ErrQueueFull", err)
	}
	if !r.Cancel(2) || r.Cancel(2) || r.Cancel(99) {
		t.Fatal("cancel: want true once for a held ticket, false after and for unknown ones")
	}
	got, _ := r.ReleaseAdmit("s0", nil)
	if len(got) != 1 || got[0].Ticket != 3 {
		t.Fatalf("admitted %+v, want ticket 3 (2 was cancelled)", got)
	}
	st := r.Status().Admission
	if st.Cancelled != 1 || st.Rejected != 1 || st.Held != 0 {
		t.Fatalf("status %+v", st)
	}
}

func TestAdmissionConfigErrors(t *testing.T) {
	for _, a := range []AdmissionSpec{{MaxInflight: -1}, {Headroom: -1}, {Headroom: 17}, {MaxQueue: -1}, {Window: -3}} {
		if _, err := New(Config{Mode: ModeKVCAware, Admission: a}); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: err %v, want ErrConfig", a, err)
		}
	}
}

// Property: under random submits, releases and cancels, a request is held
// only while every server is at its cap (or, for a bound session, its own
// server is), no server ever exceeds its cap, every release that frees a
// slot admits a held request that may go there, and every request is
// accounted for exactly once.
func TestAdmissionInvariantsRandom(t *testing.T) {
	for seed := uint64(1); seed <= 30; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		nsrv := 1 + rng.IntN(4)
		capacity := 1 + rng.IntN(3)
		var names []string
		for i := 0; i < nsrv; i++ {
			names = append(names, fmt.Sprint("s", i))
		}
		r := mustNew(t, admitConfig(capacity), names...)
		running := map[string]int{}
		held := map[uint64]bool{}
		var ticket uint64
		routed := 0
		for step := 0; step < 400; step++ {
			full := true
			for _, n := range names {
				if running[n] < capacity {
					full = false
				}
			}
			switch op := rng.IntN(10); {
			case op < 5:
				ticket++
				id := fmt.Sprint("q", rng.IntN(20)) // some ids repeat: sessions
				srv, queued := submit(t, r, id, ticket, prompt(16*(1+rng.IntN(4)), int32(100*rng.IntN(5))))
				if queued {
					held[ticket] = true
					if !full && r.sticky.Contains(id) == false {
						t.Fatalf("seed %d: new request %s held while a server had room %v", seed, id, running)
					}
					continue
				}
				running[srv]++
				routed++
			case op < 9:
				var busy []string
				for _, n := range names {
					if running[n] > 0 {
						busy = append(busy, n)
					}
				}
				if len(busy) == 0 {
					continue
				}
				n := busy[rng.IntN(len(busy))]
				running[n]--
				got, _ := r.ReleaseAdmit(n, nil)
				for _, a := range got {
					if !held[a.Ticket] {
						t.Fatalf("seed %d: admitted unknown ticket %d", seed, a.Ticket)
					}
					delete(held, a.Ticket)
					running[a.Decision.Server]++
					routed++
				}
				if len(got) == 0 && len(held) > 0 && r.Held() > 0 {
					// Only sessions bound elsewhere may stay held.
					r.mu.Lock()
					for _, h := range r.aq.tickets {
						if h.affinity == nil || h.affinity.id == n {
							r.mu.Unlock()
							t.Fatalf("seed %d: %s freed a slot but ticket %d (may go there) stayed held", seed, n, h.ticket)
						}
					}
					r.mu.Unlock()
				}
			default:
				for tk := range held {
					if !r.Cancel(tk) {
						t.Fatalf("seed %d: cancel of held ticket %d failed", seed, tk)
					}
					delete(held, tk)
					break
				}
			}
			for _, n := range names {
				if running[n] > capacity {
					t.Fatalf("seed %d: %s runs %d > cap %d", seed, n, running[n], capacity)
				}
				if got := r.Inflight(n); got != running[n] {
					t.Fatalf("seed %d: router counts %d in flight on %s, test %d", seed, got, n, running[n])
				}
			}
			if r.Held() != len(held) {
				t.Fatalf("seed %d: router holds %d, test %d", seed, r.Held(), len(held))
			}
		}
		if routed == 0 {
			t.Fatalf("seed %d: nothing routed", seed)
		}
	}
}

func TestAdmissionOffKeepsAcquire(t *testing.T) {
	r := mustNew(t, Config{Mode: ModeKVCAware, Admission: AdmissionSpec{MaxInflight: 1}}, "s0")
	for i := 0; i < 3; i++ {
		if _, q := submit(t, r, fmt.Sprint(i), uint64(i), nil); q {
			t.Fatal("held with admission disabled")
		}
	}
	if r.Inflight("s0") != 3 {
		t.Fatalf("in flight %d", r.Inflight("s0"))
	}
}

// teachStep runs prompts x samples one-request sessions through r one
// at a time (never held: every release comes before the next submit),
// each releasing with an output count alike within its prompt or not.
func teachStep(t *testing.T, r *Router, base int32, prompts, samples int, alike bool) {
	t.Helper()
	for j := 0; j < samples; j++ {
		for i := 0; i < prompts; i++ {
			n := 40 + 7*i + j
			if !alike {
				n = 40 + j + i%3
				if j%2 == 1 {
					n = 900 + j + i%5
				}
			}
			id := fmt.Sprint("t", base, "-", i, "-", j)
			s, held := submit(t, r, id, 0, prompt(64, base+int32(1000*i)))
			if held {
				t.Fatalf("%s held with the pool idle", id)
			}
			r.ReleaseDone(s, id, n, nil)
		}
	}
}

// Admission spreads a GRPO group once its samples are measured alike: a
// slot freed on the server that holds a group's first sample goes to a
// fresh prompt, not the group's next sample, when kvc_aware's
// group_spread applies (the rollout's responses may reach more than 4 x
// the prompt) and a measured within-prompt correlation is at least
// group_spread_min_corr, over the last step or this step's finishers.
// Unalike, siblings go first (shared prefill and KV); unmeasured, a
// group splits over at most group_spread_open_max_servers (here the pool
// of two; TestGroupFullRule checks the cap), and 0 there keeps it whole
// until measured; group_spread_min_corr 0 spreads without measuring.
func TestAdmissionSpreadsAGroupOnceMeasuredAlike(t *testing.T) {
	// lastStep teaches a finished step of prompts x samples, then syncs
	// weights; thisStep teaches finishers of the step still running.
	lastStep := func(prompts, samples int, alike bool) func(*testing.T, *Router) {
		return func(t *testing.T, r *Router) {
			teachStep(t, r, 1<<20, prompts, samples, alike)
			r.ResetCache()
		}
	}
	thisStep := func(prompts, samples int, alike bool) func(*testing.T, *Router) {
		return func(t *testing.T, r *Router) { teachStep(t, r, 1<<20, prompts, samples, alike) }
	}
	for _, tc := range []struct {
		name   string
		params string
		resp   int
		teach  func(t *testing.T, r *Router)
		spread bool
	}{
		{"alike last step", `{}`, 8192, lastStep(12, 4, true), true},
		{"unalike last step", `{}`, 8192, lastStep(12, 4, false), false},
		{"too few prompts to measure: split in two", `{}`, 8192, lastStep(4, 12, true), true},
		{"too few prompts to measure, group_spread_open_max_servers 0", `{"group_spread_open_max_servers":0}`, 8192,
			lastStep(4, 12, true), false},
		{"unalike last step, group_spread_open_max_servers 0", `{"group_spread_open_max_servers":0}`, 8192,
			lastStep(12, 4, false), false},
		// 65 prompts x 6 finished in this step (read every 64 responses).
		{"alike within this step", `{}`, 8192, thisStep(livePrompts+1, 6, true), true},
		{"unalike within this step", `{}`, 8192, thisStep(livePrompts+1, 6, false), false},
		{"responses under 4 x the prompt", `{}`, 256, lastStep(12, 4, true), false},
		{"group_spread 0", `{"group_spread":0}`, 8192, lastStep(12, 4, true), false},
		{"group_spread_min_corr 0: nothing to measure", `{"group_spread_min_corr":0}`, 8192, lastStep(4, 12, false), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := admitConfig(1)
			c.ResponseTokens = tc.resp
			c.Strategies = []StrategySpec{{Name: "kvc_aware", Weight: 1, Params: []byte(tc.params)}}
			r := mustNew(t, c, "s0", "s1")
			tc.teach(t, r)
			a, b, fresh := prompt(64, 1), prompt(64, 5000), prompt(64, 9000)
			sa, _ := submit(t, r, "a1", 1, a)
			sb, _ := submit(t, r, "b1", 2, b)
			if sa == sb {
				t.Fatalf("a1 and b1 both on %s with cap 1", sa)
			}
			for i, p := range [][]int32{a, fresh} {
				if _, held := submit(t, r, fmt.Sprint("h", i), uint64(10+i), p); !held {
					t.Fatalf("h%d not held at the cap", i)
				}
			}
			want := uint64(10) // a's sibling, on the server holding a
			if tc.spread {
				want = 11 // a has one on sa, none on sb: the fresh prompt
			}
			got, _ := r.ReleaseAdmit(sa, nil)
			if len(got) != 1 || got[0].Ticket != want {
				t.Fatalf("admitted %+v on %s, want ticket %d", got, sa, want)
			}
			if n := r.Status().Admission.GroupSpread; (n > 0) != tc.spread {
				t.Fatalf("group_spread_total %d with spread %v", n, tc.spread)
			}
			// The group's share is even again (one on each server once b
			// frees for the sibling): nothing is passed over.
			if tc.spread {
				got, _ = r.ReleaseAdmit(sb, nil)
				if len(got) != 1 || got[0].Ticket != 10 {
					t.Fatalf("admitted %+v on %s, want a's sibling (ticket 10)", got, sb)
				}
			}
		})
	}
}

// groupFull's rule on one group's placements this step (2 on s0, 1 on
// s1, none on s2), once its samples are measured alike: a server holding
// more than the fewest passes the sibling over; group_spread_max_servers
// takes the fewest over the servers already holding the group once it is
// on that many, and a server outside them takes none. Before anything is
// measured group_spread_open_max_servers is that cap (0: never spread).
func TestGroupFullRule(t *testing.T) {
	for _, tc := range []struct {
		name       string
		params     string
		unmeasured bool
		full       map[string]bool
	}{
		{"no cap: even over the pool", `{}`, false, map[string]bool{"s0": true, "s1": true, "s2": false}},
		{"cap 2: even over its two servers", `{"group_spread_max_servers":2}`, false, map[string]bool{"s0": true, "s1": false, "s2": true}},
		{"cap 3: not reached", `{"group_spread_max_servers":3}`, false, map[string]bool{"s0": true, "s1": true, "s2": false}},
		{"group_spread 0: never", `{"group_spread":0}`, false, map[string]bool{"s0": false, "s1": false, "s2": false}},
		{"unmeasured: split in two", `{}`, true, map[string]bool{"s0": true, "s1": false, "s2": true}},
		{"unmeasured, open cap 3: not reached", `{"group_spread_open_max_servers":3}`, true, map[string]bool{"s0": true, "s1": true, "s2": false}},
		{"unmeasured, open cap 0: whole until measured", `{"group_spread_open_max_servers":0}`, true, map[string]bool{"s0": false, "s1": false, "s2": false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := admitConfig(4)
			c.ResponseTokens = 8192
			c.Strategies = []StrategySpec{{Name: "kvc_aware", Weight: 1, Params: []byte(tc.params)}}
			r := mustNew(t, c, "s0", "s1", "s2")
			h := &held{req: Request{Tokens: prompt(64, 7)}, last: 42}
			r.mu.Lock()
			defer r.mu.Unlock()
			r.bound = 200 // one-request sessions: a GRPO step
			if r.lens != nil && !tc.unmeasured {
				r.lens.measured, r.lens.measuredOK = 0.9, true
			}
			for _, id := range []string{"s0", "s0", "s1"} {
				r.placed(h.last, r.byID[id])
			}
			for id, want := range tc.full {
				if got := r.groupFull(h, r.byID[id]); got != want {
					t.Fatalf("groupFull on %s = %v, want %v", id, got, want)
				}
			}
		})
	}
}
