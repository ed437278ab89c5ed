package strategy

import (
	"math/rand/v2"
	"testing"

	"github.com/kvc-router/kvc-router/core/internal/index"
)

// Explain's terms end in exactly the score Score writes, for every
// explaining strategy and weighted combination, over random candidates;
// and kvc_aware's terms combine into that score by its formula.
func TestExplainMatchesScore(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	strategies := map[string]Strategy{
		"kvc_aware default": build(t, "kvc_aware", `{}`),
		"kvc_aware spread":  build(t, "kvc_aware", `{"sibling_spread":true,"marginal":false,"alpha":0.6}`),
		"least_inflight":    LeastInflight{},
		"weighted": &Weighted{Parts: []Strategy{build(t, "kvc_aware", `{}`), LeastInflight{}},
			Weights: []float64{2, 0.5}},
		"weighted single": &Weighted{Parts: []Strategy{build(t, "kvc_aware", `{}`)}, Weights: []float64{1}},
	}
	for name, s := range strategies {
		for trial := 0; trial < 200; trial++ {
			n := 1 + rng.IntN(6)
			c := make([]Candidate, n)
			for i := range c {
				h := 8 + rng.IntN(24)
				c[i] = Candidate{ID: string(rune('a' + i)), Order: i, Inflight: rng.IntN(50),
					InflightTokens: int64(rng.IntN(600_000)), Load: rng.Float64(), Healthy: true, Sessions: rng.IntN(9),
					HittableBlocks: h, Hit: index.Match{Tier: [index.NumTiers]int{rng.IntN(h / 2), rng.IntN(h / 4), 0}}}
			}
			prompt := 16 * (c[0].HittableBlocks + 1)
			req := &Request{Tokens: make([]int32, prompt), SessionsBound: uint64(rng.IntN(100)), LaterTurns: uint64(rng.IntN(300))}
			out := make([]float64, n)
			s.Score(req, c, out)
			terms := Explain(s, &Request{SessionsBound: req.SessionsBound, LaterTurns: req.LaterTurns}, prompt, c)
			if len(terms) != n {
				t.Fatalf("%s: %d term lists for %d candidates", name, len(terms), n)
			}
			for i := range c {
				last := terms[i][len(terms[i])-1]
				if last.Name != "score" || last.Value != out[i] {
					t.Fatalf("%s trial %d candidate %d: terms %v, Score %v", name, trial, i, terms[i], out[i])
				}
			}
		}
	}
	// kvc_aware: score = alpha*cache + (1-alpha)*(1-load-session_load) + penalty.
	k := build(t, "kvc_aware", `{}`).(*KVCAware)
	c := []Candidate{cand("a", 0, 0, [3]int{6, 0, 0}, 8), cand("b", 1, 0, [3]int{2, 0, 0}, 8)}
	c[1].InflightTokens = 470_000 // over load_threshold
	for _, ts := range k.Explain(&Request{}, 144, c) {
		m := map[string]float64{}
		for _, tm := range ts {
			m[tm.Name] = tm.Value
		}
		want := k.Alpha*m["cache"] + (1-k.Alpha)*(1-m["load"]-m["session_load"]) + m["overload_penalty"]
		if d := want - m["score"]; d > 1e-12 || d < -1e-12 {
			t.Fatalf("terms %v do not sum to the score (%v)", ts, want)
		}
	}
}

// A strategy without Explain has no terms, and neither has a weighted
// combination containing one.
func TestExplainOpaqueStrategy(t *testing.T) {
	c := []Candidate{cand("a", 0, 0, [3]int{}, 8)}
	if Explain(opaque{}, &Request{}, 0, c) != nil {
		t.Fatal("opaque strategy explained")
	}
	w := &Weighted{Parts: []Strategy{LeastInflight{}, opaque{}}, Weights: []float64{1, 1}}
	if w.Explain(&Request{}, 0, c) != nil {
		t.Fatal("weighted with an opaque part explained")
	}
}

type opaque struct{}

func (opaque) Name() string                                   { return "opaque" }
func (opaque) Score(_ *Request, c []Candidate, out []float64) {}
