package bench

import (
	"encoding/json"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/kvc-router/kvc-router/core/kvcrouter"
	"github.com/kvc-router/kvc-router/testbed/sim"
)

func TestRouterQueueOrder(t *testing.T) {
	// Five requests queued in order 1..5: prompt tokens and the best
	// overlap any worker holds.
	type req struct {
		tokens int
		cached float64
	}
	reqs := []req{{1000, 0}, {1000, 960}, {512, 0}, {1000, 960}, {100, 200}}
	for _, tc := range []struct {
		policy string
		want   []int
	}{
		{QueueFCFS, []int{1, 2, 3, 4, 5}},
		{"", []int{1, 2, 3, 4, 5}},
		{QueueLCFS, []int{5, 4, 3, 2, 1}},
		// Smith's rule: 1/max(1, tokens-cached): #5 (full overlap, 1
		// token) first, then #2 and #4 (40 new tokens, in queue order),
		// #3 (512), #1 (1000).
		{QueueWSPT, []int{5, 2, 4, 3, 1}},
	} {
		var q routerQueue
		for i, r := range reqs {
			seq := uint64(i + 1)
			q.push(&Item{seq: i + 1}, queueKey(tc.policy, seq, r.tokens, r.cached), seq)
		}
		var got []int
		for q.Len() > 0 {
			got = append(got, q.pop().seq)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%q: served %v, want %v", tc.policy, got, tc.want)
		}
	}
}

func TestResidencyEffectiveOverlap(t *testing.T) {
	stored := func(medium string, hs ...uint64) kvcrouter.Event {
		return kvcrouter.Event{Kind: kvcrouter.EventStored, Medium: medium, BlockHashes: hs}
	}
	removed := func(medium string, hs ...uint64) kvcrouter.Event {
		return kvcrouter.Event{Kind: kvcrouter.EventRemoved, Medium: medium, BlockHashes: hs}
	}
	prompt := []uint64{1, 2, 3, 4, 5}
	for _, tc := range []struct {
		name string
		evs  []kvcrouter.Event
		want float64
	}{
		{"nothing", nil, 0},
		{"gpu prefix", []kvcrouter.Event{stored(sim.MediumGPU, 1, 2, 3)}, 3},
		{"a hole ends the prefix", []kvcrouter.Event{stored(sim.MediumGPU, 1, 3, 4, 5)}, 1},
		{"no medium is gpu", []kvcrouter.Event{stored("", 1, 2)}, 2},
		// Offloaded: stored on CPU, then removed from GPU.
		{"offloaded blocks weigh 0.75", []kvcrouter.Event{stored(sim.MediumGPU, 1, 2, 3), stored(sim.MediumCPU, 2, 3), removed(sim.MediumGPU, 2, 3)}, 2.5},
		{"disk 0.25", []kvcrouter.Event{stored(sim.MediumGPU, 1), stored(sim.MediumStorage, 2)}, 1.25},
		{"gpu wins over a copy below", []kvcrouter.Event{stored(sim.MediumGPU, 1, 2), stored(sim.MediumCPU, 1, 2)}, 2},
		{"removed from every tier", []kvcrouter.Event{stored(sim.MediumGPU, 1, 2), stored(sim.MediumCPU, 2), removed(sim.MediumGPU, 2), removed(sim.MediumCPU, 2)}, 1},
		{"cleared", []kvcrouter.Event{stored(sim.MediumGPU, 1, 2), {Kind: kvcrouter.EventCleared}, stored(sim.MediumGPU, 2)}, 0},
	} {
		r := residency{}
		r.apply(tc.evs)
		if got := r.effective(prompt, 0.75, 0.25); got != tc.want {
			t.Errorf("%s: effective %v blocks, want %v", tc.name, got, tc.want)
		}
	}
}

