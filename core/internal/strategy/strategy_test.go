package strategy

import (
	"errors"
	"math"
	"strings"
	"testing"

	json "github.com/goccy/go-json"

	"github.com/kvc-router/kvc-router/core/internal/index"
)

func cands(n int) []Candidate {
	c := make([]Candidate, n)
	for i := range c {
		c[i] = Candidate{ID: string(rune('a' + i)), Order: i, Healthy: true, HittableBlocks: 10}
	}
	return c
}

func pick(t *testing.T, s Strategy, c []Candidate) string {
	t.Helper()
	out := make([]float64, len(c))
	s.Score(&Request{}, c, out)
	return c[Pick(c, out)].ID
}

func TestLeastInflight(t *testing.T) {
	s, err := Build("least_inflight", nil)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		inflight []int
		order    []int
		want     string
	}{
		{"all idle ties to first added", []int{0, 0, 0}, []int{0, 1, 2}, "a"},
		{"least wins", []int{3, 1, 2}, []int{0, 1, 2}, "b"},
		{"tie broken by order not position", []int{1, 0, 0}, []int{0, 2, 1}, "c"},
		{"load ignored", []int{1, 1, 0}, []int{0, 1, 2}, "c"},
	}
	for _, tc := range cases {
		c := cands(3)
		for i := range c {
			c[i].Inflight, c[i].Order = tc.inflight[i], tc.order[i]
			c[i].Load = float64(3-i) / 3
		}
		if got := pick(t, s, c); got != tc.want {
			t.Errorf("%s: got %s want %s", tc.name, got, tc.want)
		}
	}
}

func TestKVCAware(t *testing.T) {
	s, err := Build("kvc_aware", nil)
	if err != nil {
		t.Fatal(err)
	}
	k := s.(*KVCAware)
	cases := []struct {
		name string
		set  func(c []Candidate)
		want string
	}{
		{"prefix holder wins at equal load", func(c []Candidate) { c[1].Hit = index.Match{Blocks: 8, Tier: [3]int{8}} }, "b"},
		{"longer prefix wins", func(c []Candidate) {
			c[0].Hit = index.Match{Blocks: 3, Tier: [3]int{3}}
			c[2].Hit = index.Match{Blocks: 9, Tier: [3]int{9}}
		}, "c"},
		{"gpu beats cpu at equal length", func(c []Candidate) {
			c[0].Hit = index.Match{Blocks: 8, Tier: [3]int{0, 8}}
			c[1].Hit = index.Match{Blocks: 8, Tier: [3]int{8}}
		}, "b"},
		{"load decides without hits", func(c []Candidate) { c[0].Load, c[1].Load, c[2].Load = 0.5, 0.2, 0.3 }, "b"},
		{"overloaded holder loses", func(c []Candidate) {
			c[0].Hit = index.Match{Blocks: 10, Tier: [3]int{10}}
			c[0].Load = 0.95
			c[1].Load = 0.8
		}, "c"},
		{"all overloaded: formula still ranks", func(c []Candidate) {
			for i := range c {
				c[i].Load = 0.95
			}
			c[2].Hit = index.Match{Blocks: 10, Tier: [3]int{10}}
		}, "c"},
		{"big load gap beats small hit", func(c []Candidate) {
			c[0].Hit = index.Match{Blocks: 1, Tier: [3]int{1}}
			c[0].Load = 0.85
		}, "b"},
	}
	for _, tc := range cases {
		c := cands(3)
		tc.set(c)
		if got := pick(t, k, c); got != tc.want {
			t.Errorf("%s: got %s want %s", tc.name, got, tc.want)
		}
	}
	// The formula itself.
	c := cands(1)
	c[0].Hit = index.Match{Blocks: 6, Tier: [3]int{2, 2, 2}}
	c[0].Load = 0.5
	out := make([]float64, 1)
	k.Score(&Request{}, c, out)
	a := k.Alpha
	want := a*(0.7*0.2+0.2*0.2+0.1*0.2) + (1-a)*0.5
	if math.Abs(out[0]-want) > 1e-12 {
		t.Fatalf("score %v want %v", out[0], want)
	}
}

func TestBuildErrors(t *testing.T) {
	cases := []struct {
		name, strat, params, want string
	}{
		{"unknown name", "magic", "{}", "unknown strategy"},
		{"unknown field", "kvc_aware", `{"alfa": 1}`, "alfa"},
		{"alpha range", "kvc_aware", `{"alpha": 1.5}`, "alpha"},
		{"threshold range", "kvc_aware", `{"load_threshold": 0}`, "load_threshold"},
		{"bad tier", "kvc_aware", `{"layer_weights": {"hbm": 1}}`, "hbm"},
		{"bad weight", "kvc_aware", `{"layer_weights": {"gpu": -1}}`, "layer_weights.gpu"},
		{"wrong type", "kvc_aware", `{"alpha": "high"}`, "alpha"},
		{"least_inflight takes nothing", "least_inflight", `{"x": 1}`, "x"},
		{"work_weight range", "kvc_aware", `{"work_weight": 11}`, "work_weight"},
		{"work_weight negative", "kvc_aware", `{"work_weight": -0.5}`, "work_weight"},
		{"work_weight without token_load", "kvc_aware", `{"work_weight": 1, "token_load": false}`, "token_load"},
	}
	for _, c := range cases {
		_, err := Build(c.strat, json.RawMessage(c.params))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want mention of %q", c.name, err, c.want)
		}
	}
	if _, err := Build("nope", nil); !errors.Is(err, ErrUnknown) {
		t.Fatalf("want ErrUnknown, got %v", err)
	}
}

