package strategy

import (
	"math"
	"testing"

	json "github.com/goccy/go-json"

	"github.com/kvc-router/kvc-router/core/internal/index"
)

func cand(id string, order, inflight int, hit [index.NumTiers]int, hittable int) Candidate {
	n := hit[0] + hit[1] + hit[2]
	return Candidate{ID: id, Order: order, Inflight: inflight, Healthy: true, Fresh: true,
		Hit: index.Match{Blocks: n, Tier: hit}, HittableBlocks: hittable}
}

func peerPick(t *testing.T, s Strategy, c []Candidate) string {
	t.Helper()
	out := make([]float64, len(c))
	s.Score(&Request{}, c, out)
	return c[Pick(c, out)].ID
}

func build(t *testing.T, name, params string) Strategy {
	t.Helper()
	s, err := Build(name, json.RawMessage(params))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestKVCAwareMarginalAndTokenLoad(t *testing.T) {
	// Shared system prompt: 4 of 8 hittable blocks on a and b, nothing on c.
	// Without marginal credit the shared blocks earn credit; with it only
	// the excess over the least-hit candidate counts (a's extra block).
	v1 := build(t, "kvc_aware", `{"alpha":0.7,"marginal":false,"saved_scale_tokens":0,"token_load":false}`)
	v2 := build(t, "kvc_aware", `{"saved_scale_tokens":0,"token_load":false}`)
	c := []Candidate{cand("a", 0, 0, [3]int{5, 0, 0}, 8), cand("b", 1, 0, [3]int{4, 0, 0}, 8), cand("c", 2, 0, [3]int{4, 0, 0}, 8)}
	c[0].Load, c[1].Load, c[2].Load = 0.30, 0.05, 0.0
	out := make([]float64, 3)
	v1.Score(&Request{}, c, out)
	// kvc_aware: c = 0.7*0.7*(4/8) + 0.3*1 = 0.545, the shared blocks earn credit.
	if math.Abs(out[2]-0.545) > 1e-9 {
		t.Fatalf("kvc_aware score for c %v, want 0.545", out[2])
	}
	v2.Score(&Request{Tokens: make([]int32, 140)}, c, out)
	// alpha 0.3, gpu weight 0.7: a = 0.3*0.7*(1/8) + 0.7*0.7 = 0.51625; c = 0.7
	if math.Abs(out[0]-0.51625) > 1e-9 || math.Abs(out[2]-0.7) > 1e-9 {
		t.Fatalf("v2 scores %v", out)
	}
	// Token load: 240k in-flight prompt tokens on a 480k-token server is
	// load 0.5 even when the scraped load says 0.
	tl := build(t, "kvc_aware", `{"saved_scale_tokens":0,"marginal":false}`)
	d := []Candidate{cand("a", 0, 1, [3]int{}, 8), cand("b", 1, 1, [3]int{}, 8)}
	d[0].InflightTokens = 240_000
	tl.Score(&Request{}, d, out[:2])
	if math.Abs(out[0]-0.7*0.5) > 1e-9 || math.Abs(out[1]-0.7) > 1e-9 {
		t.Fatalf("token-load scores %v", out[:2])
	}
	// Over-committed servers keep being ranked: 2x beats 3x capacity.
	d[0].InflightTokens, d[1].InflightTokens = 960_000, 1_440_000
	if got := peerPick(t, tl, d); got != "a" {
		t.Fatalf("over-committed ranking picked %s, want the less loaded a", got)
	}
	// Saved-token scale: a 2-block hit of 16-token blocks saves 32 tokens,
	// 1/128 of the 4,096 scale.
	ss := build(t, "kvc_aware", `{"marginal":false,"token_load":false}`)
	e := []Candidate{cand("a", 0, 0, [3]int{2, 0, 0}, 2)}
	ss.Score(&Request{Tokens: make([]int32, 48)}, e, out[:1])
	if want := 0.3*0.7*1.0*(32.0/4096) + 0.7; math.Abs(out[0]-want) > 1e-9 {
		t.Fatalf("saved-scale score %v, want %v", out[0], want)
	}
}

// TestKVCAwareSessionLoad covers session_weight: bound sticky sessions count
// as load when a session is placed, relative to the mean over candidates.
func TestKVCAwareSessionLoad(t *testing.T) {
	// Eight servers; a holds four bound sessions and, from them, the shared
	// 1k-token system prompt (64 of the prompt's 96 hittable blocks).
	crowd := func() []Candidate {
		c := make([]Candidate, 8)
		for i := range c {
			c[i] = cand(string(rune('a'+i)), i, 0, [3]int{}, 96)
		}
		c[0].Hit = index.Match{Blocks: 64, Tier: [3]int{64}}
		c[0].Sessions, c[0].Inflight, c[0].InflightTokens = 4, 4, 4*1552
		return c
	}
	tokens := make([]int32, 1552)
	// sibling: a holds the whole prompt (n siblings of the request bound).
	sibling := func(n int) func() []Candidate {
		return func() []Candidate {
			c := crowd()
			c[0].Hit = index.Match{Blocks: 96, Tier: [3]int{96}}
			c[0].Sessions, c[0].Inflight, c[0].InflightTokens = n, n, int64(n*1552)
			return c
		}
	}
	for _, tc := range []struct {
		name   string
		params string
		cands  func() []Candidate
		want   string
		// bound, later: the router's sticky history (zero: a fresh router,
		// which presumes multi-turn sessions).
		bound, later uint64
	}{
		// Without the term the system-prompt credit outweighs a's small
		// in-flight load: the crowding kvbench's agent_long showed.
		{"off: system prompt pulls to the crowded server", `{"session_weight":0}`, crowd, "a", 0, 0},
		{"default: bound sessions push the new session away", `{}`, crowd, "b", 0, 0},
		{"tuned alpha 0.15", `{"alpha":0.15}`, crowd, "b", 0, 0},
		{"alpha 0.5", `{"alpha":0.5}`, crowd, "b", 0, 0},
		// Equal session counts change no ranking (the term is relative):
		// the prefix holder still wins.
		{"balanced sessions keep cache affinity", `{}`, func() []Candidate {
			c := crowd()
			for i := range c {
				c[i].Sessions = 4
			}
			return c
		}, "a", 0, 0},
		// Default: a full-prompt sibling hit (same task or GRPO prompt)
		// carries no session load, even with four bound: siblings stay
		// together.
		{"one sibling bound: full hit wins", `{}`, sibling(1), "a", 0, 0},
		{"four siblings bound: full hit still wins", `{}`, sibling(4), "a", 0, 0},
		// sibling_spread: the exemption holds only as far as sessions are
		// one-request. Multi-turn siblings save one first-prompt prefill
		// but then send all their turns to that server, so on a fresh
		// router (presumed multi-turn) or with agent history they spread:
		// the arena's long_agent stacked each task on one server without it.
		{"spread: one sibling bound, fresh router", `{"sibling_spread":true}`, sibling(1), "b", 0, 0},
		{"spread: four siblings bound, fresh router", `{"sibling_spread":true}`, sibling(4), "b", 0, 0},
		{"spread: four siblings bound, agent history", `{"sibling_spread":true}`, sibling(4), "b", 64, 64 * 29},
		// After a GRPO step's one-request sessions the exemption holds.
		{"spread: one sibling bound, single-turn history", `{"sibling_spread":true}`, sibling(1), "a", 400, 0},
		{"spread: four siblings bound, single-turn history", `{"sibling_spread":true}`, sibling(4), "a", 400, 0},
		// Stale bindings spread evenly (b..h hold 4, a holds 8 of which 4
		// new) weigh like a cold fleet: only the excess over the least
		// counts.
		{"stale bindings do not dilute the excess", `{}`, func() []Candidate {
			c := crowd()
			for i := range c {
				c[i].Sessions = 4
			}
			c[0].Sessions = 8
			return c
		}, "b", 0, 0},
		// History of multi-turn sessions (agents: ~30 turns each) keeps
		// the term at full weight.
		{"agent history", `{}`, crowd, "b", 64, 64 * 29},
		// 2,000 sessions bound and none ever returned (GRPO samples): bound
		// sessions are not future work, the term fades and cache affinity
		// decides as with session_weight 0.
		{"single-turn history switches it off", `{}`, crowd, "a", 2000, 0},
		// Among servers without a hit, the fewest sessions wins even when
		// in-flight counts are equal.
		{"fewest sessions among equals", `{}`, func() []Candidate {
			c := crowd()
			c[0].Hit = index.Match{}
			for i := range c {
				c[i].Sessions, c[i].InflightTokens = 3, 0
			}
			c[5].Sessions = 1
			return c
		}, "f", 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := build(t, "kvc_aware", tc.params)
			c := tc.cands()
			out := make([]float64, len(c))
			s.Score(&Request{Tokens: tokens, SessionsBound: tc.bound, LaterTurns: tc.later}, c, out)
			if got := c[Pick(c, out)].ID; got != tc.want {
				t.Fatalf("picked %s, want %s (scores %v)", got, tc.want, out)
			}
		})
	}
	// The term ranks placements only: the load the router compares with
	// load_threshold for sticky breakout ignores sessions.
	k := build(t, "kvc_aware", `{"session_weight":1}`)
	c := Candidate{InflightTokens: 48_000, Sessions: 100}
	if got := EffectiveLoad(k, &c); got != 0.1 {
		t.Fatalf("EffectiveLoad with sessions = %v, want 0.1", got)
	}
	// A lone candidate scores as without the term.
	one := []Candidate{cand("a", 0, 0, [3]int{}, 8)}
	one[0].Sessions = 50
	out := make([]float64, 1)
	k.Score(&Request{}, one, out)
	if math.Abs(out[0]-0.7) > 1e-9 {
		t.Fatalf("single candidate score %v, want 0.7", out[0])
	}
	mustRefuse(t, `{"session_weight":-0.1}`, `{"session_weight":11}`, `{"session_weight":"x"}`, `{"sibling_spread":1}`)
}

