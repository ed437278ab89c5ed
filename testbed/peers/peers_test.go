package peers

import (
	"fmt"
	"github.com/kvc-router/kvc-router/core/kvcrouter"
	"math"
	"testing"
)

func cand(id string, order, inflight int, hit [kvcrouter.NumTiers]int, hittable int) kvcrouter.Candidate {
	n := hit[0] + hit[1] + hit[2]
	return kvcrouter.Candidate{ID: id, Order: order, Inflight: inflight, Healthy: true, Fresh: true,
		Hit: kvcrouter.Match{Blocks: n, Tier: hit}, HittableBlocks: hittable}
}

func peerPick(t *testing.T, s kvcrouter.Strategy, c []kvcrouter.Candidate) string {
	t.Helper()
	out := make([]float64, len(c))
	s.Score(&kvcrouter.ScoreRequest{}, c, out)
	return c[kvcrouter.Pick(c, out)].ID
}

func mustLLMD(t *testing.T, name string, cfg LLMD, sig Signals) *LLMD {
	t.Helper()
	l, err := NewLLMD(name, cfg, sig)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func mustDynamo(t *testing.T, cfg Dynamo, sig Signals) *Dynamo {
	t.Helper()
	d, err := NewDynamo(cfg, sig)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestRoundRobinCycles(t *testing.T) {
	s := &RoundRobin{}
	c := []kvcrouter.Candidate{cand("a", 0, 5, [3]int{}, 0), cand("b", 1, 0, [3]int{}, 0), cand("c", 2, 0, [3]int{}, 0)}
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
	c := []kvcrouter.Candidate{cand("a", 0, 0, [3]int{}, 0), cand("b", 1, 0, [3]int{}, 0), cand("c", 2, 0, [3]int{}, 0), cand("d", 3, 0, [3]int{}, 0)}
	seq := func(seed uint64) []string {
		s := NewRandom(seed)
		var out []string
		for i := 0; i < 40; i++ {
			out = append(out, peerPick(t, s, c))
		}
		return out
	}
	a, b := seq(7), seq(7)
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
	sg := DefaultSGLang()
	cases := []struct {
		name string
		c    []kvcrouter.Candidate
		want string
	}{
		{"match above threshold wins over load",
			[]kvcrouter.Candidate{cand("a", 0, 10, [3]int{5, 0, 0}, 10), cand("b", 1, 0, [3]int{}, 10)}, "a"},
		{"match at or below threshold -> smallest tree (both empty: the first), not least loaded",
			[]kvcrouter.Candidate{cand("a", 0, 10, [3]int{3, 0, 0}, 10), cand("b", 1, 2, [3]int{}, 10)}, "a"},
		{"longest match among several",
			[]kvcrouter.Candidate{cand("a", 0, 0, [3]int{4, 0, 0}, 10), cand("b", 1, 9, [3]int{8, 0, 0}, 10)}, "b"},
		{"equal match -> less loaded",
			[]kvcrouter.Candidate{cand("a", 0, 9, [3]int{8, 0, 0}, 10), cand("b", 1, 3, [3]int{8, 0, 0}, 10)}, "b"},
		{"imbalanced (diff 70 > 64, 80 > 1.5*10) -> shortest queue despite match",
			[]kvcrouter.Candidate{cand("a", 0, 80, [3]int{10, 0, 0}, 10), cand("b", 1, 10, [3]int{}, 10)}, "b"},
		{"abs gap alone is not imbalance (200 vs 134: gap 66 > 64 but 200 <= 1.5*134)",
			[]kvcrouter.Candidate{cand("a", 0, 200, [3]int{10, 0, 0}, 10), cand("b", 1, 134, [3]int{}, 10)}, "a"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fresh := sg // every case starts from empty trees
			if got := peerPick(t, &fresh, tc.c); got != tc.want {
				t.Fatalf("picked %s, want %s", got, tc.want)
			}
		})
	}
}

// sgl-router's no-match rule sends cold prompts to the tenant whose tree
// is smallest, whatever the load; the gateway's sends them to the least
// loaded server.
func TestSGLangSmallestTreeVsGateway(t *testing.T) {
	tree := DefaultSGLang()
	gw := DefaultSGLang()
	gw.Rule = SGLangRuleGateway
	req := func(n int) *kvcrouter.ScoreRequest { return &kvcrouter.ScoreRequest{Tokens: make([]int32, n)} }
	pick := func(s *SGLang, r *kvcrouter.ScoreRequest, c []kvcrouter.Candidate) string {
		out := make([]float64, len(c))
		s.Score(r, c, out)
		return c[kvcrouter.Pick(c, out)].ID
	}
	idle := func() []kvcrouter.Candidate {
		return []kvcrouter.Candidate{cand("a", 0, 0, [3]int{}, 10), cand("b", 1, 0, [3]int{}, 10), cand("c", 2, 0, [3]int{}, 10)}
	}
	// Cold prompts of 1000, 10, 10 tokens: the tree rule fills a, then b, c;
	// the fourth goes to the smallest tree (b: 10 tokens), not back to a.
	var got []string
	for _, n := range []int{1000, 10, 10, 10} {
		got = append(got, pick(&tree, req(n), idle()))
	}
	if want := []string{"a", "b", "c", "b"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("tree rule picked %v, want %v", got, want)
	}
	// Load does not move the tree rule (below the imbalance thresholds) but decides the gateway's.
	busy := idle()
	busy[2].Inflight = 5
	if p := pick(&tree, req(10), busy); p != "c" {
		t.Fatalf("tree rule picked %s, want c (smallest tree: 10 tokens)", p)
	}
	busy[0].Inflight = 3
	if p := pick(&gw, req(10), busy); p != "b" {
		t.Fatalf("gateway rule picked %s, want b (least loaded)", p)
	}
	bad := DefaultSGLang()
	bad.Rule = "lru"
	if bad.Validate() == nil {
		t.Fatal("unknown rule accepted")
	}
}

type fakeServer struct {
	m      kvcrouter.LoadMetrics
	active Active
}

// fakeSignals answers for any request id; session maps request id -> server.
type fakeSignals struct {
	servers map[string]fakeServer
	session map[string]string
}

func (f fakeSignals) Metrics(id string) (kvcrouter.LoadMetrics, bool) {
	v, ok := f.servers[id]
	return v.m, ok
}
func (f fakeSignals) Active(id, _ string) (Active, bool) {
	v, ok := f.servers[id]
	return v.active, ok
}
func (f fakeSignals) Session(req string) (string, bool) { s, ok := f.session[req]; return s, ok }

func TestLLMDScores(t *testing.T) {
	sig := fakeSignals{servers: map[string]fakeServer{
		"a": {m: kvcrouter.LoadMetrics{Waiting: 4, KVUsage: 0.5, HasKVUsage: true}},
		"b": {m: kvcrouter.LoadMetrics{Waiting: 0, KVUsage: 0.1, HasKVUsage: true}},
	}}
	s := mustLLMD(t, "llmd_weighted", DefaultLLMDApprox(), sig)
	c := []kvcrouter.Candidate{cand("a", 0, 0, [3]int{8, 0, 0}, 10), cand("b", 1, 0, [3]int{}, 10)}
	out := make([]float64, 2)
	s.Score(&kvcrouter.ScoreRequest{}, c, out)
	// a: 3*0.8 + 2*0 + 2*0.5 = 3.4; b: 3*0 + 2*1 + 2*0.9 = 3.8
	for i, want := range []float64{3.4, 3.8} {
		if math.Abs(out[i]-want) > 1e-6 {
			t.Fatalf("score[%d] = %v, want %v", i, out[i], want)
		}
	}
	// The approximate scorer hashes at most 256 blocks: 256 matched of a
	// 1,000-block prompt is a full prefix score.
	c2 := []kvcrouter.Candidate{cand("a", 0, 0, [3]int{256, 0, 0}, 1000)}
	s.Score(&kvcrouter.ScoreRequest{}, c2, out[:1])
	if want := 3*1.0 + 2*1 + 2*0.5; math.Abs(out[0]-want) > 1e-6 {
		t.Fatalf("capped prefix score %v, want %v", out[0], want)
	}
	// Precise: tier weights gpu 1.0, cpu 0.8; weights 2/1/1; the prefix
	// score min–max normalised over the pods with a hit
	// (indexedScoresToNormalizedScoredPods): a lone hit scores 1.
	p := mustLLMD(t, "llmd_precise", DefaultLLMDPrecise(), sig)
	c3 := []kvcrouter.Candidate{cand("a", 0, 0, [3]int{5, 5, 0}, 10), cand("b", 1, 0, [3]int{}, 10)}
	p.Score(&kvcrouter.ScoreRequest{}, c3, out)
	// a: 2*1 + 1*0 + 1*0.5 = 2.5; b: 0 + 1 + 0.9 = 1.9
	for i, want := range []float64{2.5, 1.9} {
		if math.Abs(out[i]-want) > 1e-6 {
			t.Fatalf("precise score[%d] = %v, want %v", i, out[i], want)
		}
	}
	// Three pods, raw 9 (5 gpu + 5 cpu), 3, 0: normalised 1, 0, 0 (the
	// least-hit pod with a hit scores as a pod without one).
	sig.servers["c"] = fakeServer{m: kvcrouter.LoadMetrics{Waiting: 0, KVUsage: 0.1, HasKVUsage: true}}
	c5 := []kvcrouter.Candidate{cand("a", 0, 0, [3]int{5, 5, 0}, 10), cand("b", 1, 0, [3]int{3, 0, 0}, 10),
		cand("c", 2, 0, [3]int{}, 10)}
	out3 := make([]float64, 3)
	p.Score(&kvcrouter.ScoreRequest{}, c5, out3)
	for i, want := range []float64{2 + 0 + 0.5, 0 + 1 + 0.9, 0 + 1 + 0.9} {
		if math.Abs(out3[i]-want) > 1e-6 { // breakTies nudges one of b, c by one ulp
			t.Fatalf("precise min-max score[%d] = %v, want %v", i, out3[i], want)
		}
	}
	// Without signals: queue from in-flight, kv from Load.
	n := mustLLMD(t, "llmd_weighted", DefaultLLMDApprox(), nil)
	c4 := []kvcrouter.Candidate{cand("a", 0, 4, [3]int{}, 10), cand("b", 1, 0, [3]int{}, 10)}
	c4[0].Load, c4[1].Load = 0.5, 0.5
	if got := peerPick(t, n, c4); got != "b" {
		t.Fatalf("fallback picked %s, want b (shorter queue)", got)
	}
}

func TestLLMDSessionAffinity(t *testing.T) {
	idle := kvcrouter.LoadMetrics{HasKVUsage: true}
	sig := fakeSignals{servers: map[string]fakeServer{"a": {m: idle}, "b": {m: idle}, "c": {m: idle}},
		session: map[string]string{"turn-2": "c"}}
	cfg := DefaultLLMDPrecise()
	cfg.SessionWeight = 4
	s := mustLLMD(t, "llmd_precise+session", cfg, sig)
	c := []kvcrouter.Candidate{cand("a", 0, 0, [3]int{4, 0, 0}, 10), cand("b", 1, 0, [3]int{}, 10), cand("c", 2, 0, [3]int{}, 10)}
	pick := func(id string) string {
		out := make([]float64, len(c))
		s.Score(&kvcrouter.ScoreRequest{ID: id}, c, out)
		return c[kvcrouter.Pick(c, out)].ID
	}
	// The session's server wins over a better prefix elsewhere...
	if got := pick("turn-2"); got != "c" {
		t.Fatalf("session request picked %s, want c", got)
	}
	// ...and a request without a session goes by prefix.
	if got := pick("fresh"); got != "a" {
		t.Fatalf("sessionless request picked %s, want a", got)
	}
}

func TestMaxScoreTiesBreakAtRandom(t *testing.T) {
	idle := kvcrouter.LoadMetrics{HasKVUsage: true}
	sig := fakeSignals{servers: map[string]fakeServer{"a": {m: idle}, "b": {m: idle}, "c": {m: idle}}}
	for _, s := range []kvcrouter.Strategy{
		mustLLMD(t, "llmd_precise", DefaultLLMDPrecise(), sig),
		mustDynamo(t, DefaultDynamo(), sig),
	} {
		c := []kvcrouter.Candidate{cand("a", 0, 0, [3]int{}, 10), cand("b", 1, 0, [3]int{}, 10), cand("c", 2, 0, [3]int{}, 10)}
		seen := map[string]int{}
		for i := 0; i < 60; i++ {
			out := make([]float64, len(c))
			s.Score(&kvcrouter.ScoreRequest{Tokens: make([]int32, 160)}, c, out)
			seen[c[kvcrouter.Pick(c, out)].ID]++
		}
		if len(seen) != 3 {
			t.Fatalf("%s: equal candidates picked %v, want all three over 60 picks", s.Name(), seen)
		}
	}
	// A strict winner is never displaced by the tie-break.
	d := mustDynamo(t, DefaultDynamo(), sig)
	c := []kvcrouter.Candidate{cand("a", 0, 0, [3]int{}, 10), cand("b", 1, 0, [3]int{5, 0, 0}, 10), cand("c", 2, 0, [3]int{}, 10)}
	for i := 0; i < 20; i++ {
		out := make([]float64, len(c))
		d.Score(&kvcrouter.ScoreRequest{Tokens: make([]int32, 160)}, c, out)
		if got := c[kvcrouter.Pick(c, out)].ID; got != "b" {
			t.Fatalf("picked %s, want b (overlap)", got)
		}
	}
}

func TestDynamoCost(t *testing.T) {
	sig := fakeSignals{servers: map[string]fakeServer{
		"a": {active: Active{PrefillBlocks: 10, DecodeBlocks: 100, NewBlocks: 20}},
		"b": {active: Active{PrefillBlocks: 0, DecodeBlocks: 40, NewBlocks: 20}},
		// c already holds the request's prompt in an active sequence: only
		// its last (partial) block is new decode load.
		"c": {active: Active{PrefillBlocks: 0, DecodeBlocks: 40, NewBlocks: 1}},
	}}
	d := mustDynamo(t, DefaultDynamo(), sig)
	req := &kvcrouter.ScoreRequest{Tokens: make([]int32, 320)} // 20 blocks of 16
	cases := []struct {
		c    kvcrouter.Candidate
		want float64
	}{
		// a: prefill 10+20-16 = 14, decode 100+20 -> 134
		{cand("a", 0, 0, [3]int{16, 0, 0}, 19), 134},
		// b: CPU overlap credited 0.75: 0+20-0.75*8 = 14; decode 40+20 -> 74
		{cand("b", 1, 0, [3]int{0, 8, 0}, 19), 74},
		// credit never drives prefill negative: disk 0.25
		{cand("b", 1, 0, [3]int{19, 0, 4}, 19), 0 + 60},
		// deduplicated decode: 0+20-19 = 1 prefill, decode 40+1
		{cand("c", 2, 0, [3]int{19, 0, 0}, 19), 1 + 41},
	}
	for i, tc := range cases {
		if got := d.Cost(req, &tc.c); math.Abs(got-tc.want) > 1e-9 {
			t.Fatalf("case %d: cost %v, want %v", i, got, tc.want)
		}
	}
	c := []kvcrouter.Candidate{cases[0].c, cases[1].c}
	out := make([]float64, 2)
	d.Score(req, c, out)
	if got := c[kvcrouter.Pick(c, out)].ID; got != "b" {
		t.Fatalf("picked %s, want the cheaper b", got)
	}
	// The agentic preset (credit 2, prefill_load_scale 4, 64 blocks per
	// active request): a: 4*max(10+20-2*16, 0) + 120 + 64*3 = 312;
	// b: 4*(20-0.75*8) + 60 + 64*1 = 180.
	ag := mustDynamo(t, AgenticDynamo(), sig)
	for i, tc := range []struct {
		c    kvcrouter.Candidate
		want float64
	}{
		{cand("a", 0, 3, [3]int{16, 0, 0}, 19), 312},
		{cand("b", 1, 1, [3]int{0, 8, 0}, 19), 180},
	} {
		if got := ag.Cost(req, &tc.c); math.Abs(got-tc.want) > 1e-9 {
			t.Fatalf("agentic case %d: cost %v, want %v", i, got, tc.want)
		}
	}
	// The per-request charge alone turns a decision: with equal blocks the
	// worker running fewer requests wins only when the weight is on.
	few, many := cand("a", 0, 1, [3]int{}, 19), cand("b", 1, 6, [3]int{}, 19)
	even := fakeSignals{servers: map[string]fakeServer{
		"a": {active: Active{DecodeBlocks: 50, NewBlocks: 20}}, "b": {active: Active{DecodeBlocks: 40, NewBlocks: 20}}}}
	for _, tc := range []struct {
		w    float64
		want string
	}{{0, "b"}, {64, "a"}} {
		cfg := DefaultDynamo()
		cfg.ActiveRequestWeight = tc.w
		dd := mustDynamo(t, cfg, even)
		cs := []kvcrouter.Candidate{few, many}
		dd.Score(req, cs, out)
		if got := cs[kvcrouter.Pick(cs, out)].ID; got != tc.want {
			t.Fatalf("decode_active_request_weight %v picked %s, want %s", tc.w, got, tc.want)
		}
	}
	// Without signals the in-flight prompt tokens stand in for both loads.
	n := mustDynamo(t, DefaultDynamo(), nil)
	c2 := []kvcrouter.Candidate{cand("a", 0, 1, [3]int{}, 9), cand("b", 1, 1, [3]int{}, 9)}
	c2[0].InflightTokens, c2[1].InflightTokens = 1600, 160
	n.Score(req, c2, out)
	if got := c2[kvcrouter.Pick(c2, out)].ID; got != "b" {
		t.Fatalf("fallback picked %s, want b", got)
	}
}

func TestPeerConfigValidation(t *testing.T) {
	sg := DefaultSGLang()
	sg.BalanceRel = 0.5
	if sg.Validate() == nil {
		t.Error("sglang accepted balance_rel_threshold 0.5")
	}
	l := DefaultLLMDApprox()
	l.PrefixWeight = -1
	if _, err := NewLLMD("llmd_weighted", l, nil); err == nil {
		t.Error("llm-d accepted a negative weight")
	}
	l = DefaultLLMDPrecise()
	l.TierWeights = map[string]float64{"tape": 1}
	if _, err := NewLLMD("llmd_precise", l, nil); err == nil {
		t.Error("llm-d accepted an unknown tier")
	}
	d := DefaultDynamo()
	d.BlockSize = 0
	if _, err := NewDynamo(d, nil); err == nil {
		t.Error("dynamo accepted block_size 0")
	}
	d = DefaultDynamo()
	d.OverlapCredit = -1
	if _, err := NewDynamo(d, nil); err == nil {
		t.Error("dynamo accepted a negative overlap credit")
	}
	d = DefaultDynamo()
	d.ActiveRequestWeight = -64
	if _, err := NewDynamo(d, nil); err == nil {
		t.Error("dynamo accepted a negative decode_active_request_weight")
	}
	for _, ttl := range []float64{0, -1, 1e9} {
		d = DefaultDynamo()
		d.PredictedTTLSecs = ttl
		if _, err := NewDynamo(d, nil); err == nil {
			t.Errorf("dynamo accepted router_predicted_ttl_secs %v", ttl)
		}
	}
}

// llm-d's no-hit-lru scorer: neutral 0.5 when any pod has a hit; for cold
// requests, never-used pods first, then least recently used; the pick
// becomes the most recently used.
func TestLLMDNoHitLRU(t *testing.T) {
	cfg := DefaultLLMDPrecise()
	cfg.PrefixWeight, cfg.QueueWeight, cfg.KVWeight, cfg.NoHitWeight = 0, 0, 0, 1
	l := mustLLMD(t, "llmd_precise+nohit", cfg, nil)
	cold := func() []kvcrouter.Candidate {
		return []kvcrouter.Candidate{cand("a", 0, 0, [3]int{}, 10), cand("b", 1, 0, [3]int{}, 10), cand("c", 2, 0, [3]int{}, 10)}
	}
	var got []string
	for range 4 {
		got = append(got, peerPick(t, l, cold()))
	}
	// a, b, c are each unused in turn; then a is the least recently used.
	if want := []string{"a", "b", "c", "a"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("cold picks %v, want %v", got, want)
	}
	out := make([]float64, 3)
	l.Score(&kvcrouter.ScoreRequest{}, cold(), out)
	// LRU order now b, c, a: scores 1, 0.5, 0.
	for i, want := range []float64{0, 1, 0.5} {
		if math.Abs(out[i]-want) > 1e-6 {
			t.Fatalf("cold score[%d] = %v, want %v", i, out[i], want)
		}
	}
	warm := cold()
	warm[2].Hit = kvcrouter.Match{Blocks: 1}
	l.Score(&kvcrouter.ScoreRequest{}, warm, out)
	if math.Abs(out[0]-0.5) > 1e-6 || math.Abs(out[1]-0.5) > 1e-6 {
		t.Fatalf("warm scores %v, want 0.5 for every pod", out)
	}
}

// llm-d's active-request scorer: 1 for an idle pod, (max-count)/max for busy ones.
func TestLLMDActiveRequest(t *testing.T) {
	cfg := DefaultLLMDPrecise()
	cfg.PrefixWeight, cfg.QueueWeight, cfg.KVWeight, cfg.ActiveWeight = 0, 0, 0, 1
	l := mustLLMD(t, "llmd_precise+active", cfg, nil)
	c := []kvcrouter.Candidate{cand("a", 0, 4, [3]int{}, 10), cand("b", 1, 1, [3]int{}, 10), cand("c", 2, 0, [3]int{}, 10)}
	out := make([]float64, 3)
	l.Score(&kvcrouter.ScoreRequest{}, c, out)
	for i, want := range []float64{0, 0.75, 1} {
		if math.Abs(out[i]-want) > 1e-6 {
			t.Fatalf("active score[%d] = %v, want %v", i, out[i], want)
		}
	}
}
