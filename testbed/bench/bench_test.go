package bench

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	json "github.com/goccy/go-json"
)

// tinyTrace builds a conversation-like Mooncake trace: a shared system
// block 0, then conversations whose turns extend the previous turn's ids.
func tinyTrace(rows, convs int) string {
	var b strings.Builder
	next := int64(1)
	hist := make([][]int64, convs)
	for i := 0; i < rows; i++ {
		c := i % convs
		if hist[c] == nil {
			hist[c] = []int64{0}
		}
		hist[c] = append(hist[c], next, next+1)
		next += 2
		ids := hist[c]
		in := 512*(len(ids)-1) + 100 // partial last block
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": %s}`+"\n",
			(i/4)*3000, in, 20+i%30, strings.ReplaceAll(fmt.Sprint(ids), " ", ", "))
	}
	return b.String()
}

func TestMooncakeSynthesis(t *testing.T) {
	trace := `{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 7, 9]}
{"timestamp": 3000, "input_length": 600, "output_length": 5, "hash_ids": [0, 7]}
{"timestamp": 3000, "input_length": 1024, "output_length": 5, "hash_ids": [0, 8]}
`
	m, err := ReadMooncake(strings.NewReader(trace), MooncakeConfig{BinSeconds: 3, Seed: 4})
	if err != nil {
		t.Fatal(err)
	}
	var p [3][]int32
	for i, it := range m.Start(0, 0) {
		p[it.seq] = slices.Clone(m.Prompt(it, nil))
		if i > 0 && it.At < m.Start(0, 0)[i-1].At {
			t.Fatal("arrivals not sorted")
		}
	}
	for i, want := range []int{1100, 600, 1024} {
		if len(p[i]) != want {
			t.Fatalf("prompt %d has %d tokens, want input_length %d", i, len(p[i]), want)
		}
	}
	if !slices.Equal(p[0][:600], p[1]) {
		t.Fatal("equal hash ids must give equal tokens (row 1 is a prefix of row 0)")
	}
	if !slices.Equal(p[0][:512], p[2][:512]) || slices.Equal(p[0][512:1024], p[2][512:1024]) {
		t.Fatal("block 0 shared, blocks 7 and 8 must differ")
	}
	// Partial last block: row 0's third block holds 1100-1024 = 76 tokens,
	// the first 76 tokens of id 9's synthetic block.
	for j := 0; j < 76; j++ {
		if p[0][1024+j] != SynthToken(9, j, 32000) {
			t.Fatal("partial last block is not the head of its hash id's tokens")
		}
	}
	// Jitter stays inside the 3 s bin; rate scale divides time.
	for _, it := range m.Start(0, 0) {
		bin := m.Rows[it.seq].Timestamp / 1000
		if it.At < bin || it.At >= bin+3 {
			t.Fatalf("row %d at %.3f outside its bin [%v, %v)", it.seq, it.At, bin, bin+3)
		}
	}
	m2, _ := ReadMooncake(strings.NewReader(trace), MooncakeConfig{BinSeconds: 3, Seed: 4, RateScale: 2})
	for i, it := range m2.Start(0, 0) {
		if math.Abs(it.At*2-m.Start(0, 0)[i].At) > 1e-9 {
			t.Fatal("rate scale 2 must halve arrival times")
		}
	}
	if _, err := ReadMooncake(strings.NewReader(`{"timestamp":0,"input_length":1100,"output_length":1,"hash_ids":[1,2]}`), MooncakeConfig{}); err == nil {
		t.Fatal("accepted a row with too few hash ids")
	}
	lim, _ := ReadMooncake(strings.NewReader(trace), MooncakeConfig{Limit: 2})
	if len(lim.Rows) != 2 {
		t.Fatalf("limit 2 kept %d rows", len(lim.Rows))
	}
}

