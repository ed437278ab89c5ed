package collector

import (
	"net"
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/core/router"
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
	interval := 50 * time.Millisecond
	p := NewPoller(r, PollerConfig{Interval: interval, Timeout: time.Second, URLs: map[string]string{"127.0.0.1:1": "http://127.0.0.1:1/metrics"}})
	start := time.Now()
	p.Start()
	defer p.Close()
	waitFor(t, "unhealthy", 2*time.Second, func() bool {
		return !r.Status().Servers[0].Load.Healthy
	})
	if d := time.Since(start); d > 2*interval+100*time.Millisecond {
		t.Fatalf("unhealthy after %v, want within two intervals", d)
	}
	if st := p.Status(); len(st) != 2 || st[0].Failures != 1 || !st[0].Unhealthy {
		t.Fatalf("%+v", st)
	}
}
