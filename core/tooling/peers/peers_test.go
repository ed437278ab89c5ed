package peers

import (
	"math"
	"testing"

	json "github.com/goccy/go-json"

	"github.com/kvc-router/kvc-router/core/index"
	"github.com/kvc-router/kvc-router/core/load"
	"github.com/kvc-router/kvc-router/core/strategy"
)

func cand(id string, order, inflight int, hit [index.NumTiers]int, hittable int) strategy.Candidate {
	n := hit[0] + hit[1] + hit[2]
	return strategy.Candidate{ID: id, Order: order, Inflight: inflight, Healthy: true, Fresh: true,
		Hit: index.Match{Blocks: n, Tier: hit}, HittableBlocks: hittable}
}

func peerPick(t *testing.T, s strategy.Strategy, c []strategy.Candidate) string {
	t.Helper()
	out := make([]float64, len(c))
	s.Score(&strategy.Request{}, c, out)
	return c[strategy.Pick(c, out)].ID
}

func build(t *testing.T, name, params string) strategy.Strategy {
	t.Helper()
	s, err := strategy.Build(name, json.RawMessage(params))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestRoundRobinCycles(t *testing.T) {
	s := build(t, "round_robin", "")
	c := []strategy.Candidate{cand("a", 0, 5, [3]int{}, 0), cand("b", 1, 0, [3]int{}, 0), cand("c", 2, 0, [3]int{}, 0)}
	var got []string
	for i := 0; i < 6; i++ {
		got = append(got, peerPick(t, s, c))
	}
	want := []string{"a", "b", "c", "a", "b", "c"}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("round robin order %v, want %v", got, want)
		}
	}
}

func TestRandomSeeded(t *testing.T) {
	c := []strategy.Candidate{cand("a", 0, 0, [3]int{}, 0), cand("b", 1, 0, [3]int{}, 0), cand("c", 2, 0, [3]int{}, 0), cand("d", 3, 0, [3]int{}, 0)}
	seq := func(seed string) []string {
		s := build(t, "random", `{"seed":`+seed+`}`)
		var out []string
		for i := 0; i < 40; i++ {
			out = append(out, peerPick(t, s, c))
		}
		return out
	}
	a, b := seq("7"), seq("7")
	seen := map[string]bool{}
	for i := range a {
		if a[i] != b[i] {
			t.Fatal("same seed gave different picks")
		}
		seen[a[i]] = true
	}
	if len(seen) < 3 {
		t.Fatalf("random used only %v of 4 candidates in 40 picks", seen)
	}
}

func TestSGLangRule(t *testing.T) {
	s := build(t, "sglang_cache_aware", "")
	cases := []struct {
		name string
		c    []strategy.Candidate
		want string
	}{
		{"match above threshold wins over load",
			[]strategy.Candidate{cand("a", 0, 10, [3]int{5, 0, 0}, 10), cand("b", 1, 0, [3]int{}, 10)}, "a"},
		{"match at or below threshold -> least loaded",
			[]strategy.Candidate{cand("a", 0, 10, [3]int{3, 0, 0}, 10), cand("b", 1, 2, [3]int{}, 10)}, "b"},
		{"longest match among several",
			[]strategy.Candidate{cand("a", 0, 0, [3]int{4, 0, 0}, 10), cand("b", 1, 9, [3]int{8, 0, 0}, 10)}, "b"},
		{"equal match -> less loaded",
			[]strategy.Candidate{cand("a", 0, 9, [3]int{8, 0, 0}, 10), cand("b", 1, 3, [3]int{8, 0, 0}, 10)}, "b"},
		{"imbalanced (diff 70 > 64, 80 > 1.5*10) -> shortest queue despite match",
			[]strategy.Candidate{cand("a", 0, 80, [3]int{10, 0, 0}, 10), cand("b", 1, 10, [3]int{}, 10)}, "b"},
		{"abs gap alone is not imbalance (200 vs 134: gap 66 > 64 but 200 <= 1.5*134)",
			[]strategy.Candidate{cand("a", 0, 200, [3]int{10, 0, 0}, 10), cand("b", 1, 134, [3]int{}, 10)}, "a"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := peerPick(t, s, tc.c); got != tc.want {
				t.Fatalf("picked %s, want %s", got, tc.want)
			}
		})
	}
}

type fakeSignals map[string]struct {
	m               load.Metrics
	prefill, decode float64
}

func (f fakeSignals) Metrics(id string) (load.Metrics, bool) { v, ok := f[id]; return v.m, ok }
func (f fakeSignals) Active(id string) (float64, float64, bool) {
	v, ok := f[id]
	return v.prefill, v.decode, ok
}

