package router

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/blockhash"
)

// warmGRPO gives r a history of n one-request sessions (a GRPO step's
// samples, each released): the group spread applies to one-request
// siblings, and a fresh router presumes multi-turn sessions. Their prompts
// are 1,024 tokens, the groups' below, so the router's mean prompt (which
// group_spread_min_ratio reads) is theirs.
func warmGRPO(t *testing.T, r *Router, n int) {
	t.Helper()
	warmPrompts(t, r, n, 1024)
}

// warmPrompts is warmGRPO with prompts of the given length.
func warmPrompts(t *testing.T, r *Router, n, tokens int) {
	t.Helper()
	for i := 0; i < n; i++ {
		r.Release(acq(t, r, fmt.Sprint("warm", i), prompt(tokens, int32(10_000_000+10_000*i))...))
	}
}

// TestGroupSpread: after a history of one-request sessions, a GRPO group's
// samples (one prompt, consecutive requests) spread evenly over the
// servers with group_spread 0.1; without it the group stays on the
// server that holds its prompt; a weight sync (ResetCache) forgets the counts.
func TestGroupSpread(t *testing.T) {
	cases := []struct {
		name   string
		params string
		warm   int
		want   map[string]int
		resp   int // Config.ResponseTokens
	}{
		{"group_spread 0.1: 16 samples over 4 servers", `{"group_spread":0.1,"group_spread_min_ratio":0}`, 400, map[string]int{"s0": 4, "s1": 4, "s2": 4, "s3": 4}, 0},
		{"task_spread 0: the group stays whole", `{"task_spread":0}`, 400, map[string]int{"s0": 16}, 0},
		{"default, response length not said: the group stays whole", `{}`, 400, map[string]int{"s0": 16}, 0},
		// task_spread's multi-turn prior fades as one-request sessions
		// accumulate: after a GRPO step's worth of them it no longer splits
		// a group.
		{"task_spread 0.1 after 4,000 one-request sessions: the group stays whole", `{"task_spread":0.1}`, 4000, map[string]int{"s0": 16}, 0},
		{"default on a fresh router: the group stays whole", `{}`, 0, map[string]int{"s0": 16}, 0},
		// group_spread's gate (default 0.1, min ratio 4): every prompt is
		// 1,024 tokens, so is the router's mean, and responses of more than
		// 4,096 tokens spread the group, others (or an unsaid length) keep
		// it whole.
		{"default, response_tokens 8192: the group spreads", `{}`, 400, map[string]int{"s0": 4, "s1": 4, "s2": 4, "s3": 4}, 8192},
		{"default, response_tokens 4097: the group spreads", `{}`, 400, map[string]int{"s0": 4, "s1": 4, "s2": 4, "s3": 4}, 4097},
		{"default, response_tokens 4096 (ratio exactly 4): the group stays whole", `{}`, 400, map[string]int{"s0": 16}, 4096},
		{"min ratio 16, response_tokens 8192: the group stays whole", `{"group_spread_min_ratio":16}`, 400, map[string]int{"s0": 16}, 8192},
		{"group_spread 0, response_tokens 8192: the group stays whole", `{"group_spread":0}`, 400, map[string]int{"s0": 16}, 8192},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Mode: ModeKVCAware, ResponseTokens: tc.resp, Strategies: []StrategySpec{{Name: "kvc_aware", Weight: 1, Params: []byte(tc.params)}}}
			r := mustNew(t, cfg, "s0", "s1", "s2", "s3")
			warmGRPO(t, r, tc.warm)
			p := prompt(1024, 7)
			got := map[string]int{}
			for i := 0; i < 16; i++ {
				got[acq(t, r, fmt.Sprint("g0-", i), p...)]++
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("samples per server %v, want %v", got, tc.want)
			}
		})
	}
	t.Run("a weight sync forgets the counts", func(t *testing.T) {
		for _, reset := range []bool{false, true} {
			// session_weight 0: the five sticky bindings must not decide.
			cfg := Config{Mode: ModeKVCAware, Strategies: []StrategySpec{{Name: "kvc_aware", Weight: 1, Params: []byte(`{"session_weight":0,"group_spread":0.1,"group_spread_min_ratio":0}`)}}}
			r := mustNew(t, cfg, "s0", "s1", "s2", "s3")
			warmGRPO(t, r, 400)
			p := prompt(1024, 7)
			var placed []string
			for i := 0; i < 5; i++ { // s0 gets two, the others one
				placed = append(placed, acq(t, r, fmt.Sprint("a", i), p...))
			}
			for _, s := range placed {
				r.Release(s)
			}
			if reset {
				r.ResetCache()
			}
			s := acq(t, r, "next", p...)
			// Kept counts send the sixth away from s0 (one more there);
			// after the reset every server is equal and s0 comes first.
			if want := map[bool]string{false: "s1", true: "s0"}[reset]; s != want {
				t.Fatalf("reset %v: sixth sample on %s, want %s", reset, s, want)
			}
		}
	})
	t.Run("admitted requests count too", func(t *testing.T) {
		cfg := Config{Mode: ModeKVCAware, Admission: AdmissionSpec{Enabled: true, MaxInflight: 1},
			Strategies: []StrategySpec{{Name: "kvc_aware", Weight: 1, Params: []byte(`{"group_spread":0.1,"group_spread_min_ratio":0}`)}}}
		r := mustNew(t, cfg, "s0", "s1")
		p := prompt(1024, 7)
		acq(t, r, "a0", p...) // s0
		acq(t, r, "a1", p...) // s1
		if _, queued, err := r.Submit(Request{ID: "a2", Tokens: p, Pin: -1}, 1); err != nil || !queued {
			t.Fatalf("queued %v err %v", queued, err)
		}
		out, _ := r.ReleaseAdmit("s1", nil)
		if len(out) != 1 || out[0].Decision.Server != "s1" {
			t.Fatalf("admitted %+v", out)
		}
		r.mu.Lock()
		keys := r.memo.AppendKeys(nil, p, 16, blockhash.Namespace(r.cfg.Model, ""))
		g, _ := r.groups.Peek(keys[blockhash.HittableBlocks(len(p), 16)-1])
		r.mu.Unlock()
		if fmt.Sprint(g.counts()) != "map[s0:1 s1:2]" {
			t.Fatalf("group counts %v, want s0 1, s1 2", g.counts())
		}
	})
}

