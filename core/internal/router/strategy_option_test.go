package router

import (
	"testing"

	"github.com/kvc-router/kvc-router/core/internal/strategy"
)

// lastServer always prefers the most recently added server.
type lastServer struct{ calls int }

func (*lastServer) Name() string { return "last_server" }

func (l *lastServer) Score(_ *strategy.Request, c []strategy.Candidate, out []float64) {
	l.calls++
	for i := range c {
		out[i] = float64(c[i].Order)
	}
}

func TestConfigStrategyBypassesRegistry(t *testing.T) {
	st := &lastServer{}
	// The named strategy does not exist: with Strategy set it is not built.
	cfg := Config{Mode: ModeKVCAware, Strategy: st, Strategies: []StrategySpec{{Name: "no_such_strategy", Weight: 1}}}
	r := mustNew(t, cfg, "a", "b", "c")
	for i := 0; i < 3; i++ {
		if got := acq(t, r, string(rune('x'+i)), 1, 2, 3); got != "c" {
			t.Fatalf("picked %s, want c from the given strategy", got)
		}
	}
	if st.calls != 3 {
		t.Fatalf("strategy scored %d times, want 3", st.calls)
	}
	if r.threshold != strategy.DefaultKVCAware().LoadThreshold {
		t.Fatalf("breakout threshold %v, want the kvc_aware default", r.threshold)
	}
	r2 := mustNew(t, Config{Mode: ModeKVCAware, Strategy: st, LoadThreshold: 0.5}, "a")
	if r2.threshold != 0.5 {
		t.Fatalf("breakout threshold %v, want the configured 0.5", r2.threshold)
	}
	// Without Strategy an unknown name is still a config error.
	if _, err := New(Config{Mode: ModeKVCAware, Strategies: []StrategySpec{{Name: "no_such_strategy", Weight: 1}}}); err == nil {
		t.Fatal("unknown strategy accepted")
	}
}