// TestDynamoQueueOrders runs the router queue under each order on a fleet
// that backs up: nothing is lost, fcfs places held requests in arrival
// order, and lcfs and wspt do not.
func TestDynamoQueueOrders(t *testing.T) {
	g := smallGRPO()
	g.Prompts, g.N, g.Steps = 16, 8, 1
	opts := smallOpts()
	opts.Engines.Engines, opts.Engines.MaxBatchedTokens = 2, 512
	opts.Record = true
	// Arrivals over a tenth of a second: Dynamo keys a request when it is queued,
	// so a burst at one instant would be keyed before any event arrived.
	opts.ArrivalSpread = 0.1
	inversions := map[string]int{}
	for _, policy := range []string{QueueFCFS, QueueLCFS, QueueWSPT} {
		p, err := NewPolicy("dynamo_cost+queue", PolicyOptions{Seed: 1, Params: map[string]json.RawMessage{
			"dynamo_cost": json.RawMessage(`{"router_queue_policy":"` + policy + `"}`)}})
		if err != nil {
			t.Fatal(err)
		}
		res, err := Run(NewGRPO(g), p, opts)
		if err != nil {
			t.Fatal(err)
		}
		if res.Requests != g.Prompts*g.N || res.Unfinished != 0 || res.FinalInflight != 0 || res.QueueLeft != 0 || res.Queued == 0 {
			t.Fatalf("%s: %d of %d requests, unfinished %d, in flight %d, still queued %d, queued %d",
				policy, res.Requests, g.Prompts*g.N, res.Unfinished, res.FinalInflight, res.QueueLeft, res.Queued)
		}
		// Siblings share a prompt: by the time the queue forms, their
		// first sample's blocks are in the events wspt reads.
		if (res.QueuedCachedTokens > 0) != (policy == QueueWSPT) {
			t.Errorf("%s: queued requests' best overlap %v tokens (only wspt reads it, and must find some)", policy, res.QueuedCachedTokens)
		}
		recs := append([]Record(nil), res.Records...)
		sort.SliceStable(recs, func(a, b int) bool {
			if recs[a].At != recs[b].At {
				return recs[a].At < recs[b].At
			}
			return recs[a].Seq < recs[b].Seq
		})
		for i := 1; i < len(recs); i++ {
			if recs[i].Routed < recs[i-1].Routed {
				inversions[policy]++
			}
		}
	}
	if inversions[QueueFCFS] != 0 {
		t.Errorf("fcfs placed %d requests before an earlier arrival", inversions[QueueFCFS])
	}
	for _, p := range []string{QueueLCFS, QueueWSPT} {
		if inversions[p] == 0 {
			t.Errorf("%s placed every held request in arrival order", p)
		}
	}
}

// TestResidencyFromEngineEvents: a prompt an engine served is found, by the
// engine hashes of its full blocks, in the residency its events build (and
// events encoded and decoded as the driver delivers them keep that).
func TestResidencyFromEngineEvents(t *testing.T) {
	e, err := sim.New(sim.Config{BlockSize: 16, NumGPUBlocks: 256, MaxNumSeqs: 8, MaxNumBatchedTokens: 2048, HashSalt: 7})
	if err != nil {
		t.Fatal(err)
	}
	prompt := make([]int32, 16*10+5)
	for i := range prompt {
		prompt[i] = int32(i + 11)
	}
	if err := e.Submit(sim.Request{ID: "a", Prompt: prompt, MaxTokens: 2}); err != nil {
		t.Fatal(err)
	}
	r := residency{}
	now := 0.0
	for i := 0; e.HasWork() && i < 1000; i++ {
		res := e.Step(now)
		now += res.Duration
		payload, err := kvcrouter.EncodeEvents(&kvcrouter.EventBatch{TS: now, Events: res.Events, DPRank: -1}, kvcrouter.EventLayoutArray)
		if err != nil {
			t.Fatal(err)
		}
		b, err := kvcrouter.DecodeEvents(payload)
		if err != nil {
			t.Fatal(err)
		}
		r.apply(b.Events)
	}
	if got := r.effective(e.EngineHashes(prompt), 0.75, 0.25); got != 10 {
		t.Errorf("served prompt: %v cached blocks, want its 10 full blocks", got)
	}
	other := append([]int32{999}, prompt[1:]...)
	if got := r.effective(e.EngineHashes(other), 0.75, 0.25); got != 0 {
		t.Errorf("a prompt differing in its first token: %v cached blocks, want 0", got)
	}
}

