package router

import (
	"fmt"
	"testing"

	"github.com/kvc-router/kvc-router/core/internal/load"
	"github.com/kvc-router/kvc-router/core/internal/strategy"
)

// sessionsOf reads the router's per-server binding counts.
func sessionsOf(r *Router, ids ...string) []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]int, len(ids))
	for i, id := range ids {
		if p := r.sessions[id]; p != nil {
			out[i] = *p
		}
	}
	return out
}

// bindings counts the LRU's bindings per server, the ground truth the
// counters must track.
func bindings(r *Router, ids ...string) []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]int, len(ids))
	for _, k := range r.sticky.Keys() {
		v, _ := r.sticky.Peek(k)
		for i, id := range ids {
			if v == id {
				out[i]++
			}
		}
	}
	return out
}

func TestSessionCounts(t *testing.T) {
	ids := []string{"s0", "s1", "s2"}
	check := func(t *testing.T, r *Router, want ...int) {
		t.Helper()
		got, truth := sessionsOf(r, ids...), bindings(r, ids...)
		if fmt.Sprint(got) != fmt.Sprint(want) || fmt.Sprint(truth) != fmt.Sprint(want) {
			t.Fatalf("sessions %v, LRU bindings %v, want %v", got, truth, want)
		}
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		run  func(t *testing.T, r *Router)
		want []int
	}{
		{"bind counts once per id (default mode)", Config{}, func(t *testing.T, r *Router) {
			acq(t, r, "a") // s0
			acq(t, r, "b") // s1
			acq(t, r, "a") // sticky: no new binding
			acq(t, r, "c") // s2
		}, []int{1, 1, 1}},
		{"LRU eviction uncounts", Config{StickyMaxSize: 2}, func(t *testing.T, r *Router) {
			acq(t, r, "a") // s0
			acq(t, r, "b") // s1
			acq(t, r, "c") // s2, evicts a
		}, []int{0, 1, 1}},
		{"probe binds nothing", kvcConfig(), func(t *testing.T, r *Router) {
			if _, err := r.Acquire(Request{ID: "p", Tokens: prompt(32, 1), Pin: -1, Probe: true}); err != nil {
				t.Fatal(err)
			}
		}, []int{0, 0, 0}},
		{"pinned binding counts", Config{}, func(t *testing.T, r *Router) {
			if _, err := r.Acquire(Request{ID: "x", Pin: 2}); err != nil {
				t.Fatal(err)
			}
		}, []int{0, 0, 1}},
		{"clear sticky zeroes", Config{}, func(t *testing.T, r *Router) {
			acq(t, r, "a")
			acq(t, r, "b")
			r.ClearSticky()
		}, []int{0, 0, 0}},
		{"binding to a removed server uncounts when dropped", Config{}, func(t *testing.T, r *Router) {
			acq(t, r, "a") // s0
			r.RemoveServers([]string{"s0"})
			acq(t, r, "a") // stale: dropped, re-bound to s1
			if err := r.AddServers([]string{"s0"}); err != nil {
				t.Fatal(err)
			}
		}, []int{0, 1, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := mustNew(t, tc.cfg, ids...)
			tc.run(t, r)
			check(t, r, tc.want...)
		})
	}
	t.Run("overload rebind moves the count", func(t *testing.T) {
		r := mustNew(t, kvcConfig(), "s0", "s1")
		p := prompt(128, 1)
		acq(t, r, "conv", p...) // s0
		r.ld.Acquire("s0", 10_000_000)
		d, err := r.Acquire(Request{ID: "conv", Tokens: p, Pin: -1})
		if err != nil || d.Reason != ReasonRebalanced || d.Server != "s1" {
			t.Fatalf("%+v %v", d, err)
		}
		if got, truth := sessionsOf(r, "s0", "s1"), bindings(r, "s0", "s1"); fmt.Sprint(got) != "[0 1]" || fmt.Sprint(truth) != "[0 1]" {
			t.Fatalf("sessions %v, bindings %v", got, truth)
		}
	})
}