func TestTraceOracleHand(t *testing.T) {
	// r0: 1100 tokens, nothing seen. r1 [0,7]: 2 blocks seen -> min(1024, 600) = 600.
	// r2 [0,8]: block 0 seen -> 512. Oracle = (0+600+512)/(1100+600+1024).
	trace := `{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 7, 9]}
{"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": [0, 7]}
{"timestamp": 2, "input_length": 1024, "output_length": 5, "hash_ids": [0, 8]}
`
	m, _ := ReadMooncake(strings.NewReader(trace), MooncakeConfig{})
	if got, want := m.TraceOracle(), 1112.0/2724; math.Abs(got-want) > 1e-12 {
		t.Fatalf("trace oracle %v, want %v", got, want)
	}
}

func TestWorkloadsDeterministic(t *testing.T) {
	g := DefaultGRPO()
	g.Prompts, g.N, g.Steps, g.Seed = 4, 16, 2, 9
	a, b := NewGRPO(g), NewGRPO(g)
	ia, ib := a.Start(1, 5), b.Start(1, 5)
	if len(ia) != 64 {
		t.Fatalf("grpo step has %d requests, want B*n = 64", len(ia))
	}
	keys := map[string]bool{}
	var lens []int
	for i := range ia {
		if !slices.Equal(ia[i].prompt, ib[i].prompt) || ia[i].MaxTokens != ib[i].MaxTokens || ia[i].At != 5 {
			t.Fatal("grpo not deterministic per seed / not submitted together")
		}
		if !slices.Equal(ia[i].prompt, ia[i/16*16].prompt) {
			t.Fatal("samples of one prompt must share it")
		}
		if !slices.Equal(ia[i].prompt[:g.SystemTokens], ia[0].prompt[:g.SystemTokens]) {
			t.Fatal("system prompt not shared")
		}
		keys[ia[i].Key] = true
		lens = append(lens, ia[i].MaxTokens)
	}
	if len(keys) != 64 {
		t.Fatal("each sample needs its own request_id")
	}
	// Long tail: with sigma 0.9 the max response is well above the median.
	slices.Sort(lens)
	if lens[len(lens)-1] < 2*lens[len(lens)/2] {
		t.Fatalf("responses not long-tailed: median %d max %d", lens[len(lens)/2], lens[len(lens)-1])
	}
	g2 := g
	g2.Seed = 10
	if slices.Equal(NewGRPO(g2).Start(1, 5)[0].prompt, ia[0].prompt) {
		t.Fatal("different seeds gave the same prompt")
	}

	ac := DefaultAgent()
	ac.Tasks, ac.Group, ac.Steps, ac.Seed = 2, 2, 1, 3
	ag := NewAgent(ac)
	first := ag.Start(0, 0)
	if len(first) != 4 {
		t.Fatalf("agent: %d first turns, want tasks*group = 4", len(first))
	}
	it := first[0]
	out := []int32{1, 2, 3}
	nx := ag.Done(it, out, 10)
	if len(nx) != 1 {
		t.Fatal("agent trajectory ended after one turn (min turns 4)")
	}
	n := nx[0]
	if n.Key != it.Key || n.ID == it.ID || n.At <= 10 {
		t.Fatalf("next turn key %q id %q at %v: want same request_id, new engine id, after tool latency", n.Key, n.ID, n.At)
	}
	if !slices.Equal(n.prompt[:len(it.prompt)], it.prompt) || !slices.Equal(n.prompt[len(it.prompt):len(it.prompt)+3], out) ||
		len(n.prompt) <= len(it.prompt)+3 {
		t.Fatal("next prompt must be previous prompt + response + a tool chunk")
	}
}