// TestGroupsBounded: the prompts remembered are bounded.
func TestGroupsBounded(t *testing.T) {
	r := mustNew(t, Config{Mode: ModeKVCAware, Strategies: []StrategySpec{{Name: "kvc_aware", Weight: 1, Params: []byte(`{"group_spread":0.1,"group_spread_min_ratio":0}`)}}}, "s0")
	s := r.byID["s0"]
	for k := uint64(1); k <= maxPromptGroups+10; k++ {
		r.placed(k, s)
	}
	if n := r.groups.Len(); n != maxPromptGroups {
		t.Fatalf("%d groups remembered, want the bound %d", n, maxPromptGroups)
	}
	if _, ok := r.groups.Peek(1); ok {
		t.Fatal("the oldest group was not forgotten")
	}
}

// TestGroupsKeptOnlyWhenRead: the placement counts (a lookup and an update
// on every decision) exist only when a strategy part reads siblings.
func TestGroupsKeptOnlyWhenRead(t *testing.T) {
	spread := StrategySpec{Name: "kvc_aware", Weight: 1, Params: []byte(`{"group_spread":0.1,"group_spread_min_ratio":0}`)}
	off := StrategySpec{Name: "kvc_aware", Weight: 1, Params: []byte(`{"group_spread":0,"task_spread":0}`)}
	defaults := StrategySpec{Name: "kvc_aware", Weight: 1, Params: []byte(`{}`)}
	task := StrategySpec{Name: "kvc_aware", Weight: 1, Params: []byte(`{"task_spread":0.1}`)}
	least := StrategySpec{Name: "least_inflight", Weight: 1}
	cases := []struct {
		name string
		cfg  Config
		want bool
	}{
		{"kvc_aware at its defaults (task_spread 0.1)", Config{Mode: ModeKVCAware}, true},
		{"kvc_aware's defaults spelled out", Config{Mode: ModeKVCAware, Strategies: []StrategySpec{defaults}}, true},
		{"task_spread 0.1", Config{Mode: ModeKVCAware, Strategies: []StrategySpec{task}}, true},
		{"group_spread and task_spread 0", Config{Mode: ModeKVCAware, Strategies: []StrategySpec{off}}, false},
		{"group_spread 0.1", Config{Mode: ModeKVCAware, Strategies: []StrategySpec{spread}}, true},
		{"one of two parts reads them", Config{Mode: ModeKVCAware, Strategies: []StrategySpec{least, spread}}, true},
		{"default mode", Config{Mode: ModeDefault}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := mustNew(t, tc.cfg, "s0", "s1")
			acq(t, r, "a", prompt(1024, 7)...)
			if got := r.groups != nil; got != tc.want {
				t.Fatalf("groups kept %v, want %v", got, tc.want)
			}
			if tc.want && r.groups.Len() != 1 {
				t.Fatalf("%d groups after one placement, want 1", r.groups.Len())
			}
		})
	}
}

