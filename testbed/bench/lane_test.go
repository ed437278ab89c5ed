package bench

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func TestLanePlan(t *testing.T) {
	type req struct{ phase, resp, prompt, want int }
	cases := []struct {
		name string
		spec LaneSpec
		reqs []req
	}{
		{"long responses go to the lane whatever its load", LaneSpec{ThresholdTokens: 100, LaneShare: 0.5}, []req{
			{0, 100, 0, 0}, {0, 500, 0, 0}, {0, 1000, 0, 0}}},
		{"short ones balance planned work, the lane at its share", LaneSpec{ThresholdTokens: 1000, LaneShare: 0.5}, []req{
			// Empty plan: the lane ties and wins (first index).
			{0, 10, 0, 0},
			// Lane 10 / 0.5 = 20 against 0 and 0.
			{0, 10, 0, 1}, {0, 10, 0, 2},
			// Lane 20, engines 10 and 10: a tie goes to the first engine.
			{0, 10, 0, 1},
			// Lane 20, engine 1 20, engine 2 10.
			{0, 10, 0, 2},
			// Lane 20, 20, 20: the lane again.
			{0, 10, 0, 0}}},
		{"a prompt counts a tenth of an output token", LaneSpec{ThresholdTokens: 1000, LaneShare: 1}, []req{
			{0, 0, 100, 0}, // lane: 10
			{0, 9, 0, 1},   // engine 1: 9
			{0, 9, 0, 2},   // engine 2: 9
			{0, 1, 0, 1}}},
		{"a new step starts a new plan", LaneSpec{ThresholdTokens: 1000, LaneShare: 1}, []req{
			{0, 50, 0, 0}, {0, 50, 0, 1}, {0, 50, 0, 2},
			{1, 10, 0, 0}, {1, 5, 0, 1}}},
		{"the lane's long work counts against its share", LaneSpec{ThresholdTokens: 100, LaneShare: 0.5}, []req{
			{0, 100, 0, 0},
			{0, 60, 0, 1}, {0, 60, 0, 2}, // lane 100 / 0.5 = 200
			{0, 60, 0, 1}, {0, 60, 0, 2}, // 120 each, still below 200
			{0, 90, 0, 1}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newLanePlan(c.spec, 3)
			for i, r := range c.reqs {
				if got := p.pick(r.phase, r.resp, r.prompt); got != r.want {
					t.Fatalf("request %d (%+v): engine %d, want %d", i, r, got, r.want)
				}
			}
		})
	}
}

func TestLanePolicyParameters(t *testing.T) {
	for _, c := range []struct {
		params, err string
	}{
		{`{"lane_share": 0}`, "lane_share must be in (0, 1]"},
		{`{"lane_share": 1.5}`, "lane_share must be in (0, 1]"},
		{`{"threshold_tokens": 0}`, "threshold_tokens must be positive"},
		{`{"threshold": 5}`, "unknown field"},
	} {
		_, err := NewPolicy("longest_lane+truelen", PolicyOptions{Params: map[string]json.RawMessage{"longest_lane": json.RawMessage(c.params)}})
		if err == nil || !strings.Contains(err.Error(), c.err) {
			t.Fatalf("%s: error %v, want one naming %q", c.params, err, c.err)
		}
	}
	p, err := NewPolicy("longest_lane+truelen", PolicyOptions{})
	if err != nil || p.Lane == nil || *p.Lane != DefaultLane() {
		t.Fatalf("default policy %+v, %v", p.Lane, err)
	}
}

// TestLaneReferencePinsLongestToTheLane runs the reference end to end:
// every response at or above the threshold runs on engine 0, the other
// engines take the rest, and the lane's short work stays within its
// LaneShare of theirs.
func TestLaneReferencePinsLongestToTheLane(t *testing.T) {
	sh := Shape{LengthCorr: 0.8}
	const prompts, n = 24, 8
	wl := shapedGRPO(7, sh, 2, prompts, n)
	items := wl.Start(0, 0)
	lens := lengths(items)
	slices.Sort(lens)
	// The longest 3%, few enough that the lane also takes short work.
	spec := LaneSpec{ThresholdTokens: lens[len(lens)*97/100], LaneShare: 0.25}
	params, _ := json.Marshal(spec)
	p, err := NewPolicy("longest_lane+truelen", PolicyOptions{Params: map[string]json.RawMessage{"longest_lane": params}})
	if err != nil || *p.Lane != spec {
		t.Fatalf("policy %+v, %v", p.Lane, err)
	}
	opts := smallOpts()
	opts.Record = true
	res, err := Run(shapedGRPO(7, sh, 2, prompts, n), p, opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Records) != 2*prompts*n {
		t.Fatalf("%d records, want %d", len(res.Records), 2*prompts*n)
	}
	var short [3]float64
	long0 := 0.0
	for _, r := range res.Records {
		if r.OutputLen >= spec.ThresholdTokens {
			if r.Engine != 0 {
				t.Fatalf("a %d-token response ran on engine %d, not the lane", r.OutputLen, r.Engine)
			}
			long0 += float64(r.OutputLen) + promptWeight*float64(r.PromptLen)
			continue
		}
		short[r.Engine] += float64(r.OutputLen) + promptWeight*float64(r.PromptLen)
	}
	// The lane counts its long work against its share too, so its short
	// work stays under LaneShare of a normal engine's (ignoring the share,
	// it takes about half of theirs on this fixture).
	others := (short[1] + short[2]) / 2
	if short[1] == 0 || short[2] == 0 || short[0] > spec.LaneShare*others {
		t.Fatalf("short work per engine %v (the lane's long work %.0f): the lane took more than its share", short, long0)
	}
}