func TestOracleAndPooledLRUHand(t *testing.T) {
	// Block size 4. Keys are symbolic.
	recs := []Record{
		{Phase: 0, At: 0, PromptLen: 10, PromptBlocks: 2, Keys: []uint64{1, 2, 3}},  // 0 hits
		{Phase: 0, At: 1, PromptLen: 9, PromptBlocks: 2, Keys: []uint64{1, 2}},      // 2 blocks -> 8
		{Phase: 0, At: 2, PromptLen: 13, PromptBlocks: 3, Keys: []uint64{1, 2, 3}},  // 3 blocks (incl. output block 3) -> 12
		{Phase: 1, At: 3, PromptLen: 8, PromptBlocks: 2, Keys: []uint64{1, 2}},      // new weights: 0
		{Phase: 1, At: 4, PromptLen: 8, PromptBlocks: 2, Keys: []uint64{1, 9}},      // 1 block -> 4
		{Phase: 0, At: 0.5, PromptLen: 4, PromptBlocks: 1, Keys: []uint64{7, 8, 1}}, // sorted in at 0.5: 0 hits
	}
	total := 10.0 + 9 + 13 + 8 + 8 + 4
	if got, want := Oracle(recs, 4), (8.0+12+4)/total; math.Abs(got-want) > 1e-12 {
		t.Fatalf("oracle %v, want %v", got, want)
	}
	// Capacity 3: after r0 {1,2,3} (touched 3,2,1 -> MRU 1); r5 touches 1,8,7
	// -> cache {7,8,1}; r1 [1,2]: 1 hits, 2 evicted -> 4 tokens; touches 2,1
	// -> {1,2,7}; r2 [1,2,3]: 2 blocks -> 8; phase 1: r3 0; r4 [1,9]: 1 -> 4.
	if got, want := PooledLRU(recs, 4, 3), (4.0+8+4)/total; math.Abs(got-want) > 1e-12 {
		t.Fatalf("pooled LRU %v, want %v", got, want)
	}
	if got := PooledLRU(recs, 4, 1000); math.Abs(got-Oracle(recs, 4)) > 1e-12 {
		t.Fatalf("an LRU larger than the working set must equal the oracle, got %v", got)
	}
}

func smallOpts() Options {
	return Options{Engines: EngineSpec{Engines: 3, GPUBlocks: 4000, MaxNumSeqs: 64, Seed: 1}, ScrapeInterval: 0.05}
}

func TestDriverConservesRequests(t *testing.T) {
	mc, err := ReadMooncake(strings.NewReader(tinyTrace(120, 12)), MooncakeConfig{BinSeconds: 3, Seed: 2, RateScale: 4})
	if err != nil {
		t.Fatal(err)
	}
	g := DefaultGRPO()
	g.Prompts, g.N, g.Steps = 3, 4, 2
	g.Response = LogNormal{Median: 40, Sigma: 0.5, Max: 200}
	ac := DefaultAgent()
	ac.Tasks, ac.Group, ac.Steps, ac.MinTurns, ac.MaxTurns = 3, 2, 2, 2, 3
	ac.Response = LogNormal{Median: 30, Sigma: 0.3, Max: 100}
	ac.Tool = LogNormal{Median: 40, Sigma: 0.3, Max: 100}
	ac.SystemTokens = 64
	ac.Task = LogNormal{Median: 100, Max: 200}
	workloads := []struct {
		name string
		mk   func() Workload
		want int
	}{
		{"mooncake", func() Workload { return mc }, 120},
		{"grpo", func() Workload { return NewGRPO(g) }, 24},
		{"agent", func() Workload { return NewAgent(ac) }, -1},
	}
	for _, w := range workloads {
		for _, pn := range PolicyNames {
			t.Run(w.name+"/"+pn, func(t *testing.T) {
				p, err := NewPolicy(pn, PolicyOptions{Seed: 1})
				if err != nil {
					t.Fatal(err)
				}
				res, err := Run(w.mk(), p, smallOpts())
				if err != nil {
					t.Fatal(err)
				}
				if w.want >= 0 && res.Requests != w.want {
					t.Fatalf("%d requests completed, want %d", res.Requests, w.want)
				}
				if res.Router.Acquires != uint64(res.Requests) || res.Router.Releases != uint64(res.Requests) {
					t.Fatalf("acquires %d releases %d completions %d", res.Router.Acquires, res.Router.Releases, res.Requests)
				}
				if !p.StickyIDs && res.Router.StickyHits != 0 {
					t.Fatalf("policy without sessions had %d sticky hits", res.Router.StickyHits)
				}
				if res.FinalInflight != 0 || res.Unfinished != 0 {
					t.Fatalf("in-flight %d, unfinished %d after the run", res.FinalInflight, res.Unfinished)
				}
				if len(res.TTFT) != res.Requests || res.Events.ApplyErrors+res.Events.DecodeErrors != 0 {
					t.Fatal("latency samples or event errors inconsistent")
				}
				if w.name != "mooncake" && len(res.Makespans) != 2 {
					t.Fatalf("%d makespans, want one per step", len(res.Makespans))
				}
			})
		}
	}
}

