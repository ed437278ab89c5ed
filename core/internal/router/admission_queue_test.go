package router

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/load"
)

// TestAdmissionEngineQueue: with admission.engine_queue, a server whose
// engine is queuing (its last fresh scrape counted waiting requests, plus
// those sent since, less those finished since, at least engine_queue) takes
// no held request even below its slot cap; the request waits in the router
// for whichever server frees first. Without it only the slot cap holds.
func TestAdmissionEngineQueue(t *testing.T) {
	type step struct {
		do     string // "scrape s waiting", "submit", "release s", "pump", "age"
		server string
		n      int
		// want: where the request (submit) or the admitted ones (release,
		// pump) went; "held" = submit held; "" = nothing admitted.
		want string
	}
	cases := []struct {
		name  string
		queue int
		steps []step
	}{
		{"off: the slot cap alone", 0, []step{
			{do: "scrape", server: "s0", n: 5}, {do: "scrape", server: "s1", n: 5},
			{do: "submit", want: "s0"}, {do: "submit", want: "s1"}, {do: "submit", want: "s0"}, {do: "submit", want: "s1"},
		}},
		{"a queuing engine takes nothing; the other does", 1, []step{
			{do: "submit", want: "s0"}, {do: "submit", want: "s1"},
			{do: "scrape", server: "s0", n: 1},
			{do: "submit", want: "s1"}, {do: "submit", want: "s1"},
		}},
		{"both queuing: held until a scrape shows a queue drained", 1, []step{
			{do: "submit", want: "s0"}, {do: "submit", want: "s1"},
			{do: "scrape", server: "s0", n: 1}, {do: "scrape", server: "s1", n: 2},
			{do: "submit", want: "held"}, {do: "pump", want: ""},
			{do: "scrape", server: "s1", n: 0}, {do: "pump", want: "s1"},
		}},
		{"a finish frees one queued request's room", 1, []step{
			{do: "submit", want: "s0"}, {do: "submit", want: "s1"},
			{do: "scrape", server: "s0", n: 1}, {do: "scrape", server: "s1", n: 1},
			{do: "submit", want: "held"}, {do: "submit", want: "held"},
			{do: "release", server: "s1", want: "s1"}, // 1 waiting - 1 finished: room for one
			{do: "release", server: "s0", want: "s0"},
			{do: "submit", want: "held"},
		}},
		{"requests sent since the scrape count", 3, []step{
			{do: "submit", want: "s0"}, {do: "submit", want: "s1"},
			{do: "scrape", server: "s0", n: 2}, {do: "scrape", server: "s1", n: 5},
			{do: "submit", want: "s0"}, // 2 waiting + 1 sent = 3: full
			{do: "submit", want: "held"},
		}},
		{"stale metrics say nothing", 1, []step{
			{do: "submit", want: "s0"}, {do: "submit", want: "s1"},
			{do: "scrape", server: "s0", n: 4}, {do: "scrape", server: "s1", n: 4},
			{do: "submit", want: "held"},
			{do: "age"}, {do: "pump", want: "s0"},
		}},
		{"a queue not of our requests never blocks an empty server", 1, []step{
			{do: "scrape", server: "s0", n: 9}, {do: "scrape", server: "s1", n: 9},
			{do: "submit", want: "s0"}, {do: "submit", want: "s1"}, {do: "submit", want: "held"},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clk := newClock()
			cfg := admitConfig(8)
			cfg.Admission.EngineQueue = c.queue
			cfg.Now = clk.now
			r := mustNew(t, cfg, "s0", "s1")
			next := uint64(0)
			for i, s := range c.steps {
				got := ""
				switch s.do {
				case "scrape":
					r.UpdateMetrics(s.server, load.Metrics{Running: 2, Waiting: float64(s.n), At: clk.t})
					continue
				case "age":
					clk.add(time.Minute)
					continue
				case "submit":
					next++
					// Distinct prompts: placement by load alone, ties to s0.
					d, queued, err := r.Submit(Request{ID: fmt.Sprint("r", next), Tokens: prompt(64, int32(1000*next)), Pin: -1}, next)
					if err != nil {
						t.Fatal(err)
					}
					got = d.Server
					if queued {
						got = "held"
					}
				case "release", "pump":
					var adm []Admitted
					if s.do == "release" {
						adm, _ = r.ReleaseAdmit(s.server, nil)
					} else {
						adm = r.Pump(nil)
					}
					for _, a := range adm {
						got += a.Decision.Server
					}
				}
				if got != s.want {
					t.Fatalf("step %d (%s %s): got %q, want %q", i, s.do, s.server, got, s.want)
				}
			}
		})
	}
}