// TestGroupSpreadGateClosedChangesNothing: where group_spread's gates are
// closed (responses under group_spread_min_ratio x the prompt and not
// above group_spread_open_ratio x it, a rollout not said to be
// single-turn, or no response length said), the defaults decide exactly
// as group_spread 0 does, request by request, on a GRPO-like stream of
// groups with releases in between.
func TestGroupSpreadGateClosedChangesNothing(t *testing.T) {
	for _, tc := range []struct {
		turns string
		resp  int
	}{
		{TurnsSingle, 0},
		// Prompts of 512-2,047 tokens, as on the arena's GRPO steps: 512
		// is under every one of them, so under the mean prompt (the open
		// ratio 1 reads it), and 2,048 is at most 4x any of them (the ratio
		// gate stays closed) but opens the open ratio's band only where the
		// rollout is single-turn.
		{TurnsSingle, 512},
		{TurnsAuto, 2048},
	} {
		t.Run(fmt.Sprint("turns ", tc.turns, " response_tokens ", tc.resp), func(t *testing.T) {
			gated := mustNew(t, Config{Mode: ModeKVCAware, Turns: tc.turns, ResponseTokens: tc.resp}, "s0", "s1", "s2", "s3")
			off := mustNew(t, Config{Mode: ModeKVCAware, Turns: tc.turns, ResponseTokens: tc.resp,
				Strategies: []StrategySpec{{Name: "kvc_aware", Weight: 1, Params: []byte(`{"group_spread":0}`)}}},
				"s0", "s1", "s2", "s3")
			var held []string
			for g := 0; g < 60; g++ {
				p := prompt(512+(g*97)%1536, int32(1000*g))
				for i := 0; i < 8; i++ {
					id := fmt.Sprintf("g%d-%d", g, i)
					a, b := acq(t, gated, id, p...), acq(t, off, id, p...)
					if a != b {
						t.Fatalf("%s: gated defaults chose %s, group_spread 0 chose %s", id, a, b)
					}
					held = append(held, a)
				}
				// Release a few, oldest first, so loads move.
				for len(held) > 24 {
					gated.Release(held[0])
					off.Release(held[0])
					held = held[1:]
				}
			}
		})
	}
}