func TestAgentTurnsShareRequestID(t *testing.T) {
	ac := DefaultAgent()
	ac.Tasks, ac.Group, ac.Steps, ac.MinTurns, ac.MaxTurns = 2, 1, 1, 3, 3
	ac.Response = LogNormal{Median: 30, Max: 100}
	ac.Tool = LogNormal{Median: 40, Max: 100}
	ac.SystemTokens = 64
	p, _ := NewPolicy("verl_default", PolicyOptions{})
	res, err := Run(NewAgent(ac), p, smallOpts())
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 6 || res.Router.StickyHits != 4 {
		t.Fatalf("requests %d sticky hits %d, want 6 and 4 (turns 2 and 3 of each trajectory)", res.Requests, res.Router.StickyHits)
	}
	// Later turns hit the previous prompt and response on the same engine.
	if res.CachedTokens == 0 {
		t.Fatal("no prefix hits on multi-turn trajectories")
	}
}

func TestSuiteKVCBeatsRoundRobin(t *testing.T) {
	mc, err := ReadMooncake(strings.NewReader(tinyTrace(200, 25)), MooncakeConfig{BinSeconds: 3, Seed: 1, RateScale: 2})
	if err != nil {
		t.Fatal(err)
	}
	s := &Suite{NewWorkload: func() Workload { return mc }, Policies: []string{"round_robin", "kvc_aware"},
		Opts: Options{Engines: EngineSpec{Engines: 4, GPUBlocks: 12000, Seed: 1}}, Parallel: 2}
	rep, _, err := s.Run()
	if err != nil {
		t.Fatal(err)
	}
	rr, kv := rep.Policies["round_robin"], rep.Policies["kvc_aware"]
	if !(kv.HitRate > rr.HitRate+0.1) {
		t.Fatalf("kvc_aware hit %.3f not clearly above round_robin %.3f", kv.HitRate, rr.HitRate)
	}
	if kv.HitRate > rep.Bounds.Oracle+1e-9 || rep.Bounds.Pooled > rep.Bounds.Oracle+1e-9 {
		t.Fatalf("bounds violated: hit %.3f pooled %.3f oracle %.3f", kv.HitRate, rep.Bounds.Pooled, rep.Bounds.Oracle)
	}
}

func smallGRPO() GRPOConfig {
	g := DefaultGRPO()
	g.Prompts, g.N, g.Steps = 4, 4, 2
	g.SystemTokens = 64
	g.Prompt = LogNormal{Median: 200, Sigma: 0.3, Min: 64, Max: 400}
	g.Response = LogNormal{Median: 40, Sigma: 0.5, Max: 200}
	return g
}

func TestArrivalSpread(t *testing.T) {
	p, _ := NewPolicy("verl_default", PolicyOptions{})
	arrivals := func(spread float64) []float64 {
		o := smallOpts()
		o.Record, o.ArrivalSpread = true, spread
		res, err := Run(NewGRPO(smallGRPO()), p, o)
		if err != nil {
			t.Fatal(err)
		}
		var at []float64
		for _, r := range res.Records {
			if r.Phase == 0 {
				at = append(at, r.At)
			}
		}
		return at
	}
	for _, a := range arrivals(0) {
		if a != 0 {
			t.Fatalf("burst arrival at %v, want 0", a)
		}
	}
	at := arrivals(0.5)
	distinct := map[float64]bool{}
	for _, a := range at {
		if a < 0 || a >= 0.5 {
			t.Fatalf("spread arrival at %v, want within [0, 0.5)", a)
		}
		distinct[a] = true
	}
	if len(at) != 16 || len(distinct) < 12 {
		t.Fatalf("%d arrivals, %d distinct: not spread", len(at), len(distinct))
	}
	if _, err := Run(NewGRPO(smallGRPO()), p, Options{Engines: EngineSpec{Engines: 1}, ArrivalSpread: -1}); err == nil {
		t.Fatal("negative spread accepted")
	}
}

