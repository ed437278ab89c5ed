package collector

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/kvevents"
	"github.com/kvc-router/kvc-router/core/internal/router"
)

// ZMQ's slow joiner: a SUB socket receives nothing until its subscription
// has reached the publisher, so batches published right after the
// subscriber is created are dropped from the live stream but kept in the
// publisher's replay buffer. go-zeromq's PUB queues sends and writes them
// asynchronously, so whether a batch sent in that window reaches a new
// subscriber depends on timing; the tests therefore publish the window's
// batches to the replay buffer only (publish(b, true)), which is exactly
// what the subscriber experiences, and then fall silent, so no later live
// batch reveals a gap: only the start-up recovery brings those blocks back.

// startupBatch is batch i of a start-up burst: 3 blocks of its own prefix.
func startupBatch(i int) (*kvevents.Batch, []int32) {
	p := seq(48, int32(10000*(i+1)))
	h := uint64(1000 + 3*i)
	return storeBatch([]uint64{h, h + 1, h + 2}, p), p
}

// assertSingleCopies checks the index holds exactly want blocks for server,
// each once: a batch applied twice would show 2 copies.
func assertSingleCopies(t *testing.T, r *router.Router, server string, want int) {
	t.Helper()
	snap := r.Residency(server)
	if len(snap) != want {
		t.Fatalf("index holds %d blocks, want %d", len(snap), want)
	}
	for _, rc := range snap {
		if n := rc.Copies[0] + rc.Copies[1] + rc.Copies[2]; n != 1 {
			t.Fatalf("block %x has %d copies, want 1 (double apply)", rc.Engine, n)
		}
	}
}

func TestSubscriberRecoversStartupWindow(t *testing.T) {
	for _, layout3 := range []bool{true, false} {
		t.Run(fmt.Sprintf("layout3=%v", layout3), func(t *testing.T) {
			pub := newTestPublisher(t, true, layout3)
			r := newRouter(t, "a", "b")
			s := NewSubscriber(r, "b", pub.endpoint(), fastCfg())
			s.Start()
			defer s.Close()
			const n = 20
			var ps [][]int32
			for i := 0; i < n; i++ {
				b, p := startupBatch(i)
				pub.publish(b, true) // lost in the slow-joiner window
				ps = append(ps, p)
			}
			waitFor(t, "start-up batches recovered", 5*time.Second, func() bool {
				for _, p := range ps {
					if _, h := hit(t, r, append(p, 0), ""); h != 3 {
						return false
					}
				}
				return true
			})
			assertSingleCopies(t, r, "b", 3*n)
			st := s.Status()
			if st.LastSeq != n-1 || st.Restarts != 0 || st.Events.Cleared != 0 || st.StartupUnreplayed != 0 || st.Replays == 0 || st.ReplayFailed != 0 {
				t.Fatalf("status %+v", st)
			}
		})
	}
}

// A publisher that keeps publishing through the subscriber's start: the
// start-up replay and the live stream overlap, and every batch must be
// applied once, with no false engine-restart.
func TestSubscriberStartupReplayOverlapsLive(t *testing.T) {
	pub := newTestPublisher(t, true, true)
	r := newRouter(t, "a", "b")
	s := NewSubscriber(r, "b", pub.endpoint(), fastCfg())
	s.Start()
	defer s.Close()
	const n = 150
	var ps [][]int32
	for i := 0; i < n; i++ {
		b, p := startupBatch(i)
		pub.publish(b, false)
		ps = append(ps, p)
		time.Sleep(5 * time.Millisecond)
	}
	waitFor(t, "every batch applied", 5*time.Second, func() bool { return s.Status().LastSeq == n-1 })
	waitFor(t, "index complete", 5*time.Second, func() bool {
		for _, p := range ps {
			if _, h := hit(t, r, append(p, 0), ""); h != 3 {
				return false
			}
		}
		return true
	})
	assertSingleCopies(t, r, "b", 3*n)
	st := s.Status()
	if st.Restarts != 0 || st.Events.Cleared != 0 || st.StartupUnreplayed != 0 || st.ReplayFailed != 0 {
		t.Fatalf("status %+v", st)
	}
	t.Logf("replays %d, gaps %d, live duplicates skipped %d", st.Replays, st.Gaps, st.Duplicates)
}

// Without a replay endpoint the lost start-up window cannot be recovered,
// but it is counted, so users can see the index may be incomplete.
func TestSubscriberStartupWithoutReplayCounts(t *testing.T) {
	pub := newTestPublisher(t, false, true)
	r := newRouter(t, "a", "b")
	s := NewSubscriber(r, "b", pub.endpoint(), fastCfg())
	s.Start()
	defer s.Close()
	const n = 5
	for i := 0; i < n; i++ {
		b, _ := startupBatch(i)
		pub.publish(b, true) // lost in the slow-joiner window
	}
	connect(t, pub, s)
	st := s.Status()
	if st.StartupUnreplayed < n || st.Gaps != 0 || st.Events.Cleared != 0 {
		t.Fatalf("start-up loss not counted: %+v", st)
	}
	// Once following, a later batch is applied normally and the count stays.
	_, p := startupBatch(n)
	b, _ := startupBatch(n)
	pub.publish(b, false)
	waitFor(t, "live batch applied", 3*time.Second, func() bool { _, h := hit(t, r, append(p, 0), ""); return h == 3 })
	if got := s.Status().StartupUnreplayed; got != st.StartupUnreplayed {
		t.Fatalf("counter moved %d -> %d", st.StartupUnreplayed, got)
	}
}

// The overlap made deterministic: the start-up replay applies batches
// 0..k-1 from the real replay socket, then the same batches arrive live
// (the SUB socket queued them while the replay ran), then batch k. Each
// must be applied once, and the lower live seqs must not read as an engine
// restart. A different payload under a replayed seq still does.
func TestSubscriberStartupReplayDedupsLiveCopies(t *testing.T) {
	pub := newTestPublisher(t, true, true)
	r := newRouter(t, "a", "b")
	s := NewSubscriber(r, "b", pub.endpoint(), fastCfg())
	ctx := context.Background()
	const k = 6
	live := make([][][]byte, 0, k+1)
	for i := 0; i <= k; i++ {
		b, _ := startupBatch(i)
		sq := pub.publish(b, true)
		payload, err := kvevents.Encode(b, kvevents.LayoutArray)
		if err != nil {
			t.Fatal(err)
		}
		live = append(live, [][]byte{[]byte(pub.topic), be(sq), payload})
	}
	s.replayed, s.replayedMax = nil, 0 // as session does at connect
	s.probe(ctx)                       // start-up recovery: applies 0..k
	if st := s.Status(); st.LastSeq != k || st.Replays != 1 {
		t.Fatalf("start-up replay: %+v", st)
	}
	for _, m := range live {
		s.handle(ctx, m)
	}
	assertSingleCopies(t, r, "b", 3*(k+1))
	st := s.Status()
	if st.Duplicates != k+1 || st.Restarts != 0 || st.Events.Cleared != 0 || st.Events.Batches != k+1 {
		t.Fatalf("status %+v", st)
	}

	// A restarted publisher's batch 0 differs from the replayed one: after
	// dedup state is gone it is a restart, as before.
	b, _ := startupBatch(100)
	payload, _ := kvevents.Encode(b, kvevents.LayoutArray)
	s.handle(ctx, [][]byte{[]byte(pub.topic), be(0), payload})
	if st := s.Status(); st.Restarts != 1 || st.Events.Cleared != 1 {
		t.Fatalf("restart not detected: %+v", st)
	}
}
