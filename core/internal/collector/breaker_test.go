package collector

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/clock"
	"github.com/kvc-router/kvc-router/core/internal/kvevents"
)

// Issue 29 row 12: every gapped batch from a publisher whose replay
// endpoint is silent blocked the subscription for replay_timeout_ms, with
// no breaker, so the subscriber fell behind without bound (seq 19 applied
// while the publisher was at 75). With the breaker, after a failed replay
// the endpoint is left alone for a backoff (gaps clear the index at once
// and the subscriber keeps up with the live stream), then asked again.
// The breaker's clock is a fake one, still unless the test advances it.
func TestReplayBreakerKeepsSubscriberCurrent(t *testing.T) {
	pub := newTestPublisher(t, false, true)
	ep := pub.endpoint()
	ep.Replay = silentPeer(t) // accepts TCP, never speaks ZMTP
	r := newRouter(t, "s")
	cfg := fastCfg()
	cfg.ReplayTimeout = 300 * time.Millisecond
	cfg.IdleRedial = time.Hour
	s := NewSubscriber(r, "s", ep, cfg)
	fc := clock.NewFake(time.Unix(1_700_000_000, 0))
	s.now = fc.Now
	s.Start()
	defer s.Close()
	connect(t, pub, s)

	// gaps publishes n gapped batches and waits until the subscriber has
	// applied the last; it returns the status counters' growth.
	gaps := func(n int) (gapped, failed, skipped uint64) {
		st0 := s.Status()
		var last uint64
		for i := 0; i < n; i++ {
			pub.publish(&kvevents.Batch{TS: 1}, true)
			last = pub.publish(&kvevents.Batch{TS: 1}, false)
		}
		waitFor(t, "subscriber caught up with the publisher", 20*time.Second, func() bool { return s.Status().LastSeq == last })
		st := s.Status()
		return st.Gaps - st0.Gaps, st.ReplayFailed - st0.ReplayFailed, st.ReplaySkipped - st0.ReplaySkipped
	}
	// The start-up probe's replay failed and opened the breaker (or, if
	// the probe was not tried, the first gap's does): at most one gap's
	// replay fails, the breaker skips the others; no gap blocks on the
	// silent peer.
	st := s.Status()
	g, f, k := gaps(24)
	if g != 24 || st.ReplayFailed+f > 1 || f+k != 24 || !s.Status().ReplayBreakerOpen {
		t.Fatalf("24 gaps: %d gapped, %d replays failed (%d before), %d skipped: %+v", g, f, st.ReplayFailed, k, s.Status())
	}
	// Past the backoff (at most maxReplayBackoff) the endpoint is asked
	// again; failing again it is left alone again.
	fc.Advance(maxReplayBackoff)
	if g, f, k = gaps(5); g != 5 || f != 1 || k != 4 {
		t.Fatalf("after the backoff, 5 gaps: %d gapped, %d replays failed, %d skipped: %+v", g, f, k, s.Status())
	}
}

// Issue 29 row 21: a panic in the replay reader was returned as a plain
// replay error; the subscription was not marked failed and nothing
// counted it. Now it ends the session through the panic path: counted
// (Panics, ReplayPanics), Failed set with the reader named, index cleared.
func TestReplayReaderPanicMarksFailed(t *testing.T) {
	pub := newTestPublisher(t, true, true)
	r := newRouter(t, "s")
	s := NewSubscriber(r, "s", pub.endpoint(), fastCfg())
	replayHook = func([][]byte) { panic("reader bug") }
	defer func() { replayHook = nil }()
	before := Panics()
	s.Start()
	defer s.Close()
	// The start-up replay reads a reply (the end marker) and panics.
	// The counters and Failed are set one after another: wait for all of
	// them (under load a status read fell between ReplayPanics and Failed).
	waitFor(t, "replay panic recorded", 5*time.Second, func() bool {
		st := s.Status()
		return st.ReplayPanics > 0 && st.Panics > 0 && st.Failed
	})
	st := s.Status()
	if !st.Failed || st.Panics == 0 || !strings.Contains(st.LastPanic, "replay reader") || Panics() <= before {
		t.Fatalf("%+v (process panics %d -> %d)", st, before, Panics())
	}
	if st.ReplayPanics != st.Panics {
		t.Fatalf("a replay panic counted twice or not at all: %+v", st)
	}
	_ = context.Background
}