func TestMakespanBoundAndGainShare(t *testing.T) {
	g := smallGRPO()
	g.Prompt = LogNormal{Median: 3000, Sigma: 0.2, Min: 1000, Max: 4000} // prefill-heavy
	g.Response = LogNormal{Median: 8, Max: 16}
	s := &Suite{NewWorkload: func() Workload { return NewGRPO(g) }, Policies: []string{"verl_default", "round_robin", "kvc_aware"},
		Opts: smallOpts(), Parallel: 2, MakespanBound: true}
	rep, _, err := s.Run()
	if err != nil {
		t.Fatal(err)
	}
	b := rep.Bounds.MakespanFree
	if b == nil || len(rep.Bounds.MakespanFreeSteps) != g.Steps {
		t.Fatalf("no per-step bound: %+v", rep.Bounds)
	}
	verl := rep.Policies["verl_default"]
	if !(*b < verl.Makespan) {
		t.Fatalf("prefill-free makespan %.3f not below verl_default's %.3f on a prefill-heavy workload", *b, verl.Makespan)
	}
	if g := verl.GainShare; g == nil || *g != 0 {
		t.Fatalf("verl_default's own gain share %v, want 0", g)
	}
	kv := rep.Policies["kvc_aware"]
	if want := GainShare(verl.Makespan, kv.Makespan, *b); kv.GainShare == nil || *kv.GainShare != want {
		t.Fatalf("kvc_aware gain share %v, want %v", kv.GainShare, want)
	}
	if GainShare(10, 8, 6) != 0.5 || GainShare(10, 8, 10) != 0 {
		t.Fatal("GainShare arithmetic")
	}
}

func TestPolicyParams(t *testing.T) {
	if _, err := NewPolicy("nope", PolicyOptions{}); err == nil {
		t.Fatal("unknown policy accepted")
	}
	bad := map[string]string{
		"sglang_cache_aware": `{"balance_rel_threshold":0.5}`,
		"llmd_precise":       `{"prefix_weight":-1}`,
		"dynamo_cost":        `{"overlap_score_credit":-2}`,
		"kvc_aware":          `{"alpha":3}`,
		"verl_default":       `{}`,
	}
	for name, raw := range bad {
		if _, err := NewPolicy(name, PolicyOptions{Params: map[string]json.RawMessage{name: json.RawMessage(raw)}}); err == nil {
			t.Errorf("%s accepted %s", name, raw)
		}
	}
	// Unknown keys are errors, and variants take their base's parameters.
	if _, err := NewPolicy("dynamo_cost+session", PolicyOptions{Params: map[string]json.RawMessage{"dynamo_cost": json.RawMessage(`{"overlap":1}`)}}); err == nil {
		t.Error("unknown dynamo key accepted through a variant")
	}
	p, err := NewPolicy("llmd_precise+session", PolicyOptions{Params: map[string]json.RawMessage{"llmd_precise": json.RawMessage(`{"prefix_weight":3}`)}})
	if err != nil || !p.Sessions || p.Scrape != LLMDScrapeInterval || !p.Events {
		t.Fatalf("llmd_precise+session: %+v %v", p, err)
	}
	// llm-d precise runs with speculative indexing off; +spec turns it on.
	for name, want := range map[string]bool{"llmd_precise": false, "llmd_precise+spec": true, "dynamo_cost": false, "dynamo_cost+ttl": true} {
		p, _ := NewPolicy(name, PolicyOptions{})
		if c := p.Config(nil); c.Speculate == nil || *c.Speculate != want || c.Strategy == nil {
			t.Errorf("%s: speculate %v, want %v (strategy %v)", name, c.Speculate, want, c.Strategy)
		}
	}
}

