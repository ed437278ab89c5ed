package bench

import (
	"testing"

	"github.com/kvc-router/kvc-router/testbed/sim"
)

// One request alone on one engine: the engine model's exact time is one
// prefill step plus O-1 decode steps; the bound may only miss the
// prefill it assumes cached (all but one token).
func TestLowerBoundSingleRequestHand(t *testing.T) {
	cfg := sim.Config{NumGPUBlocks: 4000}.WithDefaults()
	const p, o = 64, 100
	rec := Record{PromptLen: p, PromptBlocks: p / 16, Keys: make([]uint64, p/16), OutputLen: o}
	for i := range rec.Keys {
		rec.Keys[i] = uint64(i + 1)
	}
	exact := cfg.StepBase + cfg.PrefillPerToken*p
	for j := 1; j < o; j++ {
		exact += cfg.StepBase + cfg.DecodePerContextToken*float64(p+j)
	}
	got, steps := LowerBound([]Record{rec}, cfg, 1)
	if len(steps) != 1 || got != steps[0] {
		t.Fatalf("total %v, per phase %v", got, steps)
	}
	if !(got <= exact && got >= exact-cfg.PrefillPerToken*p) {
		t.Fatalf("bound %.6f s, exact %.6f s: want exact - prefill <= bound <= exact", got, exact)
	}
}

// Two identical-prefix requests prefill their shared blocks once; a chain
// adds its turns' standalone times and tool latencies.
func TestLowerBoundSharingAndChains(t *testing.T) {
	// No step overhead, no decode cost: only prefill and tool latency.
	cfg := sim.Config{NumGPUBlocks: 4000, StepBase: -1, DecodePerContextToken: -1}
	b := cfg.WithDefaults().PrefillPerToken
	shared := Record{PromptLen: 1600, PromptBlocks: 100, Keys: make([]uint64, 100), OutputLen: 1}
	for i := range shared.Keys {
		shared.Keys[i] = uint64(i + 1)
	}
	work, _ := LowerBound([]Record{shared, shared}, cfg, 1)
	// 100 blocks once (1,600 tokens) + one recomputed token each.
	if want := b * (1600 + 2); abs(work-want) > 1e-12 {
		t.Fatalf("shared prefix: %.9f s, want %.9f", work, want)
	}
	turn := Record{PromptLen: 16, PromptBlocks: 1, Keys: []uint64{7}, OutputLen: 1, Chain: "t", Think: 2}
	chain, _ := LowerBound([]Record{turn, turn, turn}, cfg, 8)
	if want := 3 * (2 + b); abs(chain-want) > 1e-9 {
		t.Fatalf("chain: %.9f s, want %.9f (three turns, 2 s of tool latency each)", chain, want)
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// Property: no policy's makespan beats the bound, on GRPO and agent
// workloads of several sizes, with and without admission.
func TestLowerBoundBelowEveryPolicy(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		g := smallGRPO()
		g.Seed, g.N = seed, 8
		a := DefaultAgent()
		a.Seed, a.Steps, a.Tasks, a.Group, a.MinTurns, a.MaxTurns = seed, 1, 3, 3, 2, 4
		a.Task = LogNormal{Median: 300, Sigma: 0.3, Min: 64, Max: 600}
		a.Response, a.Tool = LogNormal{Median: 30, Max: 80}, LogNormal{Median: 50, Max: 100}
		for _, wl := range []func() Workload{func() Workload { return NewGRPO(g) }, func() Workload { return NewAgent(a) }} {
			s := &Suite{NewWorkload: wl, Policies: []string{"verl_default", "round_robin", "kvc_aware", "kvc_aware+admit"},
				Opts: smallOpts(), Parallel: 2}
			rep, _, err := s.Run()
			if err != nil {
				t.Fatal(err)
			}
			lb := rep.Bounds.MakespanLower
			if !(lb > 0) {
				t.Fatalf("seed %d %s: bound %v", seed, rep.Workload, lb)
			}
			for _, n := range s.Policies {
				if m := rep.Policies[n].Makespan; m < lb*(1-1e-9) {
					t.Fatalf("seed %d %s: %s makespan %.4f s beats the lower bound %.4f s", seed, rep.Workload, n, m, lb)
				}
			}
			verl := rep.Policies["verl_default"]
			if sh := verl.BoundShare; sh == nil || *sh != 0 {
				t.Fatalf("verl_default's own bound share %v, want 0", sh)
			}
		}
	}
}

// Regression (issue 27): a multi-turn trajectory's next prompt contains its
// previous output, whose KV the engine wrote while decoding. Charging those
// blocks as prefill again put the bound above an achievable makespan: on
// one engine running one sequence at a time, 4 trajectories x 10 turns with
// long responses and short tools reached makespan/bound 0.998 (the review's
// case: 0.990).
func TestLowerBoundMultiTurnOutputBlocksSeen(t *testing.T) {
	for _, resp := range []float64{1024, 2048} {
		a := DefaultAgent()
		a.Steps, a.Tasks, a.Group, a.MinTurns, a.MaxTurns = 1, 4, 1, 10, 10
		a.Seed = 1
		a.Response = LogNormal{Median: resp, Sigma: 0.3, Min: 8, Max: 4096}
		a.Tool = LogNormal{Median: 8, Sigma: 0.3, Min: 8, Max: 4096}
		a.ToolLatencyMedian = 0.01
		o := Options{Engines: EngineSpec{Engines: 1, GPUBlocks: 8192, MaxNumSeqs: 1, Seed: 1}, ScrapeInterval: 0.05}
		s := &Suite{NewWorkload: func() Workload { return NewAgent(a) }, Policies: []string{"verl_default"}, Opts: o}
		rep, _, err := s.Run()
		if err != nil {
			t.Fatal(err)
		}
		lb, m := rep.Bounds.MakespanLower, rep.Policies["verl_default"].Makespan
		if !(lb > 0) || m < lb*(1-1e-9) {
			t.Fatalf("response median %v: makespan %.4f s beats the lower bound %.4f s (ratio %.4f)", resp, m, lb, m/lb)
		}
		// Serial work on one engine: the bound is tight, within 5%.
		if m > lb*1.05 {
			t.Fatalf("response median %v: makespan/bound %.4f, want <= 1.05 on one serial engine", resp, m/lb)
		}
	}
}