// mustRefuse fails for each kvc_aware parameter set that builds.
func mustRefuse(t *testing.T, params ...string) {
	t.Helper()
	for _, bad := range params {
		if _, err := Build("kvc_aware", json.RawMessage(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

// checkGroupPick scores c for req with k and fails unless it picks want
// and candidate i's group_load term is groupLoad.
func checkGroupPick(t *testing.T, k Strategy, req *Request, c []Candidate, want string, i int, groupLoad float64) {
	t.Helper()
	out := make([]float64, len(c))
	k.Score(req, c, out)
	if got := c[Pick(c, out)].ID; got != want {
		t.Fatalf("picked %s (scores %v), want %s", got, out, want)
	}
	for _, term := range k.(Explainer).Explain(req, len(req.Tokens), c)[i] {
		if term.Name == "group_load" && math.Abs(term.Value-groupLoad) > 1e-4 {
			t.Fatalf("%s's group_load %v, want %v", c[i].ID, term.Value, groupLoad)
		}
	}
}

// TestKVCAwareGroupSpread: each sibling already placed on a server beyond
// the fewest on any candidate adds group_spread to its load, so a group
// leaves the server holding its prompt once it has more there than
// elsewhere; the term neither enters EffectiveLoad (breakout) nor applies
// to a lone candidate.
func TestKVCAwareGroupSpread(t *testing.T) {
	full := [3]int{8, 0, 0}
	cases := []struct {
		name      string
		params    string
		aSiblings int
		tokens    int
		want      string
		groupLoad float64 // a's group_load term
		resp      int     // Request.ResponseTokens
	}{
		{"a holds the prompt, no sibling yet: cache wins", `{"group_spread":0.25,"group_spread_min_ratio":0}`, 0, 1024, "a", 0, 0},
		{"a has one more sibling: b", `{"group_spread":0.25,"group_spread_min_ratio":0}`, 1, 1024, "b", 0.25, 0},
		// A 4k-token prompt's credit (0.3 x 0.7 x 0.89) outweighs one
		// excess sibling (0.7 x 0.25), not two.
		{"long prompt, one more sibling: a", `{"group_spread":0.25,"group_spread_min_ratio":0}`, 1, 4096, "a", 0.25, 0},
		{"long prompt, two more siblings: b", `{"group_spread":0.25,"group_spread_min_ratio":0}`, 2, 4096, "b", 0.5, 0},
		{"default, response length not said (gate closed): a keeps the group", `{}`, 3, 1024, "a", 0, 0},
		{"group_spread 0: a keeps the group", `{"group_spread":0}`, 3, 1024, "a", 0, 0},
		{"a small weight loses to the cache credit", `{"group_spread":0.01,"group_spread_min_ratio":0}`, 1, 1024, "a", 0.01, 0},
		// The gate: default group_spread 0.1 where responses may be longer
		// than 4x the prompt.
		{"default, responses over 4x the prompt: b", `{}`, 3, 1024, "b", 0.3, 4097},
		{"default, responses exactly 4x the prompt: a keeps the group", `{}`, 3, 1024, "a", 0, 4096},
		{"min ratio 2, responses over 2x the prompt: b", `{"group_spread_min_ratio":2}`, 3, 1024, "b", 0.3, 2049},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := build(t, "kvc_aware", tc.params)
			c := []Candidate{cand("a", 0, 0, full, 8), cand("b", 1, 0, [3]int{}, 8)}
			c[0].Siblings = tc.aSiblings
			// A history of one-request sessions (GRPO): the term applies
			// to one-request siblings (x (1 - MultiTurn), ~0.99997 here).
			req := &Request{Tokens: make([]int32, tc.tokens), SessionsBound: 1 << 20, ResponseTokens: tc.resp}
			checkGroupPick(t, k, req, c, tc.want, 0, tc.groupLoad)
		})
	}
	// The ratio gate reads the rollout's mean prompt when the router has
	// one (PromptTokensMean), else the request's own.
	for _, g := range []struct {
		name         string
		tokens, mean int
		want         string
		groupLoad    float64
	}{
		{"a 4,096-token prompt, rollout mean 1,024: b", 4096, 1024, "b", 0.3},
		{"a 1,024-token prompt, rollout mean 4,096: a keeps the group", 1024, 4096, "a", 0},
		{"a 4,096-token prompt, no mean yet: its own ratio (2) keeps the group", 4096, 0, "a", 0},
	} {
		t.Run(g.name, func(t *testing.T) {
			k := build(t, "kvc_aware", `{}`)
			c := []Candidate{cand("a", 0, 0, full, 8), cand("b", 1, 0, [3]int{}, 8)}
			c[0].Siblings = 3
			req := &Request{Tokens: make([]int32, g.tokens), SessionsBound: 1 << 20, ResponseTokens: 8192, PromptTokensMean: g.mean}
			checkGroupPick(t, k, req, c, g.want, 0, g.groupLoad)
		})
	}
	k := build(t, "kvc_aware", `{"group_spread":5}`)
	c := Candidate{InflightTokens: 48_000, Siblings: 100}
	if got := EffectiveLoad(k, &c); got != 0.1 {
		t.Fatalf("EffectiveLoad with siblings = %v, want 0.1", got)
	}
	one := []Candidate{cand("a", 0, 0, full, 8)}
	one[0].Siblings = 9
	out := make([]float64, 1)
	k.Score(&Request{SessionsBound: 1 << 20}, one, out)
	if out[0] < 0.7 {
		t.Fatalf("single candidate score %v: the group term applied to a lone candidate", out[0])
	}
	// Multi-turn siblings (an agent task's trajectories: every bound
	// session sent later turns) get no group_spread term: task_spread is
	// theirs (0 here).
	k = build(t, "kvc_aware", `{"group_spread":5,"task_spread":0}`)
	agents := []Candidate{cand("a", 0, 0, full, 8), cand("b", 1, 0, [3]int{}, 8)}
	agents[0].Siblings = 3
	areq := &Request{Tokens: make([]int32, 1024), SessionsBound: 100, LaterTurns: 1000}
	for _, term := range k.(Explainer).Explain(areq, 1024, agents)[0] {
		if term.Name == "group_load" && term.Value != 0 {
			t.Fatalf("multi-turn group_load %v, want 0", term.Value)
		}
	}
	mustRefuse(t, `{"group_spread":-0.1}`, `{"group_spread":10.5}`, `{"group_spread":"x"}`)
}

// TestKVCAwareCorrGates: each spread's correlation gate closes it once a
// finished step measured its figure below the gate's minimum, and leaves it
// open while nothing is measured. group_spread_min_corr reads the
// within-prompt figure (one-request siblings: a GRPO group, where the ratio
// gate decides before any measurement); task_spread_min_corr reads the
// within-task one (multi-turn siblings: an agent task). Each reads only its
// own figure: the other, set opposite, neither opens nor closes it.
func TestKVCAwareCorrGates(t *testing.T) {
	full := [3]int{8, 0, 0}
	cases := []struct {
		name      string
		params    string
		task      bool    // an agent task's trajectory (task_spread), else a GRPO sample
		own       float64 // the gate's own figure
		known     bool
		other     float64 // the other gate's figure (known)
		want      string
		groupLoad float64
	}{
		{"group: nothing measured yet: the ratio gate spreads", `{}`, false, 0, false, 0, "b", 0.3},
		{"group: measured 0.1 under the default 0.25: a keeps the group", `{}`, false, 0.1, true, 0.9, "a", 0},
		{"group: measured 0: a keeps the group", `{}`, false, 0, true, 0.9, "a", 0},
		{"group: measured exactly 0.25: spreads", `{}`, false, 0.25, true, 0, "b", 0.3},
		{"group: measured 0.6: spreads", `{}`, false, 0.6, true, 0, "b", 0.3},
		{"group: min corr 0 reads no measurement: spreads", `{"group_spread_min_corr":0}`, false, 0, true, 0, "b", 0.3},
		{"group: min corr 0.7, measured 0.6: a keeps the group", `{"group_spread_min_corr":0.7}`, false, 0.6, true, 0.9, "a", 0},
		{"task: nothing measured yet: the task spreads", `{}`, true, 0, false, 0, "b", 0.1},
		{"task: measured 0.05 under the default 0.25: a keeps the task", `{}`, true, 0.05, true, 0.9, "a", 0},
		{"task: measured exactly 0.25: spreads", `{}`, true, 0.25, true, 0, "b", 0.1},
		{"task: measured 0.9: spreads whatever the first turns' correlation", `{}`, true, 0.9, true, 0, "b", 0.1},
		{"task: min corr 0 reads no measurement: spreads", `{"task_spread_min_corr":0}`, true, 0, true, 0, "b", 0.1},
		{"task: min corr 0.95, measured 0.9: a keeps the task", `{"task_spread_min_corr":0.95}`, true, 0.9, true, 0.9, "a", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := build(t, "kvc_aware", tc.params)
			c := []Candidate{cand("a", 0, 0, full, 8), cand("b", 1, 0, [3]int{}, 8)}
			req := &Request{Tokens: make([]int32, 1024), SessionsBound: 1 << 20, ResponseTokens: 8192,
				LengthCorr: tc.own, LengthCorrKnown: tc.known, TaskCorr: tc.other, TaskCorrKnown: true}
			c[0].Siblings = 3
			if tc.task {
				req = &Request{Tokens: make([]int32, 1024), SessionsBound: 100, LaterTurns: 1000,
					TaskCorr: tc.own, TaskCorrKnown: tc.known, LengthCorr: tc.other, LengthCorrKnown: true}
				c[0].Siblings = 1
			}
			checkGroupPick(t, k, req, c, tc.want, 0, tc.groupLoad)
		})
	}
	if !ReadsLengthCorr(build(t, "kvc_aware", `{}`)) {
		t.Error("defaults do not read the measured correlation")
	}
	if !ReadsLengthCorr(build(t, "kvc_aware", `{"group_spread":0}`)) {
		t.Error("task_spread_min_corr alone does not ask the router to measure")
	}
	for _, params := range []string{`{"group_spread_min_corr":0,"group_spread_open_corr":0,"task_spread_min_corr":0}`, `{"group_spread":0,"task_spread":0}`,
		`{"group_spread":0,"task_spread_min_corr":0}`} {
		if ReadsLengthCorr(build(t, "kvc_aware", params)) {
			t.Errorf("%s reads the measured correlation with nothing to gate", params)
		}
	}
	mustRefuse(t, `{"group_spread_min_corr":-0.1}`, `{"group_spread_min_corr":1.5}`, `{"group_spread_min_corr":"x"}`,
		`{"task_spread_min_corr":-0.1}`, `{"task_spread_min_corr":1.5}`, `{"task_spread_min_corr":"x"}`)
}

// TestKVCAwareOpenCorr: group_spread_open_corr opens a closed ratio gate
// for placement by score once the measured within-prompt correlation
// reaches it, never for admission's SpreadsGroup; nothing measured, a
// figure under it, or group_spread_min_corr closing first leave the group
// whole.
func TestKVCAwareOpenCorr(t *testing.T) {
	full := [3]int{8, 0, 0}
	cases := []struct {
		name      string
		params    string
		resp      int // ratio 2 at 2,048 against the 1,024-token prompt: the default gate (4) is closed
		corr      float64
		known     bool
		want      string
		groupLoad float64
	}{
		{"off, measured 0.6: a keeps the group", `{"group_spread_open_ratio":0,"group_spread_open_corr":0}`, 2048, 0.6, true, "a", 0},
		{"default (off), measured 0.9: a keeps the group", `{"group_spread_open_ratio":0}`, 2048, 0.9, true, "a", 0},
		{"0.25, measured 0.3: b", `{"group_spread_open_ratio":0,"group_spread_open_corr":0.25}`, 2048, 0.3, true, "b", 0.3},
		{"0.25, measured 0.2: a keeps the group", `{"group_spread_open_ratio":0,"group_spread_open_corr":0.25}`, 2048, 0.2, true, "a", 0},
		{"0.25, nothing measured: a keeps the group", `{"group_spread_open_ratio":0,"group_spread_open_corr":0.25}`, 2048, 0, false, "a", 0},
		{"0.25, measured 0.6: b", `{"group_spread_open_ratio":0,"group_spread_open_corr":0.25}`, 2048, 0.6, true, "b", 0.3},
		{"0.25, measured exactly 0.25: b", `{"group_spread_open_ratio":0,"group_spread_open_corr":0.25}`, 2048, 0.25, true, "b", 0.3},
		{"0.5, measured 0.3: a keeps the group", `{"group_spread_open_ratio":0,"group_spread_open_corr":0.5}`, 2048, 0.3, true, "a", 0},
		{"0.25, response length not said, measured 0.6: b", `{"group_spread_open_ratio":0,"group_spread_open_corr":0.25}`, 0, 0.6, true, "b", 0.3},
		{"0.1 under min corr 0.25, measured 0.2: min corr closes first", `{"group_spread_open_ratio":0,"group_spread_open_corr":0.1}`, 2048, 0.2, true, "a", 0},
		// group_spread_open_ratio: the band between it and
		// group_spread_min_ratio opens without a measurement.
		{"open ratio 1, ratio 2, nothing measured: b", `{"group_spread_open_ratio":1}`, 2048, 0, false, "b", 0.3},
		{"default open ratio (1), ratio 2, nothing measured: b", `{}`, 2048, 0, false, "b", 0.3},
		{"default open ratio (1), measured 0.6: b", `{}`, 2048, 0.6, true, "b", 0.3},
		{"open ratio 0 (off), ratio 2: a keeps the group", `{"group_spread_open_ratio":0}`, 2048, 0, false, "a", 0},
		{"open ratio 1, ratio exactly 1: a keeps the group", `{"group_spread_open_ratio":1}`, 1024, 0, false, "a", 0},
		{"open ratio 1, response length not said: a keeps the group", `{"group_spread_open_ratio":1}`, 0, 0, false, "a", 0},
		{"open ratio 2.5, ratio 2: a keeps the group", `{"group_spread_open_ratio":2.5}`, 2048, 0, false, "a", 0},
		{"open ratio 1, measured 0.1 under min corr: a keeps the group", `{"group_spread_open_ratio":1}`, 2048, 0.1, true, "a", 0},
	}
	// The open ratio reads only a rollout said to be single-turn.
	for _, turns := range []Turns{TurnsAuto, TurnsMulti} {
		k := build(t, "kvc_aware", `{"group_spread_open_ratio":1}`)
		c := []Candidate{cand("a", 0, 0, full, 8), cand("b", 1, 0, [3]int{}, 8)}
		c[0].Siblings = 3
		req := &Request{Tokens: make([]int32, 1024), SessionsBound: 1 << 20, ResponseTokens: 2048, Turns: turns}
		checkGroupPick(t, k, req, c, "a", 0, 0)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := build(t, "kvc_aware", tc.params)
			c := []Candidate{cand("a", 0, 0, full, 8), cand("b", 1, 0, [3]int{}, 8)}
			c[0].Siblings = 3
			req := &Request{Tokens: make([]int32, 1024), SessionsBound: 1 << 20, ResponseTokens: tc.resp,
				LengthCorr: tc.corr, LengthCorrKnown: tc.known, Turns: TurnsSingle}
			checkGroupPick(t, k, req, c, tc.want, 0, tc.groupLoad)
			// Admission's slot-time spread keeps the ratio gate: only
			// the ratio (closed here) or min ratio 0 opens it.
			if spreads, _ := k.(GroupSpreader).SpreadsGroup(req, 1024); spreads {
				t.Fatalf("SpreadsGroup spreads where only group_spread_open_corr or group_spread_open_ratio is open")
			}
		})
	}
	// group_spread_open_max_servers caps a group only the correlation
	// opened (the lower of it and group_spread_max_servers applies); one
	// the ratio opened keeps group_spread_max_servers alone.
	for _, g := range []struct {
		name      string
		params    string // beside group_spread 0.1 and session_weight 0
		resp      int
		want      string
		outerLoad float64 // c's group_load
	}{
		{"opened by the correlation, default cap 2 on two holders: a", ``, 2048, "a", 0.1},
		{"opened by the correlation, no cap of its own: c", `,"group_spread_open_max_servers":0`, 2048, "c", 0},
		{"opened by the correlation, open cap 3: c", `,"group_spread_open_max_servers":3`, 2048, "c", 0},
		{"opened by the correlation, open cap 3 under max servers 2: a", `,"group_spread_open_max_servers":3,"group_spread_max_servers":2`, 2048, "a", 0.1},
		{"opened by the ratio: the open cap does not apply: c", ``, 8192, "c", 0},
		{"opened by the open ratio band, default cap 2: a", `,"group_spread_open_corr":0,"group_spread_open_ratio":1`, 2048, "a", 0.1},
		{"open_corr and open ratio off: the ratio gate keeps the group on a", `,"group_spread_open_corr":0,"group_spread_open_ratio":0`, 2048, "a", 0},
	} {
		t.Run(g.name, func(t *testing.T) {
			k := build(t, "kvc_aware", `{"group_spread":0.1,"group_spread_open_corr":0.25,"session_weight":0`+g.params+`}`)
			c := []Candidate{cand("a", 0, 0, full, 8), cand("b", 1, 0, full, 8), cand("c", 2, 0, [3]int{}, 8), cand("d", 3, 0, [3]int{}, 8)}
			c[0].Siblings, c[1].Siblings = 3, 3
			req := &Request{Tokens: make([]int32, 1024), SessionsBound: 1 << 20, ResponseTokens: g.resp, LengthCorr: 0.6, LengthCorrKnown: true,
				Turns: TurnsSingle}
			checkGroupPick(t, k, req, c, g.want, 2, g.outerLoad)
		})
	}
	mustRefuse(t, `{"group_spread_open_max_servers":-1}`, `{"group_spread_open_max_servers":2000}`, `{"group_spread_open_max_servers":1.5}`)
	if !ReadsLengthCorr(build(t, "kvc_aware", `{"group_spread_min_corr":0,"task_spread":0,"group_spread_open_corr":0.25}`)) {
		t.Error("group_spread_open_corr alone does not ask the router to measure")
	}
	mustRefuse(t, `{"group_spread_open_corr":-0.1}`, `{"group_spread_open_corr":1.5}`, `{"group_spread_open_corr":"x"}`)
}