func TestDynamoSeesDeduplicatedActiveBlocks(t *testing.T) {
	// With the predicted-TTL index, a GRPO sibling's prompt is already
	// active on the first sibling's engine: only its last block is new
	// decode load, so siblings may share an engine; the run stays sound.
	p, _ := NewPolicy("dynamo_cost+ttl", PolicyOptions{Seed: 3})
	res, err := Run(NewGRPO(smallGRPO()), p, smallOpts())
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 32 || res.FinalInflight != 0 || res.Unfinished != 0 {
		t.Fatalf("requests %d in-flight %d unfinished %d", res.Requests, res.FinalInflight, res.Unfinished)
	}
	s := signals{d: &driver{pol: Policy{ActiveBlocks: true}, byName: map[string]int{"e": 0},
		engines: []*engine{{id: "e", blocks: map[uint64]int32{1: 2, 2: 1}, prefill: 3}}}}
	s.d.cur, s.d.curKeys = &Item{ID: "r"}, []uint64{1, 2, 3}
	a, ok := s.Active("e", "r")
	if !ok || a.DecodeBlocks != 2 || a.NewBlocks != 1 || a.PrefillBlocks != 3 {
		t.Fatalf("active %+v ok %v, want decode 2 unique full blocks, new 1, prefill 3 (Dynamo 1.6.1 counts full blocks)", a, ok)
	}
	if _, ok := s.Active("e", "other"); ok {
		t.Fatal("answered for a request not being routed")
	}
}

// TestDynamoRouterQueue: dynamo_cost+queue (router_queue_threshold 1.0, FCFS)
// holds requests while every engine's tracked prefill tokens exceed the
// threshold x max_num_batched_tokens, and loses none; a threshold no backlog
// reaches makes the run exactly plain dynamo_cost's.
func TestDynamoRouterQueue(t *testing.T) {
	g := smallGRPO()
	g.Prompts, g.N, g.Steps = 16, 8, 1
	opts := smallOpts()
	opts.Engines.Engines, opts.Engines.MaxBatchedTokens = 2, 512
	run := func(name, params string) *Result {
		t.Helper()
		o := PolicyOptions{Seed: 1}
		if params != "" {
			o.Params = map[string]json.RawMessage{"dynamo_cost": json.RawMessage(params)}
		}
		p, err := NewPolicy(name, o)
		if err != nil {
			t.Fatal(err)
		}
		res, err := Run(NewGRPO(g), p, opts)
		if err != nil {
			t.Fatal(err)
		}
		if res.Requests != g.Prompts*g.N || res.Unfinished != 0 || res.FinalInflight != 0 || res.QueueLeft != 0 {
			t.Fatalf("%s: %d of %d requests, unfinished %d, in flight %d, still queued %d",
				name, res.Requests, g.Prompts*g.N, res.Unfinished, res.FinalInflight, res.QueueLeft)
		}
		return res
	}
	plain, queued := run("dynamo_cost", ""), run("dynamo_cost+queue", "")
	if plain.Queued != 0 {
		t.Fatalf("plain dynamo_cost queued %d requests", plain.Queued)
	}
	if queued.Queued == 0 {
		t.Fatal("dynamo_cost+queue never held a request: 128 prompts on two engines of 512 batched tokens must back up")
	}
	never := run("dynamo_cost+queue", `{"router_queue_threshold":1000}`)
	if never.Queued != 0 || never.Makespans[0] != plain.Makespans[0] || never.CachedTokens != plain.CachedTokens {
		t.Fatalf("threshold 1000: queued %d, makespan %v vs plain %v, cached %d vs %d",
			never.Queued, never.Makespans[0], plain.Makespans[0], never.CachedTokens, plain.CachedTokens)
	}
	for _, bad := range []string{`{"router_queue_threshold":-1}`, `{"router_queue_threshold":1001}`, `{"router_queue_policy":"lifo"}`, `{"router_queue_policy":"WSPT"}`} {
		if _, err := NewPolicy("dynamo_cost+queue", PolicyOptions{Params: map[string]json.RawMessage{"dynamo_cost": json.RawMessage(bad)}}); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
