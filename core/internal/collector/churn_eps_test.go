package collector

import (
	"fmt"
	"io"
	"log/slog"
	"testing"
)

// Issue 29 row 13: a removed server's endpoint list was never forgotten
// (~460 MiB per 1,000 churned ids at the maximum list size). After churn
// only pool members' endpoints remain; a configured server falls back to
// its configured list.
func TestRemovedServersEndpointsForgotten(t *testing.T) {
	r := newRouter(t, "cfg")
	e := NewEventsCollector(r, SubscriberConfig{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	e.setConfigured("cfg", []Endpoint{{Endpoint: "tcp://127.0.0.1:1"}})
	e.Start()
	defer e.Close()
	eps := make([]Endpoint, 8)
	for i := range eps {
		eps[i] = Endpoint{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", 2+i)}
	}
	for i := 0; i < 50; i++ {
		id := fmt.Sprintf("churn-%d", i)
		if err := r.AddServers([]string{id}); err != nil {
			t.Fatal(err)
		}
		e.SetEndpoints(id, eps)
		r.RemoveServers([]string{id})
		e.sync()
	}
	e.SetEndpoints("cfg", eps) // run-time override of a configured server
	r.RemoveServers([]string{"cfg"})
	e.sync()
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.eps) != 1 || len(e.eps["cfg"]) != 1 || len(e.members) != 0 {
		t.Fatalf("after churn: %d endpoint lists kept (cfg: %d), %d members", len(e.eps), len(e.eps["cfg"]), len(e.members))
	}
}