// TestFirstTurnsSpreadAcrossServers is an agent step start in miniature:
// tasks x 4 trajectories (one request_id each) arrive at once; every first
// turn is a 1k-token system prompt plus its task's 1k tokens; speculation
// records each placement. Siblings of a task share their whole prompt,
// tasks share only the system prompt. By default session load gives every
// server one task's four trajectories (siblings share a server at no
// session cost); without the term the system-prompt credit crowds sessions
// onto a few servers. That default stacks each task on one server when
// tasks are fewer than servers (the arena's long_agent: 2 tasks x 4 on 4
// servers, two idle): sibling_spread spreads multi-turn siblings too (a
// fresh router presumes multi-turn sessions), and after a history of
// one-request sessions (GRPO) siblings stay together again.
func TestFirstTurnsSpreadAcrossServers(t *testing.T) {
	system := prompt(1024, 1)
	// run places tasks x 4 trajectories after warm one-request sessions,
	// each released at once (a finished GRPO step).
	run := func(t *testing.T, params string, nServers, tasks, warm int, turns ...string) (perServer map[string]int, serversOf map[int]map[string]bool) {
		t.Helper()
		servers := make([]string, nServers)
		for i := range servers {
			servers[i] = fmt.Sprint("s", i)
		}
		cfg := Config{Mode: ModeKVCAware, Model: "m", Strategies: []StrategySpec{{Name: "kvc_aware", Weight: 1, Params: []byte(params)}}}
		if len(turns) > 0 {
			cfg.Turns = turns[0]
		}
		r := mustNew(t, cfg, servers...)
		for i := 0; i < warm; i++ {
			r.Release(acq(t, r, fmt.Sprint("warm", i), prompt(64, int32(10_000_000+1000*i))...))
		}
		perServer, serversOf = map[string]int{}, map[int]map[string]bool{}
		for task := 0; task < tasks; task++ {
			p := append(append([]int32{}, system...), prompt(1024, int32(100_000*(task+1)))...)
			serversOf[task] = map[string]bool{}
			for g := 0; g < 4; g++ {
				s := acq(t, r, fmt.Sprintf("t%d-g%d", task, g), p...)
				perServer[s]++
				serversOf[task][s] = true
			}
		}
		return perServer, serversOf
	}
	even := func(t *testing.T, per map[string]int, nServers, want int) {
		t.Helper()
		for i := 0; i < nServers; i++ {
			if s := fmt.Sprint("s", i); per[s] != want {
				t.Fatalf("sessions per server %v: want %d each", per, want)
			}
		}
	}
	// Not told the rollout is multi-turn, a fresh router keeps each task
	// with its prompt (as a GRPO group) whatever task_spread is.
	keep := `{}`
	t.Run("default: arena long_agent crowds 2 tasks onto 2 of 4 servers", func(t *testing.T) {
		per, _ := run(t, keep, 4, 2, 0)
		if len(per) != 2 {
			t.Fatalf("sessions per server %v: the scenario no longer shows the crowding task_spread fixes", per)
		}
	})
	t.Run("default: one task per server", func(t *testing.T) {
		per, of := run(t, keep, 8, 8, 0)
		even(t, per, 8, 4)
		for task, on := range of {
			if len(on) != 1 {
				t.Fatalf("task %d's trajectories on %v: want one server", task, on)
			}
		}
	})
	// Told the rollout is multi-turn (turns "multi", as verl's hook says
	// for rollout.multi_turn.enable), task_spread (0.1 by default) splits
	// every task from the first request: a hard task's trajectories, long
	// together, no longer share one server.
	t.Run("told multi-turn: arena long_agent, 2 tasks x 4 over 4 servers", func(t *testing.T) {
		per, _ := run(t, keep, 4, 2, 0, TurnsMulti)
		even(t, per, 4, 2)
	})
	t.Run("told multi-turn: every task split, servers even", func(t *testing.T) {
		per, of := run(t, keep, 8, 8, 0, TurnsMulti)
		even(t, per, 8, 4)
		for task, on := range of {
			if len(on) < 2 {
				t.Fatalf("task %d's trajectories on %v: want more than one server", task, on)
			}
		}
	})
	t.Run("told multi-turn, task_spread 0: tasks crowd as before", func(t *testing.T) {
		per, _ := run(t, `{"task_spread":0}`, 4, 2, 0, TurnsMulti)
		if len(per) != 2 {
			t.Fatalf("sessions per server %v: task_spread 0 still spread the tasks", per)
		}
	})
	t.Run("told single-turn: tasks stay whole", func(t *testing.T) {
		per, _ := run(t, keep, 4, 2, 0, TurnsSingle)
		if len(per) != 2 {
			t.Fatalf("sessions per server %v: told single-turn, a fresh router spread the groups", per)
		}
	})
	// With group_spread, after a history of one-request sessions (GRPO) a
	// group splits.
	t.Run("group_spread 0.1: single-turn history splits a group", func(t *testing.T) {
		_, of := run(t, `{"group_spread":0.1,"group_spread_min_ratio":0}`, 8, 8, 400)
		for task, on := range of {
			if len(on) < 2 {
				t.Fatalf("task %d's siblings on %v: want more than one server", task, on)
			}
		}
	})
	spread := `{"sibling_spread":true,"group_spread":0,"task_spread":0}`
	t.Run("sibling_spread: fresh router spreads 8 tasks x 4 over 8 servers", func(t *testing.T) {
		per, of := run(t, spread, 8, 8, 0)
		even(t, per, 8, 4)
		for task, on := range of {
			if len(on) != 4 {
				t.Fatalf("task %d's trajectories on %v: want 4 servers", task, on)
			}
		}
	})
	t.Run("sibling_spread: arena long_agent, 2 tasks x 4 over 4 servers", func(t *testing.T) {
		per, _ := run(t, spread, 4, 2, 0)
		even(t, per, 4, 2)
	})
	t.Run("sibling_spread, group_spread 0: single-turn history keeps siblings together", func(t *testing.T) {
		_, of := run(t, spread, 8, 8, 400)
		for task, on := range of {
			if len(on) != 1 {
				t.Fatalf("task %d's siblings on %v: want one server", task, on)
			}
		}
	})
	t.Run("session_weight 0 crowds", func(t *testing.T) {
		per, _ := run(t, `{"session_weight":0,"group_spread":0}`, 8, 8, 0)
		if len(per) == 8 {
			t.Fatalf("without session load every server got sessions %v: the scenario no longer shows the crowding", per)
		}
	})
}

