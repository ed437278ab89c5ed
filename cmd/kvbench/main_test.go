package main

import (
	"bytes"
	stdjson "encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	json "github.com/goccy/go-json"

	"github.com/kvc-router/kvc-router/core/kvcrouter"
	"github.com/kvc-router/kvc-router/testbed/bench"
	"github.com/kvc-router/kvc-router/testbed/peers"
)

// writeTrace writes a conversation-like Mooncake trace: shared block 0 and
// conversations whose turns extend the previous turn's hash ids.
func writeTrace(t *testing.T, rows, convs int) string {
	t.Helper()
	var b strings.Builder
	next := int64(1)
	hist := make([][]int64, convs)
	for i := 0; i < rows; i++ {
		c := i % convs
		if hist[c] == nil {
			hist[c] = []int64{0}
		}
		hist[c] = append(hist[c], next)
		next++
		ids := hist[c]
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": %d, "hash_ids": %s}`+"\n",
			(i/3)*3000, 512*(len(ids)-1)+200, 16+i%40, strings.ReplaceAll(fmt.Sprint(ids), " ", ", "))
	}
	p := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestKvbenchEndToEnd(t *testing.T) {
	dir := t.TempDir()
	trace := writeTrace(t, 300, 30)
	jsonPath, csvPath, pngPath := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.csv"), filepath.Join(dir, "r.png")
	var out, errb bytes.Buffer
	args := []string{"--workload", "mooncake", "--trace", trace, "--engines", "3", "--gpu-blocks", "12000",
		"--rate-scale", "2", "--policies", "round_robin,verl_default,sglang_cache_aware,dynamo_cost,kvc_aware",
		"--seed", "3", "--json", jsonPath, "--csv", csvPath, "--plot", pngPath, "--quiet"}
	if code := run(args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var rep struct {
		Policies map[string]map[string]float64 `json:"policies"`
		Bounds   map[string]any                `json:"bounds"`
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	fields := []string{"hit_rate", "ttft_p50_s", "ttft_p99_s", "ttft_mean_s", "e2e_p99_s", "throughput_tok_s", "makespan_s", "imbalance", "decision_p99_us"}
	for _, p := range []string{"round_robin", "verl_default", "sglang_cache_aware", "dynamo_cost", "kvc_aware"} {
		s, ok := rep.Policies[p]
		if !ok {
			t.Fatalf("policy %s missing from JSON", p)
		}
		for _, f := range fields {
			if _, ok := s[f]; !ok {
				t.Fatalf("policies.%s.%s missing", p, f)
			}
		}
		if s["requests"] != 300 || s["throughput_tok_s"] <= 0 || s["imbalance"] < 1 {
			t.Fatalf("%s: implausible summary %v", p, s)
		}
	}
	for _, f := range []string{"oracle_hit_rate", "pooled_lru_hit_rate"} {
		if v, ok := rep.Bounds[f].(float64); !ok || v <= 0 || v > 1 {
			t.Fatalf("bounds.%s = %v", f, rep.Bounds[f])
		}
	}
	if v, ok := rep.Bounds["makespan_prefill_free_s"].(float64); !ok || v <= 0 {
		t.Fatalf("bounds.makespan_prefill_free_s = %v", rep.Bounds["makespan_prefill_free_s"])
	}
	if kv, rr := rep.Policies["kvc_aware"]["hit_rate"], rep.Policies["round_robin"]["hit_rate"]; !(kv > rr) {
		t.Fatalf("kvc_aware hit %.3f does not beat round_robin %.3f", kv, rr)
	}
	if !strings.Contains(out.String(), "kvc_aware") || !strings.Contains(out.String(), "oracle hit rate (upper bound)") ||
		!strings.Contains(out.String(), "a reference, not a bound") {
		t.Fatalf("table missing rows:\n%s", out.String())
	}
	csv, _ := os.ReadFile(csvPath)
	if n := strings.Count(string(csv), "\n"); n != 6 {
		t.Fatalf("csv has %d lines, want header + 5", n)
	}
	png, err := os.ReadFile(pngPath)
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG")) {
		t.Fatalf("plot is not a PNG (%v)", err)
	}
}

func TestKvbenchFlagErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--workload", "bogus"},
		{"--engines", "0"},
		{"--policies", "nope", "--workload", "grpo", "--steps", "1", "--grpo-prompts", "1", "--quiet"},
		{"--workload", "mooncake", "--trace", "/nonexistent/trace.jsonl", "--quiet"},
		{"--workload", "grpo", "--params", "dynamo_cost={bad"},
		{"--workload", "grpo", "--params", "noequals"},
		{"--workload", "grpo", "--arrival-spread", "-1"},
		{"--workload", "grpo", "--steps", "1", "--grpo-prompts", "1", "--quiet", "--params", `sglang_cache_aware={"balance_rel_threshold":0.2}`, "--policies", "sglang_cache_aware"},
		{"--heldout", "--workload", "grpo", "--tune-seeds", "1,2", "--report-seeds", "2,3", "--quiet"},
		{"--kvc-params", "{", "--workload", "grpo"},
		{"--kvc-turns", "many", "--workload", "grpo"},
		{"--response-max", "-1", "--workload", "grpo"},
		{"--response-max", "100", "--response-median", "192", "--workload", "grpo"},
		{"--prompt-sigma", "-0.1", "--workload", "grpo"},
		{"--system-tokens", "-2", "--workload", "grpo"},
		{"--sweep-policy", "kvc_aware_v2"},
		{"--v2-params", "{}"},
	} {
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code == 0 {
			t.Errorf("%v: exit 0, want failure", args)
		}
	}
}

