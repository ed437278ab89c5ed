package collector

import (
	"encoding/binary"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// endGate makes a replay endpoint hold its end markers: while closed is
// unset, a replay sends its batches and then waits before the end marker,
// so the subscriber applies them while its replay exchange is still open
// (on a loaded machine that window opens by itself for a moment).
type endGate struct {
	mu   sync.Mutex
	gate chan struct{} // nil: no hold
}

func (g *endGate) hold() {
	g.mu.Lock()
	g.gate = make(chan struct{})
	g.mu.Unlock()
}

func (g *endGate) release() {
	g.mu.Lock()
	if g.gate != nil {
		close(g.gate)
		g.gate = nil
	}
	g.mu.Unlock()
}

func (g *endGate) current() chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.gate
}

// serveReplayGated answers replay requests from p's buffer (reply layout 3)
// like testPublisher.serveReplay, with the end marker behind g.
func serveReplayGated(p *testPublisher, g *endGate) {
	for {
		m, err := p.router.Recv()
		if err != nil {
			return
		}
		if len(m.Frames) != 3 || len(m.Frames[2]) != 8 {
			continue
		}
		id, start := m.Frames[0], binary.BigEndian.Uint64(m.Frames[2])
		p.mu.Lock()
		var seqs []uint64
		for s := range p.buf {
			if s >= start {
				seqs = append(seqs, s)
			}
		}
		sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
		payloads := make([][]byte, len(seqs))
		for i, s := range seqs {
			payloads[i] = p.buf[s]
		}
		p.mu.Unlock()
		for i, s := range seqs {
			_ = p.router.Send(zmq4.NewMsgFrom(id, []byte{}, []byte(p.topic), be(s), payloads[i]))
		}
		if gate := g.current(); gate != nil {
			select {
			case <-gate:
			case <-p.ctx.Done():
				return
			}
		}
		_ = p.router.Send(zmq4.NewMsgFrom(id, []byte{}, []byte{}, be(endSeq), []byte{}))
	}
}

// A final batch lost from the live stream is recovered by the idle probe.
// Whoever sees its blocks in the index must also see the gap and the replay
// counted, as the start-up and live-gap paths already guarantee.
// TestSimEndToEndGapResetRestart read the status as soon as the index
// agreed with the engine and, under CPU load, found Gaps 0 and Replays 0:
// the probe counted only once the replay's end marker had arrived.
func TestSubscriberCountsTailReplayBeforeItShows(t *testing.T) {
	pub := newTestPublisher(t, false, true)
	pub.router = zmq4.NewRouter(pub.ctx) // closed by pub.close
	if err := pub.router.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	var g endGate
	defer g.release() // runs before pub.close (a t.Cleanup)
	go serveReplayGated(pub, &g)

	r := newRouter(t, "a", "b")
	cfg := fastCfg()
	cfg.ReplayTimeout = time.Minute // a held end marker must not time out first
	s := NewSubscriber(r, "b", pub.endpoint(), cfg)
	s.Start()
	defer s.Close()
	connect(t, pub, s)
	p1, p2 := seq(48, 1), seq(48, 7000)
	pub.publish(storeBatch([]uint64{1, 2, 3}, p1), false)
	waitFor(t, "live batch applied", 3*time.Second, func() bool { _, h := hit(t, r, append(p1, 0), ""); return h == 3 })
	before := s.Status()

	g.hold()
	pub.publish(storeBatch([]uint64{4, 5, 6}, p2), true) // lost live; then silence
	waitFor(t, "lost batch recovered by the idle probe", 10*time.Second, func() bool {
		_, h := hit(t, r, append(p2, 0), "")
		return h == 3
	})
	st := s.Status()
	g.release()
	if st.Gaps != before.Gaps+1 || st.Replays <= before.Replays {
		t.Fatalf("recovered blocks visible before the recovery was counted:\n before %+v\n now    %+v", before, st)
	}
	if st.ReplayFailed != 0 || st.Restarts != 0 || st.Events.Cleared != 0 {
		t.Fatalf("status %+v", st)
	}
	assertSingleCopies(t, r, "b", 6)
}
