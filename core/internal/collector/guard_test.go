package collector

import (
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/index"
	"github.com/kvc-router/kvc-router/core/internal/load"
	"github.com/kvc-router/kvc-router/core/internal/router"
	"github.com/kvc-router/kvc-router/core/internal/sink"
)

// panicky panics in the first n writes it is asked for: a stand-in for a
// decoder or index bug reached by network input.
type panicky struct {
	*router.Router
	n atomic.Int64
}

func (p *panicky) EventWriter(server string) (sink.EventWriter, bool) {
	w, ok := p.Router.EventWriter(server)
	if !ok {
		return w, ok
	}
	return panickyWriter{w, p}, true
}

type panickyWriter struct {
	sink.EventWriter
	p *panicky
}

func (w panickyWriter) Stored(tier index.Tier, hasParent bool, parent uint64, hashes []uint64, tokens []int32, bs int, lora string) error {
	if w.p.n.Add(-1) >= 0 {
		panic("injected: event writer")
	}
	return w.EventWriter.Stored(tier, hasParent, parent, hashes, tokens, bs, lora)
}

func (p *panicky) UpdateMetrics(server string, m load.Metrics) bool {
	if p.n.Add(-1) >= 0 {
		var nilMap map[string]int
		nilMap[server]++ // a runtime error, not only panic(string)
	}
	return p.Router.UpdateMetrics(server, m)
}

// Issue 20: a panic in a subscriber's goroutine is recovered, counted and
// shown as failed; the subscription restarts with backoff (its index
// cleared: the batch may have been half applied) and applies later batches.
func TestSubscriberSurvivesPanics(t *testing.T) {
	pub := newTestPublisher(t, false, true)
	r := newRouter(t, "a", "b")
	pr := &panicky{Router: r}
	s := NewSubscriber(pr, "b", pub.endpoint(), fastCfg())
	s.Start()
	defer s.Close()
	connect(t, pub, s)
	p0 := Panics()
	pr.n.Store(2) // two panics in a row: the second restart waits longer
	p1 := seq(48, 1)
	for i := 0; i < 2; i++ {
		// Published until one arrives (a restarted session resubscribes).
		waitFor(t, "panic recovered", 5*time.Second, func() bool {
			pub.publish(storeBatch([]uint64{uint64(10 + i)}, seq(16, int32(500+i))), false)
			time.Sleep(30 * time.Millisecond)
			return s.Status().Panics == uint64(i+1)
		})
	}
	st := s.Status()
	if !st.Failed || !strings.Contains(st.LastPanic, "injected: event writer") || Panics()-p0 != 2 {
		t.Fatalf("after two panics: %+v (process panics +%d)", st, Panics()-p0)
	}
	// Restarted: the next batch is applied and clears the failed mark.
	waitFor(t, "resubscribed", 5*time.Second, func() bool {
		pub.publish(storeBatch([]uint64{1, 2, 3}, p1), false)
		time.Sleep(30 * time.Millisecond)
		_, h := hit(t, r, append(p1, 0), "")
		return h == 3
	})
	if st := s.Status(); st.Failed || st.Panics != 2 || st.Dials < 3 {
		t.Fatalf("after recovery: %+v", st)
	}
}

func TestPanicBackoff(t *testing.T) {
	base := 50 * time.Millisecond
	for n, want := range map[int]time.Duration{1: base, 2: 2 * base, 3: 4 * base, 30: maxPanicBackoff} {
		if got := panicBackoff(base, n); got != want {
			t.Errorf("panicBackoff(%v, %d) = %v, want %v", base, n, got, want)
		}
	}
}

// A scrape that panics is a failed scrape: counted, failed in status, the
// target scheduled again (not stuck "running"), and the poller goes on.
func TestPollerSurvivesPanics(t *testing.T) {
	eng := &fakeEngine{}
	eng.mode.Store("ok")
	eng.running.Store(3)
	srv := httptest.NewServer(eng)
	defer srv.Close()
	id := strings.TrimPrefix(srv.URL, "http://")
	r, err := router.New(router.Config{Mode: router.ModeKVCAware, Load: router.LoadSpec{UnhealthyAfter: 5}})
	if err != nil {
		t.Fatal(err)
	}
	_ = r.AddServers([]string{id})
	pr := &panicky{Router: r}
	pr.n.Store(3)
	p0 := Panics()
	p := NewPoller(pr, PollerConfig{Interval: 10 * time.Millisecond, Timeout: 100 * time.Millisecond, BackoffMax: 40 * time.Millisecond})
	p.Start()
	defer p.Close()
	waitFor(t, "three panics", 3*time.Second, func() bool { st := p.Status(); return len(st) == 1 && st[0].Panics == 3 })
	st := p.Status()[0]
	if !st.Failed || !strings.Contains(st.LastError, "assignment to entry in nil map") || Panics()-p0 < 3 {
		t.Fatalf("after panics: %+v", st)
	}
	waitFor(t, "scraped after the panics", 3*time.Second, func() bool {
		s := r.Status().Servers[0]
		return s.Load.HasMetric && s.Running == 4
	})
	waitFor(t, "failed mark cleared", 3*time.Second, func() bool { return !p.Status()[0].Failed })
	if srv := r.Status().Servers[0]; !srv.Load.Healthy || srv.Load.Errors < 3 {
		t.Fatalf("server after recovery: %+v", srv.Load)
	}
}