// TestGroupSpreadClosesOnMeasuredCorr: with lengths off, the defaults
// still learn, for group_spread_min_corr alone, the within-prompt length
// correlation of the releases that name their request; a step whose
// samples' lengths are independent of their prompt closes the group spread
// for the next step (the group stays whole), one whose lengths follow the
// prompt keeps it open (the group spreads). The first step, with nothing
// measured, spreads on the ratio gates alone. Where group_spread_min_ratio's
// gate is closed (responses of 2,048 tokens, 2x the prompt), the defaults'
// group_spread_open_ratio (1) splits the first step's groups in two and the
// measurement keeps or closes that; with it off, the first step keeps its
// groups whole and a measured correlation opens the gate for the next
// where group_spread_open_corr is set, over at most
// group_spread_open_max_servers.
func TestGroupSpreadClosesOnMeasuredCorr(t *testing.T) {
	independent := func(rng *rand.Rand, _ int) int { return int(200 * math.Exp(rng.NormFloat64())) }
	byPrompt := func(rng *rand.Rand, g int) int { return int(float64(100*(1+g*g)) * math.Exp(0.1*rng.NormFloat64())) }
	low := func(c float64) bool { return c < 0.25 }
	high := func(c float64) bool { return c > 0.9 }
	cases := []struct {
		name     string
		resp     int                             // response_tokens: 8,192 opens the ratio gate, 2,048 does not
		params   string                          // kvc_aware's
		first    bool                            // step 1, nothing measured: the ratio gates spread the first group
		length   func(rng *rand.Rand, g int) int // a sample's output tokens
		wantCorr func(c float64) bool
		want     []int // step 2: samples on each server that has any, sorted
	}{
		{"independent lengths: the group stays whole", 8192, `{}`, true, independent, low, []int{16}},
		{"lengths set by the prompt: the group spreads", 8192, `{}`, true, byPrompt, high, []int{4, 4, 4, 4}},
		{"ratio gate closed, open_corr 0.25, lengths set by the prompt: the measurement opens it over two servers", 2048, `{"group_spread_open_corr":0.25,"group_spread_open_ratio":0}`, false, byPrompt, high, []int{8, 8}},
		{"ratio gate closed, open_corr 0.25, no open cap: over all four", 2048, `{"group_spread_open_corr":0.25,"group_spread_open_max_servers":0,"group_spread_open_ratio":0}`, false, byPrompt, high, []int{4, 4, 4, 4}},
		{"ratio gate closed, open_corr 0.25, independent lengths: the group stays whole", 2048, `{"group_spread_open_corr":0.25,"group_spread_open_ratio":0}`, false, independent, low, []int{16}},
		{"ratio gate closed, open_corr and open ratio off: the group stays whole", 2048, `{"group_spread_open_ratio":0}`, false, byPrompt, high, []int{16}},
		// group_spread_open_ratio 1 (the default): the band opens from the first step, over two servers.
		{"open ratio band (the defaults), lengths set by the prompt: over two servers", 2048, `{}`, true, byPrompt, high, []int{8, 8}},
		{"open ratio band (the defaults), independent lengths: the measurement closes it", 2048, `{}`, true, independent, low, []int{16}},
		{"open ratio 2.5, ratio 2: the group stays whole", 2048, `{"group_spread_open_ratio":2.5}`, false, byPrompt, high, []int{16}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := mustNew(t, Config{Mode: ModeKVCAware, Turns: TurnsSingle, ResponseTokens: tc.resp,
				Strategies: []StrategySpec{{Name: "kvc_aware", Weight: 1, Params: []byte(tc.params)}}}, "s0", "s1", "s2", "s3")
			if l := r.Status().Lengths; l == nil || !l.CorrOnly {
				t.Fatalf("lengths off with the default strategy: status lengths %+v, want a correlation-only learner", l)
			}
			// Step 1: nothing measured, so the ratio gate spreads a group.
			rng := rand.New(rand.NewPCG(1, 2))
			first := map[string]int{}
			for g := 0; g < 24; g++ {
				p := prompt(1024, int32(1_000_000*(g+1)))
				for i := 0; i < 8; i++ {
					id := fmt.Sprintf("s1-g%d-%d", g, i)
					s := acq(t, r, id, p...)
					if g == 0 {
						first[s]++
					}
					if _, ok := r.ReleaseDone(s, id, tc.length(rng, g), nil); !ok {
						t.Fatalf("release of %s on %s refused", id, s)
					}
				}
			}
			if (len(first) >= 2) != tc.first {
				t.Fatalf("first step's first group %v: nothing measured yet, the ratio gates (open %v) alone decide", first, tc.first)
			}
			r.ResetCache() // the weight sync ends step 1
			l := r.Status().Lengths
			if !l.LengthCorrKnown || !tc.wantCorr(l.LengthCorr) {
				t.Fatalf("measured length_corr %v (known %v)", l.LengthCorr, l.LengthCorrKnown)
			}
			if l.LongestPicks != 0 || l.PredictedTokens != nil {
				t.Fatalf("a correlation-only learner ordered or charged: %+v", l)
			}
			// A release without a count teaches it nothing (no durations).
			r.now = func() time.Time { return time.Unix(0, 0) }
			id := acq(t, r, "no-count", prompt(64, 3)...)
			r.now = func() time.Time { return time.Unix(10, 0) }
			r.ReleaseDone(id, "no-count", 0, nil)
			if l := r.Status().Lengths; l.ObservedTimed != 0 {
				t.Fatalf("a correlation-only learner learnt a duration: %+v", l)
			}
			// Step 2: a fresh prompt's group, held in flight.
			p := prompt(1024, 7)
			per := map[string]int{}
			for i := 0; i < 16; i++ {
				per[acq(t, r, fmt.Sprint("s2-", i), p...)]++
			}
			got := slices.Sorted(maps.Values(per))
			if !slices.Equal(got, tc.want) {
				t.Fatalf("samples per server %v, want counts %v", per, tc.want)
			}
		})
	}
	// lengths on: the same learner, not a correlation-only one.
	r := mustNew(t, Config{Mode: ModeKVCAware, Lengths: LengthsSpec{Enabled: true}}, "s0")
	if l := r.Status().Lengths; l == nil || l.CorrOnly {
		t.Fatalf("lengths.enabled: status lengths %+v, want the full learner", l)
	}
	// Nothing to gate: no learner at all.
	r = mustNew(t, Config{Mode: ModeKVCAware, Strategies: []StrategySpec{{Name: "kvc_aware", Weight: 1, Params: []byte(`{"group_spread_min_corr":0,"group_spread_open_corr":0,"task_spread_min_corr":0}`)}}}, "s0")
	if l := r.Status().Lengths; l != nil {
		t.Fatalf("group_spread_min_corr, group_spread_open_corr and task_spread_min_corr 0: status lengths %+v, want none", l)
	}
}