// TestKVCAwareGroupSpreadCap: group_spread_max_servers stops a group
// spreading to more servers once it holds that many (a server outside
// counts one sibling more than the group's fullest holder), and leaves an
// agent task's trajectories (task_spread's) alone.
func TestKVCAwareGroupSpreadCap(t *testing.T) {
	full := [3]int{8, 0, 0}
	cases := []struct {
		name      string
		params    string // beside group_spread's gates and session_weight, all 0
		siblings  [4]int // a, b (holding the prompt), c, d
		multi     bool   // sessions return for later turns (an agent task)
		want      string
		outerLoad float64 // c's group_load
	}{
		{"no cap: the group spreads to c", `"group_spread":0.5`, [4]int{3, 3, 0, 0}, false, "c", 0},
		{"cap 2, two holders: a keeps it", `"group_spread":0.5,"group_spread_max_servers":2`, [4]int{3, 3, 0, 0}, false, "a", 0.5},
		{"cap 2, uneven holders: b, the emptier holder", `"group_spread":0.5,"group_spread_max_servers":2`, [4]int{4, 2, 0, 0}, false, "b", 1.5},
		{"cap 3, two holders: c", `"group_spread":0.5,"group_spread_max_servers":3`, [4]int{3, 3, 0, 0}, false, "c", 0},
		{"cap 2, an agent task: task_spread spreads it to c", `"group_spread":0,"task_spread":0.5,"group_spread_max_servers":2`, [4]int{3, 3, 0, 0}, true, "c", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := build(t, "kvc_aware", `{"group_spread_min_ratio":0,"group_spread_min_corr":0,"session_weight":0,`+tc.params+`}`)
			c := []Candidate{cand("a", 0, 0, full, 8), cand("b", 1, 0, full, 8), cand("c", 2, 0, [3]int{}, 8), cand("d", 3, 0, [3]int{}, 8)}
			for i, n := range tc.siblings {
				c[i].Siblings = n
			}
			req := &Request{Tokens: make([]int32, 128), SessionsBound: 1 << 20}
			if tc.multi {
				req = &Request{Tokens: make([]int32, 128), SessionsBound: 100, LaterTurns: 1000, Turns: TurnsMulti}
			}
			checkGroupPick(t, k, req, c, tc.want, 2, tc.outerLoad)
		})
	}
	mustRefuse(t, `{"group_spread_max_servers":-1}`, `{"group_spread_max_servers":2000}`, `{"group_spread_max_servers":1.5}`)
}