func TestKvbenchSweepSmall(t *testing.T) {
	var out, errb bytes.Buffer
	args := []string{"--workload", "grpo", "--steps", "1", "--grpo-prompts", "4", "--grpo-n", "4", "--response-median", "40",
		"--engines", "2", "--gpu-blocks", "4000", "--sweep-alpha", "0.3,0.7", "--sweep-threshold", "0.9", "--sweep-seeds", "1,2", "--quiet"}
	if code := run(args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if strings.Count(out.String(), "\n") != 5 { // title, header, verl, 2 points
		t.Fatalf("unexpected sweep output:\n%s", out.String())
	}
}

func TestTraceResolution(t *testing.T) {
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatal(err)
	}
	// The shipped slice resolves from the repository root.
	p, err := resolveTrace(sliceTrace)
	if err != nil || p != filepath.Join(root, sliceTrace) {
		t.Fatalf("slice: %s %v", p, err)
	}
	// A missing default names the way out.
	_, err = resolveTrace("no/such/trace.jsonl")
	if err == nil || !strings.Contains(err.Error(), "--trace") || !strings.Contains(err.Error(), filepath.Join(root, "no/such/trace.jsonl")) {
		t.Fatalf("missing trace error %v", err)
	}
	var out, errb bytes.Buffer
	args := []string{"--workload", "mooncake", "--trace", sliceTrace, "--limit", "60", "--engines", "2", "--policies", "verl_default,kvc_aware", "--quiet"}
	if code := run(args, &out, &errb); code != 0 {
		t.Fatalf("slice run: exit %d: %s", code, errb.String())
	}
}

// tinyGRPO are flags for a seconds-long grpo run.
var tinyGRPO = []string{"--workload", "grpo", "--steps", "1", "--grpo-prompts", "4", "--grpo-n", "4", "--response-median", "40",
	"--engines", "2", "--gpu-blocks", "4000", "--quiet"}

