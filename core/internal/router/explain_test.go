package router

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/kvc-router/kvc-router/core/internal/load"
)

// Each stage of the pipeline shows in the last decision's explanation:
// the session rule that applied, what each filter removed, whether the
// scorers ran, and the pick rule.
func TestExplainStages(t *testing.T) {
	p := prompt(128, 1)
	cases := []struct {
		name    string
		cfg     func() Config
		servers []string
		// setup prepares the router and returns the request to explain.
		setup   func(t *testing.T, r *Router) Request
		server  string
		rule    string
		pick    string
		scored  bool
		removed map[string][]string // filter -> servers removed
		note    string              // a filter's note contains this
	}{
		{name: "new request scored", cfg: kvcConfig, servers: []string{"s0", "s1", "s2"},
			setup: func(t *testing.T, r *Router) Request {
				storeOn(t, r, "s2", p, 16)
				return Request{ID: "a", Tokens: p, Pin: -1}
			},
			server: "s2", rule: SessionNew, pick: pickScored, scored: true, removed: map[string][]string{"health": nil}},
		{name: "sticky stays", cfg: kvcConfig, servers: []string{"s0", "s1"},
			setup: func(t *testing.T, r *Router) Request {
				acq(t, r, "conv", p...)
				return Request{ID: "conv", Tokens: p, Pin: -1}
			},
			server: "s0", rule: SessionStay, pick: pickBound, removed: map[string][]string{"health": nil}},
		{name: "overloaded breakout", cfg: kvcConfig, servers: []string{"s0", "s1"},
			setup: func(t *testing.T, r *Router) Request {
				acq(t, r, "conv", p...)
				r.UpdateMetrics("s1", load.Metrics{HasKVUsage: true})
				r.UpdateMetrics("s0", load.Metrics{Running: 256, Waiting: 300, KVUsage: 0.99, HasKVUsage: true})
				return Request{ID: "conv", Tokens: p, Pin: -1}
			},
			server: "s1", rule: SessionOverloaded, pick: pickScored, scored: true, removed: map[string][]string{"health": nil}},
		{name: "unhealthy breakout", cfg: kvcConfig, servers: []string{"s0", "s1"},
			setup: func(t *testing.T, r *Router) Request {
				acq(t, r, "conv", p...)
				for i := 0; i < 3; i++ {
					r.ld.Fail("s0", errors.New("connection refused"))
				}
				return Request{ID: "conv", Tokens: p, Pin: -1}
			},
			server: "s1", rule: SessionUnhealthy, pick: pickScored, scored: true,
			removed: map[string][]string{"health": {"s0"}}},
		{name: "all unhealthy fail open", cfg: kvcConfig, servers: []string{"s0", "s1"},
			setup: func(t *testing.T, r *Router) Request {
				for i := 0; i < 3; i++ {
					r.ld.Fail("s0", errors.New("down"))
					r.ld.Fail("s1", errors.New("down"))
				}
				return Request{ID: "a", Tokens: p, Pin: -1}
			},
			server: "s0", rule: SessionNew, pick: pickScored, scored: true,
			removed: map[string][]string{"health": nil}, note: "fail-open"},
		{name: "stale binding", cfg: kvcConfig, servers: []string{"s0", "s1"},
			setup: func(t *testing.T, r *Router) Request {
				acq(t, r, "conv", p...)
				r.RemoveServers([]string{"s0"})
				return Request{ID: "conv", Tokens: p, Pin: -1}
			},
			server: "s1", rule: SessionStale, pick: pickScored, scored: true, removed: map[string][]string{"health": nil}},
		{name: "pinned", cfg: kvcConfig, servers: []string{"s0", "s1", "s2"},
			setup:  func(*testing.T, *Router) Request { return Request{ID: "a", Tokens: p, Pin: 4} },
			server: "s1", rule: SessionPinned, pick: pickPinned,
			removed: map[string][]string{"pin": {"s0", "s2"}}, note: "pin 4 selects pool[4 mod 3] = s1"},
		{name: "default mode sticky", cfg: func() Config { return Config{} }, servers: []string{"s0", "s1"},
			setup: func(t *testing.T, r *Router) Request {
				acq(t, r, "conv")
				acq(t, r, "other")
				return Request{ID: "conv", Pin: -1}
			},
			server: "s0", rule: SessionVerl, pick: pickBound, removed: map[string][]string{}},
		{name: "default mode least inflight", cfg: func() Config { return Config{} }, servers: []string{"s0", "s1"},
			setup: func(t *testing.T, r *Router) Request {
				acq(t, r, "x")
				return Request{ID: "y", Pin: -1}
			},
			server: "s1", rule: SessionNew, pick: pickScored, scored: true, removed: map[string][]string{"health": nil}},
		{name: "room filter", cfg: func() Config { return admitConfig(1) }, servers: []string{"s0", "s1"},
			setup: func(t *testing.T, r *Router) Request {
				storeOn(t, r, "s0", p, 16)
				acq(t, r, "x", prompt(32, 9000)...)
				return Request{ID: "a", Tokens: p, Pin: -1}
			},
			server: "s1", rule: SessionNew, pick: pickScored, scored: true,
			removed: map[string][]string{"health": nil, "room": {"s0"}}},
		{name: "session move", cfg: kvcConfig, servers: []string{"s0", "s1", "s2", "s3"},
			setup: func(t *testing.T, r *Router) Request {
				for k := 0; k < 4; k++ {
					bindAt(t, r, fmt.Sprint("sess-", k), 0)
				}
				return Request{ID: "sess-0", Tokens: prompt(96, 5), Pin: -1}
			},
			server: "s1", rule: SessionMove, pick: pickMoved, removed: map[string][]string{"health": nil}},
		{name: "probe", cfg: kvcConfig, servers: []string{"s0", "s1"},
			setup: func(t *testing.T, r *Router) Request {
				acq(t, r, "conv", p...)
				return Request{ID: "conv", Tokens: p, Pin: -1, Probe: true}
			},
			server: "s1", rule: SessionProbe, pick: pickScored, scored: true, removed: map[string][]string{"health": nil}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := mustNew(t, tc.cfg(), tc.servers...)
			req := tc.setup(t, r)
			d, err := r.Acquire(req)
			if err != nil {
				t.Fatal(err)
			}
			e := r.Status().LastDecision
			if e == nil {
				t.Fatal("no last decision")
			}
			if d.Server != tc.server || e.Decision != d {
				t.Fatalf("decision %+v, explained %+v, want server %s", d, e.Decision, tc.server)
			}
			if e.RequestID != req.ID || e.PromptTokens != len(req.Tokens) || e.Seq != r.Status().Counters.Acquires {
				t.Fatalf("request %q/%d seq %d", e.RequestID, e.PromptTokens, e.Seq)
			}
			if e.Session.Rule != tc.rule || e.Session.Why == "" || e.Pick != tc.pick || e.Scored != tc.scored {
				t.Fatalf("session %+v pick %q scored %v; want %s, %q, %v", e.Session, e.Pick, e.Scored, tc.rule, tc.pick, tc.scored)
			}
			got := map[string][]string{}
			note := ""
			for _, f := range e.Filters {
				var ids []string
				for _, rm := range f.Removed {
					if rm.Why == "" {
						t.Fatalf("filter %s removed %s without a reason", f.Name, rm.Server)
					}
					ids = append(ids, rm.Server)
				}
				got[f.Name] = ids
				note += f.Note
			}
			if !reflect.DeepEqual(got, tc.removed) {
				t.Fatalf("filters removed %v, want %v", got, tc.removed)
			}
			if tc.note != "" && !contains(note, tc.note) {
				t.Fatalf("filter notes %q lack %q", note, tc.note)
			}
			if !reflect.DeepEqual(e.Pool, tc.servers) && tc.rule != SessionStale {
				t.Fatalf("pool %v", e.Pool)
			}
			for _, c := range e.Candidates {
				if (c.Score != nil) != tc.scored {
					t.Fatalf("candidate %s score %v, scored %v", c.Server, c.Score, tc.scored)
				}
				if !tc.scored {
					continue
				}
				// The explained terms end in the score the pick used.
				last := c.Terms[len(c.Terms)-1]
				if last.Name != "score" || last.Value != *c.Score {
					t.Fatalf("candidate %s: terms %v, score %v", c.Server, c.Terms, *c.Score)
				}
			}
			if _, err := json.Marshal(r.Status()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// Over random traffic (prefixes, sessions, loads, releases) the explained
// pick is what the pipeline decided: a scored decision's server has the
// highest score among unmasked candidates (ties to the earlier server) and
// each candidate's explained terms end in its score.
func TestExplainAgreesWithDecisions(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for _, cfg := range []Config{kvcConfig(), admitConfig(3), {}} {
		r := mustNew(t, cfg, "s0", "s1", "s2", "s3")
		var inflight []string
		for i := 0; i < 400; i++ {
			req := Request{ID: fmt.Sprint("sess-", rng.IntN(40)), Tokens: prompt(16*(1+rng.IntN(8)), int32(1000*rng.IntN(6))), Pin: -1}
			d, err := r.Acquire(req)
			if err != nil {
				t.Fatal(err)
			}
			inflight = append(inflight, d.Server)
			if len(inflight) > 6 {
				k := rng.IntN(len(inflight))
				r.Release(inflight[k])
				inflight = append(inflight[:k], inflight[k+1:]...)
			}
			e := r.LastDecision()
			if e.Decision != d {
				t.Fatalf("decision %d: explained %+v, made %+v", i, e.Decision, d)
			}
			if !e.Scored {
				continue
			}
			best := -1
			for k, c := range e.Candidates {
				if last := c.Terms[len(c.Terms)-1]; last.Value != *c.Score {
					t.Fatalf("decision %d %s: terms %v score %v", i, c.Server, c.Terms, *c.Score)
				}
				if c.Masked {
					continue
				}
				if best < 0 || *c.Score > *e.Candidates[best].Score {
					best = k
				}
			}
			if e.Candidates[best].Server != d.Server {
				t.Fatalf("decision %d: picked %s, explained best %s (%+v)", i, d.Server, e.Candidates[best].Server, e.Candidates)
			}
		}
	}
}

// Recording the explanation does not allocate per decision once its
// buffers have grown (a probe decision allocates nothing else).
func TestExplainRecordingDoesNotAllocate(t *testing.T) {
	r := mustNew(t, kvcConfig(), "s0", "s1", "s2", "s3")
	p := prompt(256, 1)
	run := func() {
		d, _ := r.Acquire(Request{ID: "r", Tokens: p, Pin: -1, Probe: true})
		r.Release(d.Server)
	}
	run()
	if allocs := testing.AllocsPerRun(200, run); allocs > 0 {
		t.Fatalf("%v allocations per decision", allocs)
	}
	if e := r.LastDecision(); len(e.Candidates) != 4 || e.Session.Rule != SessionProbe {
		t.Fatalf("%+v", e)
	}
}