// TestTaskSpreadClosesOnMeasuredCorr: end to end through the router at its
// defaults, a step of agent trajectories (request ids kept over three
// turns, each turn released with its output tokens) measures how alike a
// task's trajectories are in total output; where they are no more alike
// than any two, the next step's task keeps its trajectories on the
// server holding its prompt (no group_load term), and where a task sets
// them, task_spread still weighs the siblings. The first turn's length
// alone would not tell: in the second case it is independent of the task.
func TestTaskSpreadClosesOnMeasuredCorr(t *testing.T) {
	cases := []struct {
		name     string
		turn     func(rng *rand.Rand, task, turn int) int // a turn's output tokens
		wantCorr func(c float64) bool
		open     bool
	}{
		{"independent trajectories: the task keeps its server",
			func(rng *rand.Rand, _, _ int) int { return int(200 * math.Exp(rng.NormFloat64())) },
			func(c float64) bool { return c < 0.25 }, false},
		{"the task sets later turns: the task spreads",
			func(rng *rand.Rand, task, turn int) int {
				if turn == 0 {
					return int(200 * math.Exp(rng.NormFloat64()))
				}
				return int(float64(100*(1+task*task)) * math.Exp(0.1*rng.NormFloat64()))
			},
			func(c float64) bool { return c > 0.8 }, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := mustNew(t, Config{Mode: ModeKVCAware, Turns: TurnsMulti}, "s0", "s1", "s2", "s3")
			rng := rand.New(rand.NewPCG(3, 4))
			for task := 0; task < 12; task++ {
				for j := 0; j < 4; j++ {
					id := fmt.Sprintf("s1-t%d-%d", task, j)
					p := prompt(1024, int32(1_000_000*(task+1)))
					for turn := 0; turn < 3; turn++ {
						s := acq(t, r, id, p...)
						out := tc.turn(rng, task, turn)
						if _, ok := r.ReleaseDone(s, id, out, nil); !ok {
							t.Fatalf("release of %s on %s refused", id, s)
						}
						p = append(p, prompt(64, int32(5_000_000+100_000*(4*task+j)+1000*turn))...)
					}
				}
			}
			r.ResetCache() // the weight sync ends step 1
			l := r.Status().Lengths
			if l == nil || !l.CorrOnly || !l.TaskCorrKnown || !tc.wantCorr(l.TaskCorr) {
				t.Fatalf("status lengths %+v: want a correlation-only learner with a measured task_corr", l)
			}
			// Step 2: a fresh task's first turns, held in flight.
			p := prompt(1024, 9_000_000)
			acq(t, r, "s2-0", p...)
			acq(t, r, "s2-1", p...)
			e := r.LastDecision()
			load := 0.0
			for _, c := range e.Candidates {
				for _, term := range c.Terms {
					if term.Name == "group_load" {
						load += term.Value
					}
				}
			}
			if (load > 0) != tc.open {
				t.Fatalf("task_corr %.2f: group_load terms sum to %v, want task_spread open=%v (%+v)", l.TaskCorr, load, tc.open, e.Candidates)
			}
		})
	}
}

