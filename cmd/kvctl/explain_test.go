package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvc-router/kvc-router/core/kvcrouter"
)

// kvctl explain prints every stage of the router's last decision from any
// of the documents an operator has: get_status()/kvr_status (the decision
// under "router") or the last_decision object alone.
func TestExplain(t *testing.T) {
	r, err := kvcrouter.NewRouter(kvcrouter.RouterConfig{Mode: kvcrouter.ModeKVCAware, Model: "m",
		Admission: kvcrouter.AdmissionSpec{Enabled: true, MaxInflight: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.AddServers([]string{"s0", "s1", "s2"}); err != nil {
		t.Fatal(err)
	}
	toks := make([]int32, 96)
	if _, err := r.Acquire(kvcrouter.Request{ID: "first", Tokens: toks, Pin: -1}); err != nil {
		t.Fatal(err)
	}
	d, err := r.Acquire(kvcrouter.Request{ID: "second", Tokens: toks, Pin: -1})
	if err != nil {
		t.Fatal(err)
	}
	st := r.Status()
	full, _ := json.Marshal(map[string]any{"router": st, "servers": map[string]int{}})
	only, _ := json.Marshal(st.LastDecision)
	for name, doc := range map[string]string{"status": string(full), "last_decision": string(only)} {
		code, out, errOut := runCmd(t, doc, "explain", "-")
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", name, code, errOut)
		}
		for _, want := range []string{
			`request "second", 96 prompt tokens, mode kvc_aware`,
			"1 candidates  s0 s1 s2",
			"rule new",
			"health: removed nothing",
			"room: removed s0 (full: 1 in flight, cap 1 (admission))",
			"4 scorers     kvc_aware",
			"cache", "session_load", "overload_penalty", "masked",
			"→",
			"5 pick        " + d.Server + " (the highest score; ties to the server added first)",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: output lacks %q:\n%s", name, want, out)
			}
		}
	}
	for _, tc := range []struct{ doc, want string }{
		{`{"router": {"last_decision": null}}`, "no decision yet"},
		{`{"servers": {}}`, "no decision found"},
		{`[1]`, "not a JSON object"},
	} {
		code, _, errOut := runCmd(t, tc.doc, "explain", "-")
		if code != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%s: exit %d, stderr %q; want 1 and %q", tc.doc, code, errOut, tc.want)
		}
	}
}