// historySpy records the sticky history the router hands the strategy.
type historySpy struct{ bound, later []uint64 }

func (*historySpy) Name() string { return "history_spy" }

func (h *historySpy) Score(req *strategy.Request, c []strategy.Candidate, out []float64) {
	h.bound, h.later = append(h.bound, req.SessionsBound), append(h.later, req.LaterTurns)
	for i := range c {
		out[i] = 0
	}
}

func TestStickyHistoryReachesStrategy(t *testing.T) {
	spy := &historySpy{}
	r := mustNew(t, Config{Mode: ModeKVCAware, Strategy: spy}, "s0", "s1")
	acq(t, r, "a") // scored: 0 bound so far
	acq(t, r, "a") // sticky: not scored
	acq(t, r, "a") // sticky
	acq(t, r, "b") // scored: 1 bound, 2 later turns
	// Overload s0: a's next turn is re-scored.
	r.UpdateMetrics("s1", load.Metrics{HasKVUsage: true})
	r.UpdateMetrics("s0", load.Metrics{Running: 256, Waiting: 300, KVUsage: 0.99, HasKVUsage: true})
	acq(t, r, "a") // rebalanced: 2 bound, 2 later turns
	if fmt.Sprint(spy.bound) != "[0 1 2]" || fmt.Sprint(spy.later) != "[0 2 2]" {
		t.Fatalf("history bound %v later %v, want [0 1 2] and [0 2 2]", spy.bound, spy.later)
	}
}