// TestGroupSpreadGateReadsTheMeanPrompt: group_spread_min_ratio compares
// response_tokens with the rollout's mean prompt, not the request's own,
// so one rollout's groups get one answer. A long-prompt group among short
// ones spreads (kept whole where lengths are alike, it straggles: held-out
// grpo at rho 0.8), and a short-prompt group among long ones stays whole.
// Both fail when the gate reads the request's own prompt.
func TestGroupSpreadGateReadsTheMeanPrompt(t *testing.T) {
	cases := []struct {
		name          string
		warm, group   int // prompt tokens: the earlier requests', the group's
		wantWhole     bool
		wantMeanAbove int
	}{
		// 8,192-token responses: the gate opens below a 2,048-token mean.
		{"a 4,096-token prompt among 1,024-token ones spreads", 1024, 4096, false, 1024},
		{"a 1,024-token prompt among 4,096-token ones stays whole", 4096, 1024, true, 3900},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// group_spread_open_ratio off: its band (responses above the
			// mean prompt) would split the whole case's group in two.
			r := mustNew(t, Config{Mode: ModeKVCAware, Turns: TurnsSingle, ResponseTokens: 8192,
				Strategies: []StrategySpec{{Name: "kvc_aware", Weight: 1, Params: []byte(`{"group_spread_open_ratio":0}`)}}},
				"s0", "s1", "s2", "s3")
			warmPrompts(t, r, 400, tc.warm)
			p := prompt(tc.group, 7)
			got := map[string]int{}
			for i := 0; i < 16; i++ {
				got[acq(t, r, fmt.Sprint("g0-", i), p...)]++
			}
			if whole := len(got) == 1; whole != tc.wantWhole {
				t.Fatalf("samples per server %v, want whole %v", got, tc.wantWhole)
			}
			if !tc.wantWhole && slices.Max(slices.Collect(maps.Values(got))) > 6 {
				t.Fatalf("samples per server %v: the group spread unevenly", got)
			}
			if m := r.Status().PromptTokensMean; m <= tc.wantMeanAbove || m > max(tc.warm, tc.group) {
				t.Fatalf("status prompt_tokens_mean %d, want in (%d, %d]", m, tc.wantMeanAbove, max(tc.warm, tc.group))
			}
		})
	}
}

// TestPromptMeanCountsEachRequestOnce: the mean counts a held request when
// it arrives and not again when admission places it, and weighs the latest
// promptMeanWindow prompts once more have been seen.
func TestPromptMeanCountsEachRequestOnce(t *testing.T) {
	r := mustNew(t, admitConfig(1), "s0")
	if m := r.Status().PromptTokensMean; m != 0 {
		t.Fatalf("fresh router's prompt_tokens_mean %d, want 0", m)
	}
	submit(t, r, "a", 1, prompt(1000, 1))
	if _, q := submit(t, r, "b", 2, prompt(3000, 100_000)); !q {
		t.Fatal("b not held behind a full server")
	}
	if m := r.Status().PromptTokensMean; m != 2000 {
		t.Fatalf("mean %d with a held request, want 2000", m)
	}
	if got, _ := r.ReleaseAdmit("s0", nil); len(got) != 1 {
		t.Fatalf("admitted %+v, want b", got)
	}
	if m := r.Status().PromptTokensMean; m != 2000 {
		t.Fatalf("mean %d after b was admitted, want 2000 (counted once)", m)
	}
	// A rollout whose prompts change: the mean follows the latest ones.
	r = mustNew(t, Config{Mode: ModeKVCAware}, "s0")
	for i := 0; i < 3*promptMeanWindow; i++ {
		n := 100
		if i >= promptMeanWindow {
			n = 2000
		}
		r.Release(acq(t, r, fmt.Sprint("x", i), prompt(n, int32(i%8))...))
	}
	if m := r.Status().PromptTokensMean; m < 1700 || m > 2000 {
		t.Fatalf("mean %d after %d prompts of 2,000 tokens, want near 2,000", m, 2*promptMeanWindow)
	}
}
