package bench

import (
	"strings"
	"testing"
)

// TestTurnsFor: kvc_aware is told what verl's hook would tell it for the
// workload (router "turns"): agent loops are multi-turn, GRPO is not, a
// chat trace is no verl rollout.
func TestTurnsFor(t *testing.T) {
	for _, tc := range []struct{ workload, want string }{
		{"agent", "multi"}, {"agent_scale", "multi"}, {"agent_long_few", "multi"},
		{"grpo", "single"}, {"grpo_sat", "single"}, {"mooncake", "auto"},
	} {
		if got := TurnsFor(tc.workload); got != tc.want {
			t.Errorf("TurnsFor(%q) = %q, want %q", tc.workload, got, tc.want)
		}
	}
	// The setting reaches kvc_aware's router configuration.
	p, err := NewPolicy("kvc_aware", PolicyOptions{Turns: "multi"})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Config(nil).Turns; got != "multi" {
		t.Fatalf("kvc_aware router turns %q, want multi", got)
	}
}

// TestAdmissionDefault: a freeze whose defaults run admission (verl's hook
// since admission.enabled became auto) runs it on every kvc_aware row but
// +noadmit; without one, only +admit rows hold requests.
func TestAdmissionDefault(t *testing.T) {
	for _, tc := range []struct {
		name     string
		freezeOn bool
		want     bool
	}{
		{"kvc_aware", false, false},
		{"kvc_aware", true, true},
		{"kvc_aware+admit", false, true},
		{"kvc_aware+admit", true, true},
		{"kvc_aware+noadmit", false, false},
		{"kvc_aware+noadmit", true, false},
		{"kvc_aware+lengths", true, true},
		{"kvc_aware_approx", true, true},
		{"kvc_aware_approx", false, false},
	} {
		// A multi-turn rollout keeps auto off; +admit still holds.
		multi, err := NewPolicy(tc.name, PolicyOptions{Admission: tc.freezeOn, Turns: "multi"})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := multi.Config(nil).Admission.Enabled, strings.Contains(tc.name, "+admit"); got != want {
			t.Errorf("%s, multi-turn (freeze admission %v): admission %v, want %v", tc.name, tc.freezeOn, got, want)
		}
		p, err := NewPolicy(tc.name, PolicyOptions{Admission: tc.freezeOn})
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Config(nil).Admission.Enabled; got != tc.want {
			t.Errorf("%s (freeze admission %v): admission %v, want %v", tc.name, tc.freezeOn, got, tc.want)
		}
	}
	noadmit, _ := NewPolicy("kvc_aware+noadmit", PolicyOptions{})
	plain, _ := NewPolicy("kvc_aware", PolicyOptions{})
	if !noadmit.OutputCounts || !noadmit.Events || noadmit.OutputCounts != plain.OutputCounts || noadmit.Events != plain.Events {
		t.Fatalf("kvc_aware+noadmit must see what kvc_aware sees: %+v vs %+v", noadmit, plain)
	}
}

// TestPeersNeverMoveSessions: peers run on kvc-router's index and sticky
// table, but its session moves (by bound counts, session_moves, or by
// in-flight context, session_move_tokens) are kvc_aware's own rules; a peer
// that keeps sessions (dynamo_cost+session) holds them where it put them,
// as upstream does. kvc_aware's rows keep today's default.
func TestPeersNeverMoveSessions(t *testing.T) {
	for _, name := range PolicyNames {
		p, err := NewPolicy(name, PolicyOptions{BlockSize: 16})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if p.Config == nil {
			continue
		}
		eff, err := p.Config(nil).Effective()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		moves := *eff.SessionMoves || *eff.SessionMoveTokens > 0
		if ours := strings.HasPrefix(name, "kvc_aware"); moves != ours {
			t.Errorf("%s: session moves %v (count rule %v, session_move_tokens %v), want %v",
				name, moves, *eff.SessionMoves, *eff.SessionMoveTokens, ours)
		}
	}
}
