package main

import (
	"encoding/json"
	"strings"
	"testing"
)

func seqTokens(n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(i + 1)
	}
	return t
}

// kvctl explain --dry-run replays a scenario on a private router and
// explains the decision its request gets, stage by stage.
func TestExplainDryRun(t *testing.T) {
	// s1's metrics report 32-token blocks: its cached 64-token prompt is
	// two blocks there.
	metrics32 := "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} 0.0\n" +
		"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\"} 0.0\n" +
		"# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"32\",engine=\"0\",num_gpu_blocks=\"1000\"} 1.0\n"
	servers := []map[string]any{
		{"id": "s0", "inflight": 2},
		{"id": "s1", "metrics": metrics32, "cached": [][]int32{seqTokens(64)}},
		{"id": "s2"},
	}
	doc := func(sessions map[string]string, id string, tokens []int32) string {
		b, err := json.Marshal(map[string]any{"servers": servers, "sessions": sessions,
			"request": map[string]any{"id": id, "tokens": tokens}})
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for _, tc := range []struct {
		name string
		doc  string
		want []string
	}{
		{"new request: the cache wins", doc(nil, "r", seqTokens(70)), []string{
			"dry run: the scenario on a private router; nothing was routed",
			`request "r", 70 prompt tokens, mode kvc_aware`,
			"1 candidates  s0 s1 s2",
			"rule new",
			"health: removed nothing",
			"4 scorers     kvc_aware",
			"→      s1         0       0.000         0       2/0/0 of 2",
			"s0         2",
			"5 pick        s1 (the highest score; ties to the server added first)",
			"reason scored",
		}},
		{"bound request: the session stays", doc(map[string]string{"turn2": "s2"}, "turn2", seqTokens(70)), []string{
			"2 session     bound to s2; rule stay",
			"4 scorers     (not run: stay)",
			"5 pick        s2 (the bound server: the session stays)",
			"reason sticky",
		}},
		{"a config of the user's shape", `{"config": {"router": {"mode": "default"}}, "servers": [{"id": "a"}, {"id": "b", "inflight": 1}],
			"request": {"id": "x", "tokens": [1, 2, 3]}}`, []string{
			"mode default",
			"5 pick        a (",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCmd(t, tc.doc, "explain", "--dry-run", "-")
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			for _, want := range tc.want {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
		})
	}
	for _, tc := range []struct{ doc, want string }{
		{`{"servers": [{"id": "a"}], "request": {}, "extra": 1}`, `unknown field "extra"`},
		{`{"request": {"id": "x"}}`, "servers: at least one server is needed"},
		{`{"config": {"router": {"mode": "x"}}, "servers": [{"id": "a"}]}`, "config: router.mode"},
		{`{"servers": [{"id": "a"}], "sessions": {"s": "b"}}`, `sessions["s"]: "b" is not a server of the scenario`},
		{`{"servers": [{"id": "a", "metrics": "x 1", "flavor": "tgi"}]}`, `servers[0] (a): flavor "tgi"`},
		{`{"servers": [{"id": "a"}, {"id": "a"}]}`, `servers[1]: "a" is also servers[0]`},
		{`{"servers": [{"id": ""}]}`, "servers:"},
		{`{"config": {"router": {"max_prompt_tokens": 2}}, "servers": [{"id": "a"}], "request": {"tokens": [1, 2, 3]}}`,
			"refused before the pipeline ran"},
	} {
		code, _, errOut := runCmd(t, tc.doc, "explain", "--dry-run", "-")
		if code != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%s: exit %d, stderr %q; want 1 and %q", tc.doc, code, errOut, tc.want)
		}
	}
}