// TestEventLengths: without output counts (+evlengths, verl without the
// hook) the router reads nearly every request's length off the engines'
// KV events; with counts (+lengths) it takes the counts.
func TestEventLengths(t *testing.T) {
	g := smallGRPO()
	g.Prompts, g.N, g.Steps = 8, 4, 2
	for _, tc := range []struct {
		policy           string
		counts, fromEvts bool
	}{{"kvc_aware+evlengths", false, true}, {"kvc_aware+admit+evlengths", false, true}, {"kvc_aware+lengths", true, false}} {
		p, err := NewPolicy(tc.policy, PolicyOptions{Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		res, err := Run(NewGRPO(g), p, smallOpts())
		if err != nil {
			t.Fatal(err)
		}
		l := res.Lengths
		if l == nil {
			t.Fatalf("%s: no length learner", tc.policy)
		}
		n := uint64(res.Requests)
		if tc.counts && (l.Observed != n || l.ObservedEvents != 0) {
			t.Errorf("%s: %+v, want every one of %d releases counted", tc.policy, *l, n)
		}
		// A request whose output never fills a block shows nothing.
		if tc.fromEvts && (l.Observed != 0 || l.ObservedEvents < n*9/10) {
			t.Errorf("%s: %+v, want at least 90%% of %d releases learnt from events", tc.policy, *l, n)
		}
	}
}

// The +work rows place by predicted output (work_weight 1 unless the
// parameters say otherwise) and account for it exactly: once a run has
// released every request by name, no server keeps a charge, and the charge
// moved placements (the engines' busy times differ from the same learner
// without the work term).
func TestWorkPolicies(t *testing.T) {
	g := smallGRPO()
	g.Prompts, g.N, g.Steps = 8, 4, 2
	base, err := NewPolicy("kvc_aware+lengths", PolicyOptions{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := Run(NewGRPO(g), base, smallOpts())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"kvc_aware+work+lengths", "kvc_aware+work+truelen", "kvc_aware+admit+work+truelen"} {
		p, err := NewPolicy(name, PolicyOptions{Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		c := p.Config(nil)
		if len(c.Strategies) != 1 || !c.Lengths.Enabled || !strings.Contains(string(c.Strategies[0].Params), `"work_weight":1`) {
			t.Fatalf("%s: config %+v", name, c)
		}
		res, err := Run(NewGRPO(g), p, smallOpts())
		if err != nil {
			t.Fatal(err)
		}
		if res.Lengths == nil || len(res.Lengths.PredictedTokens) == 0 {
			t.Fatalf("%s: no predicted work summed (%+v)", name, res.Lengths)
		}
		for s, w := range res.Lengths.PredictedTokens {
			if w > 1e-6 {
				t.Errorf("%s: %s keeps %v predicted tokens after every request was released", name, s, w)
			}
		}
		if slices.Equal(res.Busy, plain.Busy) {
			t.Errorf("%s: engines busy %v, as without the work term: nothing was charged", name, res.Busy)
		}
	}
	p, err := NewPolicy("kvc_aware+work+lengths", PolicyOptions{Params: map[string]json.RawMessage{"kvc_aware": json.RawMessage(`{"work_weight":2}`)}})
	if err != nil {
		t.Fatal(err)
	}
	if c := p.Config(nil); !strings.Contains(string(c.Strategies[0].Params), `"work_weight":2`) {
		t.Fatalf("parameters' work_weight not kept: %s", c.Strategies[0].Params)
	}
	if _, err := NewPolicy("kvc_aware+work+lengths", PolicyOptions{Params: map[string]json.RawMessage{"kvc_aware": json.RawMessage(`{"work_weight":20}`)}}); err == nil {
		t.Fatal("work_weight 20 accepted")
	}
}

// The +engine_queue rows are the +admit rows with admission.engine_queue 1.
// On engines whose KV binds far below the slot cap (they queue), the option
// acts (the run differs from the same row without it: the router's own
// tests pin what it holds) and every request still completes.
func TestEngineQueuePolicies(t *testing.T) {
	g := smallGRPO()
	g.Prompts, g.N, g.Steps = 16, 8, 1
	g.Response = LogNormal{Median: 400, Sigma: 0.5, Max: 1500}
	opts := smallOpts()
	// 6.4k tokens an engine: KV binds near 10 requests, far below the 32
	// slots admission caps at (96 of the 128 requests go at once).
	opts.Engines.GPUBlocks, opts.Engines.MaxNumSeqs = 400, 32
	for _, base := range []string{"kvc_aware+admit", "kvc_aware+admit+lengths"} {
		plain, err := NewPolicy(base, PolicyOptions{Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		queued, err := NewPolicy(base+"+engine_queue", PolicyOptions{Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		if c, p := queued.Config(nil), plain.Config(nil); c.Admission.EngineQueue != 1 || p.Admission.EngineQueue != 0 ||
			!c.Admission.Enabled || c.Lengths.Enabled != p.Lengths.Enabled || queued.OutputCounts != plain.OutputCounts {
			t.Fatalf("%s: config %+v against %+v", base, c.Admission, p.Admission)
		}
		a, err := Run(NewGRPO(g), plain, opts)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Run(NewGRPO(g), queued, opts)
		if err != nil {
			t.Fatal(err)
		}
		if b.Requests != g.Prompts*g.N || b.Unfinished != 0 || b.FinalInflight != 0 {
			t.Fatalf("%s+engine_queue: %d requests, %d unfinished, %d in flight", base, b.Requests, b.Unfinished, b.FinalInflight)
		}
		if a.Makespans[0] == b.Makespans[0] && a.Preemptions == b.Preemptions {
			t.Errorf("%s: engine_queue changed nothing (makespan %v, %d preemptions)", base, a.Makespans, a.Preemptions)
		}
	}
}
