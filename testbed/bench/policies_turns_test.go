package bench

import "testing"

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