func TestHeldoutSmall(t *testing.T) {
	var out, errb bytes.Buffer
	jsonPath := filepath.Join(t.TempDir(), "h.json")
	args := append(append([]string{}, tinyGRPO...), "--heldout", "--tune-seeds", "9", "--report-seeds", "1,2",
		"--policies", "verl_default,dynamo_cost+session,kvc_aware", "--json", jsonPath)
	if code := run(args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var doc struct {
		ReportSeeds []uint64 `json:"report_seeds"`
		Rows        []struct {
			Policy         string          `json:"policy"`
			Params         json.RawMessage `json:"params"`
			Tuned          bool            `json:"tuned"`
			DefaultIsTuned bool            `json:"default_is_tuned"`
			Makespan       struct {
				Mean, SD, CI95 float64
				N              int
			} `json:"makespan_s"`
			PerSeed []struct {
				Seed     uint64  `json:"seed"`
				Makespan float64 `json:"makespan_s"`
			} `json:"per_seed"`
		} `json:"rows"`
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	// verl_default once; each tuned policy twice (launcher defaults, then
	// tuned), or once when the tuning chose the launcher default.
	want := 1
	for _, r := range doc.Rows {
		if r.Policy != "verl_default" && !r.Tuned {
			want += 2
			if r.DefaultIsTuned {
				want--
			}
		}
	}
	if len(doc.Rows) != want || want < 3 || len(doc.ReportSeeds) != 2 {
		t.Fatalf("rows %d (want %d) seeds %v", len(doc.Rows), want, doc.ReportSeeds)
	}
	for i, r := range doc.Rows {
		// Per-seed values in report-seed order, their mean the row's.
		if len(r.PerSeed) != 2 || r.PerSeed[0].Seed != 1 || r.PerSeed[1].Seed != 2 ||
			math.Abs((r.PerSeed[0].Makespan+r.PerSeed[1].Makespan)/2-r.Makespan.Mean) > 1e-9 {
			t.Fatalf("%s: per_seed %+v, makespan mean %v", r.Policy, r.PerSeed, r.Makespan.Mean)
		}
		if r.Makespan.N != 2 || math.Abs(r.Makespan.CI95-12.706*r.Makespan.SD/math.Sqrt2) > 1e-9 {
			t.Fatalf("%s: makespan stat %+v, want N 2 and CI95 = t(0.975, 1) SD / sqrt 2", r.Policy, r.Makespan)
		}
		if i > 0 && doc.Rows[i-1].Policy == r.Policy && (doc.Rows[i-1].Tuned || !r.Tuned) {
			t.Fatalf("%s: the launcher-default row must come first, then the tuned one", r.Policy)
		}
		if r.Policy != "verl_default" && !r.Tuned && !r.DefaultIsTuned &&
			(i+1 >= len(doc.Rows) || doc.Rows[i+1].Policy != r.Policy) {
			t.Fatalf("%s: launcher-default row without its tuned row", r.Policy)
		}
		if !r.Tuned {
			continue
		}
		inGrid := false
		var got bytes.Buffer
		if r.Tuned {
			if err := stdjson.Compact(&got, r.Params); err != nil {
				t.Fatal(err)
			}
		}
		for _, g := range gridFor(r.Policy) {
			inGrid = inGrid || got.String() == g
		}
		if r.Policy == "verl_default" || !inGrid {
			t.Fatalf("%s: tuned %v params %s (not from its grid)", r.Policy, r.Tuned, r.Params)
		}
	}
	if !strings.Contains(out.String(), "| kvc_aware |") || !strings.Contains(out.String(), "prefill-free makespan") {
		t.Fatalf("table:\n%s", out.String())
	}
}

func TestSweepSpreadSmall(t *testing.T) {
	var out, errb bytes.Buffer
	args := append(append([]string{}, tinyGRPO...), "--sweep-spread", "0,0.3", "--sweep-seeds", "1,2", "--policies", "verl_default,sglang_cache_aware")
	if code := run(args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if n := strings.Count(out.String(), "\n| 0"); n != 4 { // 2 spreads x 2 policies
		t.Fatalf("%d rows:\n%s", n, out.String())
	}
}

// frozenStrategy is kvc_aware's every parameter at its default, with edit's
// keys replaced, as a freeze file's "strategy" object.
func frozenStrategy(t *testing.T, edit map[string]any) string {
	t.Helper()
	b, err := json.Marshal(kvcrouter.DefaultKVCAware())
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for k, v := range edit {
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	if b, err = json.Marshal(m); err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// --kvc-frozen: kvc_aware runs the frozen strategy, is not tuned, and its
// row records the commit; a bad frozen file is refused, and so is one that
// leaves a parameter out (a rerun would take today's default for it).
func TestHeldoutFrozenKVCAware(t *testing.T) {
	dir := t.TempDir()
	frozen := filepath.Join(dir, "frozen.json")
	if err := os.WriteFile(frozen, []byte(`{"commit":"abc123","status":"frozen","strategy":`+
		frozenStrategy(t, map[string]any{"alpha": 0.5})+`}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	jsonPath := filepath.Join(dir, "h.json")
	args := append(append([]string{}, tinyGRPO...), "--heldout", "--tune-seeds", "9", "--report-seeds", "1,2",
		"--policies", "verl_default,kvc_aware", "--kvc-frozen", frozen, "--json", jsonPath)
	if code := run(args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var doc struct {
		Rows []struct {
			Policy string          `json:"policy"`
			Params json.RawMessage `json:"params"`
			Tuned  bool            `json:"tuned"`
			Frozen string          `json:"frozen_commit"`
		} `json:"rows"`
		KVCFrozen map[string]string `json:"kvc_frozen"`
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Rows) != 2 || doc.Rows[1].Policy != "kvc_aware" || doc.Rows[1].Tuned || doc.Rows[1].Frozen != "abc123" ||
		!strings.Contains(strings.Join(strings.Fields(string(doc.Rows[1].Params)), ""), `"alpha":0.5`) || doc.KVCFrozen["commit"] != "abc123" {
		t.Fatalf("rows %+v frozen %v", doc.Rows, doc.KVCFrozen)
	}
	if !strings.Contains(out.String(), "frozen at abc123") {
		t.Fatalf("table:\n%s", out.String())
	}
	if err := os.WriteFile(frozen, []byte(`{"commit":"abc","strategy":{"alpha":7}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	errb.Reset()
	if code := run(append(append([]string{}, tinyGRPO...), "--kvc-frozen", frozen), &out, &errb); code == 0 ||
		!strings.Contains(errb.String(), "alpha") {
		t.Fatalf("bad frozen file accepted (exit %d): %s", code, errb.String())
	}
	partial := `{"commit":"abc","strategy":` + frozenStrategy(t, map[string]any{"group_spread_open_ratio": nil, "work_weight": nil}) + `}`
	if err := os.WriteFile(frozen, []byte(partial), 0o644); err != nil {
		t.Fatal(err)
	}
	errb.Reset()
	if code := run(append(append([]string{}, tinyGRPO...), "--kvc-frozen", frozen), &out, &errb); code == 0 ||
		!strings.Contains(errb.String(), "does not name group_spread_open_ratio, work_weight") {
		t.Fatalf("a freeze that leaves parameters out was accepted (exit %d): %s", code, errb.String())
	}
}

// Every tuning grid has four points, each one a valid parameter set for
// every policy tuned on it, and the first point is the launcher default
// (the held-out rows call a grid's first choice "launcher defaults").
func TestTuneGrids(t *testing.T) {
	for _, name := range bench.PolicyNames {
		g := gridFor(name)
		if g == nil {
			continue
		}
		if len(g) != 4 {
			t.Errorf("%s: %d grid points, want the common budget of 4", name, len(g))
		}
		for _, raw := range g {
			if _, err := bench.NewPolicy(name, bench.PolicyOptions{BlockSize: 16,
				Params: map[string]json.RawMessage{bench.BaseName(name): json.RawMessage(raw)}}); err != nil {
				t.Errorf("%s: grid point %s refused: %v", name, raw, err)
			}
		}
	}
	// The first point restates the variant's launcher default.
	def, agentic := peers.DefaultDynamo(), peers.AgenticDynamo()
	for name, want := range map[string]float64{"dynamo_cost": def.OverlapCredit, "dynamo_cost+ttl": def.OverlapCredit,
		"dynamo_cost+agentic": agentic.OverlapCredit} {
		var p struct {
			Credit float64 `json:"overlap_score_credit"`
		}
		if err := json.Unmarshal([]byte(gridFor(name)[0]), &p); err != nil || p.Credit != want {
			t.Errorf("%s: first grid point %s, want its default credit %v", name, gridFor(name)[0], want)
		}
	}
	var q struct {
		Threshold float64 `json:"router_queue_threshold"`
	}
	if err := json.Unmarshal([]byte(gridFor("dynamo_cost+queue")[0]), &q); err != nil || q.Threshold != peers.QueueDynamo().QueueThreshold {
		t.Errorf("dynamo_cost+queue: first grid point %s, want its default threshold %v", gridFor("dynamo_cost+queue")[0], peers.QueueDynamo().QueueThreshold)
	}
}

func TestTuneObjective(t *testing.T) {
	base := bench.Summary{Makespan: 100, TTFTP99: 10}
	s := bench.Summary{Makespan: 90, TTFTP99: 20}
	for _, tc := range []struct {
		kind string
		want float64
	}{{"step", 0.9}, {"mixed", (0.9 + 2) / 2}} {
		if got := objective(tc.kind, s, base); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("objective(%s) = %v, want %v", tc.kind, got, tc.want)
		}
	}
	var out, errb bytes.Buffer
	args := append(append([]string{}, tinyGRPO...), "--heldout", "--tune-seeds", "9", "--report-seeds", "1,2",
		"--policies", "verl_default,dynamo_cost", "--tune-objective", "ttft")
	if code := run(args, &out, &errb); code == 0 || !strings.Contains(errb.String(), "--tune-objective") {
		t.Fatalf("a bad --tune-objective was accepted (exit %d): %s", code, errb.String())
	}
}

// TestKvcAdmissionOverlay: --kvc-admission is decoded strictly and edits
// the +admit rows alone.
func TestKvcAdmissionOverlay(t *testing.T) {
	for _, c := range []struct {
		raw, err string
	}{
		{`{"engine_queue":1,"headroom":0.75}`, ""},
		{`{`, "not a JSON object"},
		{`[1]`, "not a JSON object"},
		{`{"bogus":1}`, `unknown field "bogus"`},
		{`{"enabled":true}`, "policy name's"},
		{`{"engine_queue":-1}`, "admission.engine_queue"},
		{`{"headroom":99}`, "admission.headroom"},
	} {
		edit, err := admissionOverlay(c.raw)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want one naming %q", c.raw, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", c.raw, err)
		}
		var on, off kvcrouter.RouterConfig
		on.Admission.Enabled = true
		edit(&on)
		edit(&off)
		if on.Admission.EngineQueue != 1 || on.Admission.Headroom != 0.75 || off.Admission != (kvcrouter.RouterConfig{}).Admission {
			t.Fatalf("edited +admit %+v, other rows %+v", on.Admission, off.Admission)
		}
	}
	var out, errb bytes.Buffer
	if code := run([]string{"--kvc-admission", `{"engine_queue":0.5}`, "--workload", "grpo"}, &out, &errb); code == 0 {
		t.Fatal("a fractional engine_queue was accepted")
	}
}

// TestResponseMaxIsWhatTheHookTells: --response-max caps the GRPO
// responses and is the response_tokens kvc_aware is told (verl's hook
// tells rollout.response_length).
func TestResponseMaxIsWhatTheHookTells(t *testing.T) {
	for _, c := range []struct {
		args []string
		want int
	}{
		{nil, 16384},
		{[]string{"--response-max", "2048", "--response-sigma", "0.9", "--prompt-sigma", "0.3", "--system-tokens", "0"}, 2048},
	} {
		out := filepath.Join(t.TempDir(), "r.json")
		args := append([]string{"--workload", "grpo_sat", "--steps", "1", "--grpo-prompts", "2", "--grpo-n", "2", "--engines", "2",
			"--response-median", "64", "--policies", "verl_default", "--quiet", "--makespan-bound=false", "--json", out}, c.args...)
		var so, se bytes.Buffer
		if code := run(args, &so, &se); code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, se.String())
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		var rep struct {
			Config map[string]any `json:"config"`
		}
		if err := json.Unmarshal(b, &rep); err != nil {
			t.Fatal(err)
		}
		if got := rep.Config["kvc_response_tokens"]; got != float64(c.want) {
			t.Fatalf("%v: kvc_response_tokens %v, want %d", c.args, got, c.want)
		}
	}
}

// A freeze whose library defaults run admission (verl's hook since
// admission.enabled became auto) runs it on the kvc_aware row: that row is
// kvc_aware+admit's seed for seed, and kvc_aware+noadmit is the routing
// alone (it differs on an oversubscribed step).
func TestFrozenAdmissionDefault(t *testing.T) {
	dir := t.TempDir()
	frozen := filepath.Join(dir, "frozen.json")
	doc := `{"commit":"abc123","status":"frozen","strategy":` + frozenStrategy(t, nil) +
		`,"library_defaults":{"router":{"admission":{"enabled":true}}}}`
	if err := os.WriteFile(frozen, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if f, err := readFrozen(frozen); err != nil || !f.admission {
		t.Fatalf("readFrozen: admission %v, %v", f.admission, err)
	}
	old := filepath.Join("..", "..", "docs", "results", "frozen-kvc-aware-f0be7ad.json")
	if f, err := readFrozen(old); err != nil || f.admission {
		t.Fatalf("a freeze from before auto runs admission: %v, %v", f.admission, err)
	}
	jsonPath := filepath.Join(dir, "h.json")
	args := []string{"--workload", "grpo", "--steps", "1", "--grpo-prompts", "16", "--grpo-n", "8", "--response-median", "60",
		"--engines", "2", "--max-num-seqs", "8", "--gpu-blocks", "4000", "--quiet",
		"--heldout", "--tune-seeds", "9", "--report-seeds", "1,2",
		"--policies", "verl_default,kvc_aware,kvc_aware+admit,kvc_aware+noadmit", "--kvc-frozen", frozen, "--json", jsonPath}
	var out, errb bytes.Buffer
	if code := run(args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var res struct {
		Rows []struct {
			Policy  string            `json:"policy"`
			PerSeed []json.RawMessage `json:"per_seed"`
		} `json:"rows"`
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Rows) != 4 || res.Rows[1].Policy != "kvc_aware" || res.Rows[3].Policy != "kvc_aware+noadmit" {
		t.Fatalf("rows %+v", res.Rows)
	}
	seeds := func(i int) string {
		var parts []string
		for _, p := range res.Rows[i].PerSeed {
			var m map[string]any
			_ = json.Unmarshal(p, &m)
			delete(m, "policy")
			parts = append(parts, fmt.Sprint(m["makespan_s"], m["ttft_p99_s"], m["hit_rate"]))
		}
		return strings.Join(parts, ";")
	}
	if seeds(1) != seeds(2) {
		t.Fatalf("kvc_aware under an admission freeze is not kvc_aware+admit:\n%s\n%s", seeds(1), seeds(2))
	}
	if seeds(3) == seeds(2) {
		t.Fatalf("kvc_aware+noadmit held requests too: %s", seeds(3))
	}
}

// A freeze runs the session_move_tokens its library defaults recorded, and
// a freeze from before the setting (none recorded) runs without it: on an
// agent step the two differ, on a GRPO step (no request id returns, so no
// session has a later turn to move) they are identical seed for seed.
func TestFrozenSessionMoveTokens(t *testing.T) {
	dir := t.TempDir()
	write := func(name, router string) string {
		p := filepath.Join(dir, name)
		doc := `{"commit":"abc123","status":"frozen","strategy":` + frozenStrategy(t, nil) +
			`,"library_defaults":{"router":` + router + `}}`
		if err := os.WriteFile(p, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	on, before := write("on.json", `{"session_move_tokens":3}`), write("before.json", `{}`)
	if f, err := readFrozen(on); err != nil || f.sessionMoveTokens != 3 {
		t.Fatalf("readFrozen: session_move_tokens %v, %v", f.sessionMoveTokens, err)
	}
	if f, err := readFrozen(before); err != nil || f.sessionMoveTokens != 0 {
		t.Fatalf("a freeze from before session_move_tokens moves by context: %v, %v", f.sessionMoveTokens, err)
	}
	row := func(frozen string, workload ...string) string {
		jsonPath := filepath.Join(dir, "r.json")
		args := append(workload, "--engines", "4", "--quiet", "--makespan-bound=false", "--seed", "1",
			"--policies", "kvc_aware", "--kvc-frozen", frozen, "--json", jsonPath)
		var out, errb bytes.Buffer
		if code := run(args, &out, &errb); code != 0 {
			t.Fatalf("exit %d: %s", code, errb.String())
		}
		b, err := os.ReadFile(jsonPath)
		if err != nil {
			t.Fatal(err)
		}
		var res struct {
			Policies map[string]struct {
				Makespan float64 `json:"makespan_s"`
				TTFTP99  float64 `json:"ttft_p99_s"`
				HitRate  float64 `json:"hit_rate"`
			} `json:"policies"`
		}
		if err := json.Unmarshal(b, &res); err != nil {
			t.Fatalf("report %s: %v", b, err)
		}
		k, ok := res.Policies["kvc_aware"]
		if !ok || k.Makespan <= 0 {
			t.Fatalf("no kvc_aware row in %s", b)
		}
		return fmt.Sprint(k)
	}
	agent := []string{"--workload", "agent", "--agent-tasks", "8", "--steps", "1", "--length-corr", "0.6",
		"--tool-pareto", "1,60,0.8", "--engine-model", "hbm"}
	if a, b := row(on, agent...), row(before, agent...); a == b {
		t.Fatalf("session_move_tokens 3 moved nothing on an agent step: %s", a)
	}
	grpo := []string{"--workload", "grpo", "--steps", "2", "--grpo-prompts", "16", "--grpo-n", "8", "--response-median", "60",
		"--max-num-seqs", "8", "--gpu-blocks", "4000"}
	if a, b := row(on, grpo...), row(before, grpo...); a != b {
		t.Fatalf("session_move_tokens changed a GRPO step:\n%s\n%s", a, b)
	}
}
