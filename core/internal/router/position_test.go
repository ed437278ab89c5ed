package router

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// Position is every member's index in Servers() through random adds,
// re-adds and removals (the C ABI answers acquires with it).
func TestPositionFollowsThePool(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	r := mustNew(t, Config{})
	for step := 0; step < 500; step++ {
		id := fmt.Sprint("s", rng.IntN(12))
		if rng.IntN(3) == 0 {
			r.RemoveServers([]string{id})
		} else if err := r.AddServers([]string{id}); err != nil {
			t.Fatal(err)
		}
		pool := r.Servers()
		in := map[string]bool{}
		for i, s := range pool {
			in[s] = true
			if p := r.Position(s); p != i {
				t.Fatalf("step %d: Position(%s) = %d, Servers() has it at %d (%v)", step, s, p, i, pool)
			}
		}
		for k := 0; k < 12; k++ {
			if s := fmt.Sprint("s", k); !in[s] && r.Position(s) != -1 {
				t.Fatalf("step %d: Position(%s) = %d for a non-member", step, s, r.Position(s))
			}
		}
	}
}
