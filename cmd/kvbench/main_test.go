package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	json "github.com/goccy/go-json"
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
		Bounds   map[string]float64            `json:"bounds"`
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
		if v, ok := rep.Bounds[f]; !ok || v <= 0 || v > 1 {
			t.Fatalf("bounds.%s = %v", f, v)
		}
	}
	if kv, rr := rep.Policies["kvc_aware"]["hit_rate"], rep.Policies["round_robin"]["hit_rate"]; !(kv > rr) {
		t.Fatalf("kvc_aware hit %.3f does not beat round_robin %.3f", kv, rr)
	}
	if !strings.Contains(out.String(), "kvc_aware") || !strings.Contains(out.String(), "bounds: oracle") {
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

func TestRepoRootFindsGoMod(t *testing.T) {
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatal(err)
	}
	p, _ := defaultTrace()
	if !strings.HasSuffix(p, filepath.Join("shared", "data", "mooncake", "conversation_trace.jsonl")) {
		t.Fatalf("default trace %s", p)
	}
}
