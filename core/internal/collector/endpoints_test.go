package collector

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// Issue 20: SetEndpoints used to accept a garbage replay address, ids not in
// the pool (kept forever, never used) and 1,000 publishers for one server
// (1,002 goroutines). Each is refused with the entry at fault named.
func TestSetEndpointsValidates(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{"collectors":[{"name":"vllm_zmq","retry_ms":50}]}`))
	if err != nil {
		t.Fatal(err)
	}
	r := newRouter(t, "10.0.0.1:8000")
	m, err := Start(r, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	many := make([]Endpoint, MaxEndpointsPerServer+1)
	for i := range many {
		many[i] = Endpoint{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", 20000+i)}
	}
	cases := []struct {
		name   string
		server string
		eps    []Endpoint
		want   string
		is     error
	}{
		{"garbage replay", "10.0.0.1:8000", []Endpoint{{Endpoint: "tcp://127.0.0.1:5557", Replay: "\x00garbage"}}, "endpoints[0].replay:", ErrConfig},
		{"replay without port", "10.0.0.1:8000", []Endpoint{{Endpoint: "tcp://127.0.0.1:5557", Replay: "tcp://127.0.0.1"}}, "endpoints[0].replay: \"tcp://127.0.0.1\" needs host:port", ErrConfig},
		{"port out of range", "10.0.0.1:8000", []Endpoint{{Endpoint: "tcp://127.0.0.1:70000"}}, "port must be in [1, 65535]", ErrConfig},
		{"port zero", "10.0.0.1:8000", []Endpoint{{Endpoint: "tcp://h:0"}}, "port must be in [1, 65535]", ErrConfig},
		{"path on tcp", "10.0.0.1:8000", []Endpoint{{Endpoint: "tcp://h:1/x"}}, "a tcp endpoint has no path", ErrConfig},
		{"query", "10.0.0.1:8000", []Endpoint{{Endpoint: "tcp://h:1?x=1"}}, "no user, query or fragment", ErrConfig},
		{"empty ipc", "10.0.0.1:8000", []Endpoint{{Endpoint: "ipc://"}}, "needs a path", ErrConfig},
		{"scheme", "10.0.0.1:8000", []Endpoint{{Endpoint: "http://h:1"}}, "scheme must be tcp or ipc", ErrConfig},
		{"duplicate", "10.0.0.1:8000", []Endpoint{{Endpoint: "tcp://h:1"}, {Endpoint: "tcp://h:2"}, {Endpoint: "tcp://h:1"}}, "endpoints[2].endpoint: \"tcp://h:1\" is also endpoints[0]", ErrConfig},
		{"topic", "10.0.0.1:8000", []Endpoint{{Endpoint: "tcp://h:1", Topic: strings.Repeat("t", 5000)}}, "endpoints[0].topic: 5000 bytes", ErrConfig},
		{"too many", "10.0.0.1:8000", many, "endpoints: 65 endpoints, more than the limit of 64 per server", ErrConfig},
		{"not in the pool", "10.0.0.9:8000", []Endpoint{{Endpoint: "tcp://h:1"}}, `"10.0.0.9:8000"`, ErrUnknownServer},
	}
	g0 := runtime.NumGoroutine()
	for _, c := range cases {
		err := m.SetEndpoints(c.server, c.eps)
		if !errors.Is(err, c.is) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %v containing %q", c.name, err, c.is, c.want)
		}
	}
	m.events.(*EventsCollector).sync() // a sync pass, which would start subscribers for accepted lists
	if g := runtime.NumGoroutine(); g > g0+2 {
		t.Fatalf("goroutines %d -> %d after refused endpoint lists", g0, g)
	}
	if pubs := m.Status().Collectors[NameVLLMZMQ].([]PublisherStatus); len(pubs) != 0 {
		t.Fatalf("refused endpoints subscribed: %+v", pubs)
	}
	// The limit itself, ipc and bind-style hosts are fine.
	ok := append([]Endpoint{{Endpoint: "ipc:///tmp/kv.sock"}, {Endpoint: "tcp://*:5557", Replay: "tcp://*:5558"}}, many[:MaxEndpointsPerServer-2]...)
	if err := m.SetEndpoints("10.0.0.1:8000", ok); err != nil {
		t.Fatal(err)
	}
	// A configuration is held to the same rules.
	if _, err := ParseConfig([]byte(`{"collectors":[{"name":"vllm_zmq","endpoints":{"a":[{"endpoint":"tcp://h:1","replay":"junk"}]}}]}`)); err == nil ||
		!strings.Contains(err.Error(), `collectors[0].endpoints["a"][0].replay`) {
		t.Fatalf("config with a junk replay: %v", err)
	}
}