// TestKVCAwareTaskSpread: with task_spread, an agent task's trajectories
// (multi-turn siblings) already placed on a server beyond the fewest add
// task_spread x multi_turn each to its load, so a task spreads over
// servers; one-request siblings (a GRPO history) get none of it; a fresh
// router presumes multi-turn sessions only when told the rollout is
// multi-turn (Turns), else it keeps a group with its prompt until sessions
// return; task_spread 0 keeps a task whole.
func TestKVCAwareTaskSpread(t *testing.T) {
	full := [3]int{8, 0, 0}
	multi := Request{SessionsBound: 100, LaterTurns: 1000} // every session came back
	grpo := Request{SessionsBound: 1 << 20}                // a history of one-request sessions
	fresh := Request{}                                     // nothing seen yet, not told
	told := Request{Turns: TurnsMulti}                     // nothing seen yet, told multi-turn
	toldGRPO := Request{SessionsBound: 1 << 20, Turns: TurnsMulti}
	single := Request{SessionsBound: 100, LaterTurns: 1000, Turns: TurnsSingle}
	ts := `{"task_spread":0.1}`
	cases := []struct {
		name      string
		params    string
		req       Request
		aSiblings int
		want      string
		groupLoad float64
	}{
		{"0.1, multi-turn, no sibling yet: cache wins", ts, multi, 0, "a", 0},
		{"0.1, multi-turn, one more sibling: b", ts, multi, 1, "b", 0.1},
		{"0.1, fresh router not told: a keeps the group", ts, fresh, 1, "a", 0},
		{"0.1, fresh router told multi-turn, one more sibling: b", ts, told, 1, "b", 0.1},
		{"0.1, told multi-turn but one-request history: a keeps the group", ts, toldGRPO, 3, "a", 0},
		{"0.1, told single-turn but sessions return: b", ts, single, 1, "b", 0.1},
		{"0.1, one-request history: a keeps the group", ts, grpo, 3, "a", 0},
		{"default (0.1), multi-turn, one more sibling: b", `{}`, multi, 1, "b", 0.1},
		{"default (0.1), fresh router not told: a keeps the group", `{}`, fresh, 3, "a", 0},
		{"task_spread 0: a keeps the task", `{"task_spread":0}`, multi, 3, "a", 0},
		{"task_spread 0 told multi-turn: a keeps the task", `{"task_spread":0}`, told, 3, "a", 0},
		{"task_spread 1, two more siblings", `{"task_spread":1}`, multi, 2, "b", 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := build(t, "kvc_aware", tc.params)
			c := []Candidate{cand("a", 0, 0, full, 8), cand("b", 1, 0, [3]int{}, 8)}
			c[0].Siblings = tc.aSiblings
			req := tc.req
			req.Tokens = make([]int32, 1024)
			out := make([]float64, 2)
			k.Score(&req, c, out)
			if got := c[Pick(c, out)].ID; got != tc.want {
				t.Fatalf("picked %s (scores %v), want %s", got, out, tc.want)
			}
			for _, term := range k.(Explainer).Explain(&req, 1024, c)[0] {
				if term.Name == "group_load" && math.Abs(term.Value-tc.groupLoad) > 1e-4 {
					t.Fatalf("a's group_load %v, want %v", term.Value, tc.groupLoad)
				}
			}
		})
	}
	if !build(t, "kvc_aware", ts).(SiblingReader).ReadsSiblings() {
		t.Fatal("task_spread 0.1 does not read siblings: the term would be a no-op")
	}
	if !build(t, "kvc_aware", `{}`).(SiblingReader).ReadsSiblings() {
		t.Fatal("kvc_aware at its defaults (task_spread 0.1) does not read siblings")
	}
	if build(t, "kvc_aware", `{"group_spread":0,"task_spread":0}`).(SiblingReader).ReadsSiblings() {
		t.Fatal("group_spread and task_spread 0 read siblings")
	}
	for _, bad := range []string{`{"task_spread":-0.1}`, `{"task_spread":10.5}`, `{"task_spread":"x"}`,
		`{"group_spread_min_ratio":-1}`, `{"group_spread_min_ratio":1001}`} {
		if _, err := Build("kvc_aware", json.RawMessage(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

// TestKVCAwareWorkWeight: work_weight adds the output predicted for a
// server's in-flight requests to token_load's numerator, so the server
// given a long request's predicted work ranks as loaded; at 0 the
// prediction is not read at all.
func TestKVCAwareWorkWeight(t *testing.T) {
	c := []Candidate{cand("a", 0, 4, [3]int{}, 8), cand("b", 1, 5, [3]int{}, 8)}
	// Equal prompt tokens in flight; a runs one request predicted to
	// answer 96k tokens, b several predicted short.
	c[0].InflightTokens, c[1].InflightTokens = 48_000, 48_000
	c[0].PredictedTokens, c[1].PredictedTokens = 96_000, 8_000
	for _, tc := range []struct {
		params   string
		reads    bool
		wantLoad [2]float64
		wantPick string
	}{
		{`{"work_weight":0}`, false, [2]float64{0.1, 0.1}, "a"}, // a tie: the first added wins
		{`{"work_weight":1}`, true, [2]float64{0.3, 56.0 / 480}, "b"},
		{`{"work_weight":0.5}`, true, [2]float64{0.2, 52.0 / 480}, "b"},
	} {
		k := build(t, "kvc_aware", tc.params).(*KVCAware)
		if got := ReadsWork(k); got != tc.reads {
			t.Fatalf("%s: ReadsWork %v, want %v", tc.params, got, tc.reads)
		}
		for i := range c {
			if got := k.EffectiveLoad(&c[i]); math.Abs(got-tc.wantLoad[i]) > 1e-9 {
				t.Fatalf("%s: %s's load %v, want %v", tc.params, c[i].ID, got, tc.wantLoad[i])
			}
		}
		if got := peerPick(t, k, c); got != tc.wantPick {
			t.Fatalf("%s: picked %s, want %s", tc.params, got, tc.wantPick)
		}
	}
	w := &Weighted{Parts: []Strategy{LeastInflight{}, build(t, "kvc_aware", `{"work_weight":1}`)}, Weights: []float64{1, 1}}
	if !ReadsWork(w) {
		t.Fatal("a weighted combination with work_weight does not read the prediction")
	}
}

// SpreadsGroup is admission's reading of group_spread: its gates, and
// the servers a group may spread over: group_spread_max_servers once a
// correlation is measured (where group_spread_min_corr is set), at most
// group_spread_open_max_servers before (0 there: whole until measured);
// only while one-request siblings outweigh multi-turn ones.
func TestKVCAwareSpreadsGroup(t *testing.T) {
	grpo := func(corr float64, known bool) *Request { // 200 sessions, no later turn
		return &Request{SessionsBound: 200, ResponseTokens: 8192, LengthCorr: corr, LengthCorrKnown: known}
	}
	for _, tc := range []struct {
		name    string
		params  string
		req     *Request
		prompt  int
		want    bool
		servers int // the cap returned with want true (0: none)
	}{
		{"measured alike", `{}`, grpo(0.6, true), 1000, true, 0},
		{"measured alike, capped at 3 servers", `{"group_spread_max_servers":3}`, grpo(0.6, true), 1000, true, 3},
		{"measured unalike", `{}`, grpo(0.1, true), 1000, false, 0},
		{"not measured: split over group_spread_open_max_servers", `{}`, grpo(0, false), 1000, true, 2},
		{"not measured, open cap 3", `{"group_spread_open_max_servers":3}`, grpo(0, false), 1000, true, 3},
		{"not measured, group_spread_max_servers lower", `{"group_spread_open_max_servers":3,"group_spread_max_servers":1}`, grpo(0, false), 1000, true, 1},
		{"not measured, open cap 0: whole until measured", `{"group_spread_open_max_servers":0}`, grpo(0, false), 1000, false, 0},
		{"not measured, responses at 4 x the prompt", `{}`, grpo(0, false), 2048, false, 0},
		{"not measured, group_spread_min_corr 0", `{"group_spread_min_corr":0}`, grpo(0, false), 1000, true, 0},
		{"responses at 4 x the prompt", `{}`, grpo(0.6, true), 2048, false, 0},
		{"group_spread 0", `{"group_spread":0}`, grpo(0.6, true), 1000, false, 0},
		{"group_spread 0, not measured", `{"group_spread":0}`, grpo(0, false), 1000, false, 0},
		{"a fresh router presumes multi-turn", `{}`, &Request{ResponseTokens: 8192, LengthCorr: 0.6, LengthCorrKnown: true}, 1000, false, 0},
		{"multi-turn sessions (agent tasks)", `{}`, &Request{SessionsBound: 200, LaterTurns: 800, ResponseTokens: 8192,
			LengthCorr: 0.6, LengthCorrKnown: true}, 1000, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kv := DefaultKVCAware()
			if err := json.Unmarshal([]byte(tc.params), &kv); err != nil {
				t.Fatal(err)
			}
			k := &kv
			got, servers := SpreadsGroup(k, tc.req, tc.prompt)
			if got != tc.want || (got && servers != tc.servers) {
				t.Fatalf("SpreadsGroup = %v, %d; want %v, %d", got, servers, tc.want, tc.servers)
			}
			w := &Weighted{Parts: []Strategy{&LeastInflight{}, k}, Weights: []float64{0.5, 0.5}}
			if got, _ := SpreadsGroup(w, tc.req, tc.prompt); got != tc.want {
				t.Fatalf("weighted: SpreadsGroup = %v, want %v", got, tc.want)
			}
		})
	}
	if ok, _ := SpreadsGroup(&LeastInflight{}, grpo(0.6, true), 1000); ok {
		t.Fatal("least_inflight spreads a group: it has no group_spread")
	}
}
