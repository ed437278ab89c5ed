package collector

import (
	"net"
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/router"
)

// A server whose port refuses connections (a killed engine) is unhealthy
// after one scrape, not after UnhealthyAfter scrapes spaced by the backoff.
func TestPollerRefusedIsImmediatelyUnhealthy(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	r, err := router.New(router.Config{Mode: router.ModeKVCAware, Load: router.LoadSpec{UnhealthyAfter: 3}})
	if err != nil {
		t.Fatal(err)
	}
	_ = r.AddServers([]string{addr, "127.0.0.1:1"})
	p := NewPoller(r, PollerConfig{Interval: 50 * time.Millisecond, Timeout: time.Second, URLs: map[string]string{"127.0.0.1:1": "http://127.0.0.1:1/metrics"}})
	p.Start()
	defer p.Close()
	waitFor(t, "unhealthy", 10*time.Second, func() bool {
		return !r.Status().Servers[0].Load.Healthy
	})
	// One failed scrape made it unhealthy (the count, not a wall-clock
	// bound, which a loaded machine stretches).
	if st := p.Status(); len(st) != 2 || st[0].Failures != 1 || !st[0].Unhealthy {
		t.Fatalf("%+v", st)
	}
}