func TestWeightedAndPick(t *testing.T) {
	a, _ := Build("least_inflight", nil)
	b, _ := Build("kvc_aware", nil)
	w := &Weighted{Parts: []Strategy{a, b}, Weights: []float64{0.01, 1}}
	c := cands(2)
	c[0].Inflight = 5
	c[0].Hit = index.Match{Blocks: 10, Tier: [3]int{10}}
	if got := pick(t, w, c); got != "a" {
		t.Fatalf("weighted: got %s", got)
	}
	w.Weights[0] = 1
	if got := pick(t, w, c); got != "b" {
		t.Fatalf("weighted heavier inflight: got %s", got)
	}
	if !strings.Contains(w.Name(), "least_inflight*1") {
		t.Fatalf("name %q", w.Name())
	}
	if Pick(nil, nil) != -1 {
		t.Fatal("empty pick")
	}
	nan := math.NaN()
	if got := Pick(cands(3), []float64{nan, 1, nan}); got != 1 {
		t.Fatalf("NaN must lose, got %d", got)
	}
}

func TestKVCAwareRefinements(t *testing.T) {
	k := DefaultKVCAware()
	if err := k.Validate(); err != nil {
		t.Fatal(err)
	}
	// Marginal credit: a block every candidate holds earns nothing, so a
	// busy holder of a shared system prompt loses to an idle server.
	c := cands(2)
	for i := range c {
		c[i].HittableBlocks = 64
	}
	c[0].Hit = index.Match{Blocks: 40, Tier: [3]int{40}}
	c[1].Hit = index.Match{Blocks: 40, Tier: [3]int{40}}
	c[0].Load = 0.2
	if got := pick(t, &k, c); got != "b" {
		t.Fatalf("shared prefix still pulls to the busy server: %s", got)
	}
	// A long distinguishing hit (8k tokens of prefill saved) still wins
	// over a modest load gap.
	for i := range c {
		c[i].HittableBlocks = 512
	}
	c[0].Hit = index.Match{Blocks: 512, Tier: [3]int{512}}
	c[1].Hit = index.Match{}
	c[0].Load = 0.15
	out := make([]float64, 2)
	k.Score(&Request{Tokens: make([]int32, 16*513)}, c, out)
	if out[0] <= out[1] {
		t.Fatalf("full distinguishing hit lost to load 0.15: %v", out)
	}
	// KV pressure: in-flight prompt tokens over the server's KV capacity.
	d := cands(2)
	d[0].InflightTokens, d[0].KVCapacityTokens = 50_000, 100_000
	d[1].InflightTokens, d[1].KVCapacityTokens = 10_000, 100_000
	if got := pick(t, &k, d); got != "b" {
		t.Fatalf("KV-committed server chosen: %s", got)
	}
	// Saved-token scale: a one-block hit on a short prompt is worth little.
	e := cands(2)
	for i := range e {
		e[i].HittableBlocks = 4
	}
	e[0].Hit = index.Match{Blocks: 1, Tier: [3]int{1}}
	e[0].Load = 0.1
	k.Score(&Request{Tokens: make([]int32, 80)}, e, out)
	if out[0] >= out[1] {
		t.Fatalf("16-token hit outweighed load 0.1: %v", out)
	}
	for _, bad := range []string{`{"kv_tokens":0}`, `{"saved_scale_tokens":-1}`} {
		if _, err := Build("kvc_aware", json.RawMessage(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func TestEffectiveLoadDelegation(t *testing.T) {
	c := &Candidate{Load: 0.2, InflightTokens: 900, KVCapacityTokens: 1000}
	kvc := build(t, "kvc_aware", `{}`)
	noTok := build(t, "kvc_aware", `{"token_load":false}`)
	least := build(t, "least_inflight", `{}`)
	for _, tc := range []struct {
		name string
		s    Strategy
		want float64
	}{
		{"kvc_aware token load", kvc, 0.9},
		{"kvc_aware without token load", noTok, 0.2},
		{"least_inflight uses the store's load", least, 0.2},
		{"weighted takes the highest part", &Weighted{Parts: []Strategy{least, kvc}, Weights: []float64{1, 1}}, 0.9},
		{"weighted without a measuring part", &Weighted{Parts: []Strategy{least}, Weights: []float64{1}}, 0.2},
	} {
		if got := EffectiveLoad(tc.s, c); got != tc.want {
			t.Errorf("%s: EffectiveLoad = %v, want %v", tc.name, got, tc.want)
		}
	}
}