func TestLLMDScores(t *testing.T) {
	sig := fakeSignals{
		"a": {m: load.Metrics{Waiting: 4, KVUsage: 0.5, HasKVUsage: true}},
		"b": {m: load.Metrics{Waiting: 0, KVUsage: 0.1, HasKVUsage: true}},
	}
	RegisterSignals("peers-test", sig)
	defer RegisterSignals("peers-test", nil)
	s := build(t, "llmd_weighted", `{"signals":"peers-test"}`)
	c := []strategy.Candidate{cand("a", 0, 0, [3]int{8, 0, 0}, 10), cand("b", 1, 0, [3]int{}, 10)}
	out := make([]float64, 2)
	s.Score(&strategy.Request{}, c, out)
	// a: 3*0.8 + 2*0 + 2*0.5 = 3.4; b: 3*0 + 2*1 + 2*0.9 = 3.8
	for i, want := range []float64{3.4, 3.8} {
		if math.Abs(out[i]-want) > 1e-6 {
			t.Fatalf("score[%d] = %v, want %v", i, out[i], want)
		}
	}
	// The approximate scorer hashes at most 256 blocks: 256 matched of a
	// 1,000-block prompt is a full prefix score.
	c2 := []strategy.Candidate{cand("a", 0, 0, [3]int{256, 0, 0}, 1000)}
	s.Score(&strategy.Request{}, c2, out[:1])
	if want := 3*1.0 + 2*1 + 2*0.5; math.Abs(out[0]-want) > 1e-6 {
		t.Fatalf("capped prefix score %v, want %v", out[0], want)
	}
	// Precise: tier weights gpu 1.0, cpu 0.8; weights 2/1/1.
	p := build(t, "llmd_precise", `{"signals":"peers-test"}`)
	c3 := []strategy.Candidate{cand("a", 0, 0, [3]int{5, 5, 0}, 10), cand("b", 1, 0, [3]int{}, 10)}
	p.Score(&strategy.Request{}, c3, out)
	// a: 2*(5+4)/10 + 1*0 + 1*0.5 = 2.3; b: 0 + 1 + 0.9 = 1.9
	for i, want := range []float64{2.3, 1.9} {
		if math.Abs(out[i]-want) > 1e-6 {
			t.Fatalf("precise score[%d] = %v, want %v", i, out[i], want)
		}
	}
	// Without signals: queue from in-flight, kv from Load.
	n := build(t, "llmd_weighted", "")
	c4 := []strategy.Candidate{cand("a", 0, 4, [3]int{}, 10), cand("b", 1, 0, [3]int{}, 10)}
	c4[0].Load, c4[1].Load = 0.5, 0.5
	if got := peerPick(t, n, c4); got != "b" {
		t.Fatalf("fallback picked %s, want b (shorter queue)", got)
	}
}

func TestDynamoCost(t *testing.T) {
	sig := fakeSignals{"a": {prefill: 10, decode: 100}, "b": {prefill: 0, decode: 40}}
	RegisterSignals("dyn-test", sig)
	defer RegisterSignals("dyn-test", nil)
	s := build(t, "dynamo_cost", `{"signals":"dyn-test"}`)
	d := s.(*Dynamo)
	cases := []struct {
		c    strategy.Candidate
		want float64
	}{
		// request blocks = hittable+1 = 20; a: prefill 10+20-16 = 14, decode 100+20 -> 134
		{cand("a", 0, 0, [3]int{16, 0, 0}, 19), 134},
		// b: CPU overlap credited 0.75: 0+20-0.75*8 = 14; decode 40+20 -> 74
		{cand("b", 1, 0, [3]int{0, 8, 0}, 19), 74},
		// credit never drives prefill negative: disk 0.25
		{cand("b", 1, 0, [3]int{19, 0, 4}, 19), 0 + 60},
	}
	for i, tc := range cases {
		if got := d.Cost(&tc.c, sig); math.Abs(got-tc.want) > 1e-9 {
			t.Fatalf("case %d: cost %v, want %v", i, got, tc.want)
		}
	}
	c := []strategy.Candidate{cases[0].c, cases[1].c}
	if got := peerPick(t, s, c); got != "b" {
		t.Fatalf("picked %s, want the cheaper b", got)
	}
	// Without signals the in-flight prompt tokens stand in for both loads.
	n := build(t, "dynamo_cost", "")
	c2 := []strategy.Candidate{cand("a", 0, 1, [3]int{}, 9), cand("b", 1, 1, [3]int{}, 9)}
	c2[0].InflightTokens, c2[1].InflightTokens = 1600, 160
	if got := peerPick(t, n, c2); got != "b" {
		t.Fatalf("fallback picked %s, want b", got)
	}
}

func TestPeerParamsStrict(t *testing.T) {
	for _, tc := range []struct{ name, params string }{
		{"round_robin", `{"x":1}`}, {"random", `{"seed":"a"}`}, {"sglang_cache_aware", `{"balance_rel_threshold":0.5}`},
		{"llmd_weighted", `{"prefix_weight":-1}`}, {"llmd_precise", `{"tier_weights":{"tape":1}}`}, {"dynamo_cost", `{"block_size":0}`},
	} {
		if _, err := strategy.Build(tc.name, json.RawMessage(tc.params)); err == nil {
			t.Errorf("%s accepted %s", tc.name, tc.params)
		}
	}
}
