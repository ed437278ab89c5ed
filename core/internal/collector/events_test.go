package collector

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvc-router/kvc-router/core/internal/kvevents"
)

// testPublisher speaks vLLM's publisher protocol: PUB frames
// [topic, seq, payload] and a ROUTER replay endpoint.
type testPublisher struct {
	t       *testing.T
	ctx     context.Context
	cancel  context.CancelFunc
	pub     zmq4.Socket
	router  zmq4.Socket
	topic   string
	layout3 bool
	mu      sync.Mutex
	buf     map[uint64][]byte
	seq     uint64
}

func newTestPublisher(t *testing.T, replay bool, layout3 bool) *testPublisher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &testPublisher{t: t, ctx: ctx, cancel: cancel, topic: "kv@test", layout3: layout3, buf: map[uint64][]byte{}}
	p.pub = zmq4.NewPub(ctx)
	if err := p.pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if replay {
		p.router = zmq4.NewRouter(ctx)
		if err := p.router.Listen("tcp://127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		go p.serveReplay()
	}
	t.Cleanup(p.close)
	return p
}

func (p *testPublisher) close() {
	p.cancel()
	p.pub.Close()
	if p.router != nil {
		p.router.Close()
	}
}

func (p *testPublisher) endpoint() Endpoint {
	ep := Endpoint{Endpoint: "tcp://" + p.pub.Addr().String(), Topic: p.topic}
	if p.router != nil {
		ep.Replay = "tcp://" + p.router.Addr().String()
	}
	return ep
}

func be(v uint64) []byte { var b [8]byte; binary.BigEndian.PutUint64(b[:], v); return b[:] }

func (p *testPublisher) serveReplay() {
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
		p.mu.Unlock()
		for i := 0; i < len(seqs); i++ {
			for j := i + 1; j < len(seqs); j++ {
				if seqs[j] < seqs[i] {
					seqs[i], seqs[j] = seqs[j], seqs[i]
				}
			}
		}
		for _, s := range seqs {
			p.mu.Lock()
			payload := p.buf[s]
			p.mu.Unlock()
			if p.layout3 {
				_ = p.router.Send(zmq4.NewMsgFrom(id, []byte{}, []byte(p.topic), be(s), payload))
			} else {
				_ = p.router.Send(zmq4.NewMsgFrom(id, []byte{}, be(s), payload))
			}
		}
		if p.layout3 {
			_ = p.router.Send(zmq4.NewMsgFrom(id, []byte{}, []byte{}, be(endSeq), []byte{}))
		} else {
			_ = p.router.Send(zmq4.NewMsgFrom(id, []byte{}, be(endSeq), []byte{}))
		}
	}
}

// publish sends the next batch (or only buffers it when drop is true).
func (p *testPublisher) publish(b *kvevents.Batch, drop bool) uint64 {
	payload, err := kvevents.Encode(b, kvevents.LayoutArray)
	if err != nil {
		p.t.Fatal(err)
	}
	p.mu.Lock()
	s := p.seq
	p.seq++
	p.buf[s] = payload
	p.mu.Unlock()
	if !drop {
		if err := p.pub.Send(zmq4.NewMsgFrom([]byte(p.topic), be(s), payload)); err != nil {
			p.t.Fatal(err)
		}
	}
	return s
}

// restart makes the next batch carry seq 0 and forgets the buffer.
func (p *testPublisher) restart() {
	p.mu.Lock()
	p.seq = 0
	p.buf = map[uint64][]byte{}
	p.mu.Unlock()
}

func storeBatch(hashes []uint64, tokens []int32) *kvevents.Batch {
	return &kvevents.Batch{TS: 1, DPRank: 0, Events: []kvevents.Event{stored(hashes, nil, tokens, "GPU", "")}}
}

// connect publishes a no-op batch until the subscriber has seen one, which
// settles ZMQ's slow-joiner window.
func connect(t *testing.T, p *testPublisher, s *Subscriber) {
	t.Helper()
	waitFor(t, "subscriber to receive", 5*time.Second, func() bool {
		if s.Status().SeqSeen {
			return true
		}
		p.publish(&kvevents.Batch{TS: 1, DPRank: 0}, false)
		time.Sleep(20 * time.Millisecond)
		return false
	})
}

func fastCfg() SubscriberConfig {
	return SubscriberConfig{ReplayTimeout: time.Second, IdleRedial: 300 * time.Millisecond, RetryInterval: 50 * time.Millisecond, DialTimeout: 200 * time.Millisecond}
}

func TestSubscriberLiveAndReplay(t *testing.T) {
	for _, layout3 := range []bool{true, false} {
		t.Run(fmt.Sprintf("layout3=%v", layout3), func(t *testing.T) {
			pub := newTestPublisher(t, true, layout3)
			r := newRouter(t, "a", "b")
			s := NewSubscriber(r, "b", pub.endpoint(), fastCfg())
			s.Start()
			defer s.Close()
			connect(t, pub, s)

			p1, p2 := seq(48, 1), seq(48, 1000)
			pub.publish(storeBatch([]uint64{1, 2, 3}, p1), false)
			waitFor(t, "live event applied", 3*time.Second, func() bool { _, h := hit(t, r, append(p1, 0), ""); return h == 3 })

			// A dropped batch is recovered through replay on the next one.
			pub.publish(storeBatch([]uint64{4, 5, 6}, p2), true)
			pub.publish(&kvevents.Batch{TS: 2, DPRank: 0}, false)
			waitFor(t, "gap replayed", 3*time.Second, func() bool { _, h := hit(t, r, append(p2, 0), ""); return h == 3 })
			st := s.Status()
			if st.Gaps != 1 || st.Replays < 1 || st.ReplayFailed != 0 || !st.Connected {
				t.Fatalf("status %+v", st)
			}
		})
	}
}

// TestSubscriberGapWithoutReplayClears: a gap replay cannot close clears the
// server's index. After a weight sync (ResetCache) that clear is the
// subscriber's own, so the engine's late AllBlocksCleared that follows is
// still taken as the sync's reset (which keeps the router's placements
// since the sync).
func TestSubscriberGapWithoutReplayClears(t *testing.T) {
	for _, synced := range []bool{false, true} {
		t.Run(fmt.Sprintf("after a sync=%v", synced), func(t *testing.T) {
			pub := newTestPublisher(t, false, true)
			r := newRouter(t, "a", "b")
			s := NewSubscriber(r, "b", pub.endpoint(), fastCfg())
			s.Start()
			defer s.Close()
			connect(t, pub, s)
			resets := func() uint64 {
				for _, sv := range r.Status().Index.Servers {
					if sv.Name == "b" {
						return sv.ResetClears
					}
				}
				return 0
			}
			if synced {
				r.ResetCache()
			}
			p1 := seq(48, 1)
			pub.publish(storeBatch([]uint64{1, 2, 3}, p1), false)
			waitFor(t, "applied", 3*time.Second, func() bool { _, h := hit(t, r, append(p1, 0), ""); return h == 3 })
			pub.publish(&kvevents.Batch{TS: 2, DPRank: 0, Events: []kvevents.Event{{Kind: kvevents.KindRemoved, BlockHashes: []uint64{1}}}}, true)
			pub.publish(&kvevents.Batch{TS: 3, DPRank: 0}, false)
			// The lost removal cannot be replayed: the index is cleared, not trusted.
			waitFor(t, "cleared after gap", 3*time.Second, func() bool { _, h := hit(t, r, append(p1, 0), ""); return h == 0 })
			if st := s.Status(); st.Gaps != 1 || st.Events.Cleared != 1 || resets() != 0 {
				t.Fatalf("%+v, reset_clears %d", st, resets())
			}
			pub.publish(&kvevents.Batch{TS: 4, DPRank: 0, Events: []kvevents.Event{{Kind: kvevents.KindCleared}}}, false)
			want := uint64(0)
			if synced {
				want = 1
			}
			waitFor(t, "the engine's clear applied", 3*time.Second, func() bool { return s.Status().Events.Cleared == 2 })
			if n := resets(); n != want {
				t.Fatalf("the engine's clear taken as a sync's reset %d times, want %d", n, want)
			}
		})
	}
}

func TestSubscriberRestartClears(t *testing.T) {
	pub := newTestPublisher(t, true, true)
	r := newRouter(t, "a", "b")
	s := NewSubscriber(r, "b", pub.endpoint(), fastCfg())
	s.Start()
	defer s.Close()
	connect(t, pub, s)
	p1, p2 := seq(48, 1), seq(48, 5000)
	for i := 0; i < 3; i++ {
		pub.publish(&kvevents.Batch{TS: 1, DPRank: 0}, false)
	}
	pub.publish(storeBatch([]uint64{1, 2, 3}, p1), false)
	waitFor(t, "applied", 3*time.Second, func() bool { _, h := hit(t, r, append(p1, 0), ""); return h == 3 })
	pub.restart()
	pub.publish(storeBatch([]uint64{7, 8, 9}, p2), false)
	waitFor(t, "restart handled", 3*time.Second, func() bool {
		_, h1 := hit(t, r, append(p1, 0), "")
		_, h2 := hit(t, r, append(p2, 0), "")
		return h1 == 0 && h2 == 3
	})
	if st := s.Status(); st.Restarts != 1 {
		t.Fatalf("%+v", st)
	}
}

func TestSubscriberSurvivesBadInputAndDeadPublisher(t *testing.T) {
	pub := newTestPublisher(t, true, true)
	r := newRouter(t, "a", "b")
	s := NewSubscriber(r, "b", pub.endpoint(), fastCfg())
	s.Start()
	defer s.Close()
	connect(t, pub, s)
	// Malformed payload and malformed framing are counted.
	pub.mu.Lock()
	sq := pub.seq
	pub.seq++
	pub.mu.Unlock()
	_ = pub.pub.Send(zmq4.NewMsgFrom([]byte(pub.topic), be(sq), []byte{0xc1, 0xc1}))
	_ = pub.pub.Send(zmq4.NewMsgFrom([]byte(pub.topic), []byte{1, 2}))
	waitFor(t, "errors counted", 3*time.Second, func() bool {
		st := s.Status()
		return st.Events.DecodeErrors == 1 && st.BadFrames == 1
	})
	// Kill the publisher: the subscription shows disconnected.
	pub.close()
	waitFor(t, "disconnected", 5*time.Second, func() bool { return !s.Status().Connected })
	if st := s.Status(); st.Dials < 2 {
		t.Fatalf("no re-dial: %+v", st)
	}
}

func TestParseReplay(t *testing.T) {
	payload := []byte("p")
	cases := []struct {
		name   string
		frames [][]byte
		seq    uint64
		ok     bool
	}{
		{"3-frame with delimiter", [][]byte{{}, []byte("t"), be(5), payload}, 5, true},
		{"3-frame no delimiter", [][]byte{[]byte("t"), be(5), payload}, 5, true},
		{"2-frame with delimiter", [][]byte{{}, be(6), payload}, 6, true},
		{"2-frame no delimiter", [][]byte{be(6), payload}, 6, true},
		{"end marker >=0.26", [][]byte{{}, {}, be(endSeq), {}}, endSeq, true},
		{"end marker <=0.25", [][]byte{{}, be(endSeq), {}}, endSeq, true},
		{"short seq", [][]byte{{}, []byte{1}, payload}, 0, false},
		{"one frame", [][]byte{payload}, 0, false},
	}
	for _, c := range cases {
		seq, _, ok := parseReplay(c.frames)
		if ok != c.ok || (ok && seq != c.seq) {
			t.Errorf("%s: got %d %v", c.name, seq, ok)
		}
	}
}

func TestManagerConfig(t *testing.T) {
	cases := []struct{ json, want string }{
		{`{"collectors":[{"name":"magic"}]}`, "allowed"},
		{`{"collectors":[{"name":"vllm_metrics","interval_ms":-1}]}`, "interval_ms"},
		{`{"collectors":[{"name":"vllm_zmq","endpoints":{"a":[{"endpoint":"http://x:1"}]}}]}`, "scheme"},
		{`{"collectors":[{"name":"vllm_zmq","endpoints":{"a":[{"endpoint":"tcp://x"}]}}]}`, "host:port"},
		{`{"collectors":[{"name":"vllm_metrics","urls":{"a":"file:///etc/passwd"}}]}`, "http(s)"},
		{`{"collectors":[{"name":"vllm_metrics","bogus":1}]}`, "bogus"},
	}
	for _, c := range cases {
		if _, err := ParseConfig([]byte(c.json)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v", c.json, err)
		}
	}
	cfg, err := ParseConfig([]byte(`{"collectors":[{"name":"vllm_polling","interval_ms":20},{"name":"vllm_zmq"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	r := newRouter(t, "127.0.0.1:1")
	m, err := Start(r, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SetEndpoints("127.0.0.1:1", []Endpoint{{Endpoint: "tcp://*:2"}}); err != nil {
		t.Fatal(err)
	}
	// The subscription starts asynchronously: wait for it, not for a guess.
	waitFor(t, "the subscriber in status", 10*time.Second, func() bool {
		pubs, _ := m.Status().Collectors["vllm_zmq"].([]PublisherStatus)
		return len(pubs) == 1
	})
	st := m.Status()
	if _, ok := st.Collectors["vllm_polling"]; !ok {
		t.Fatalf("%+v", st)
	}
	pubs := st.Collectors["vllm_zmq"].([]PublisherStatus)
	if len(pubs) != 1 || pubs[0].Endpoint != "tcp://127.0.0.1:2" {
		t.Fatalf("bind-style endpoint not normalised: %+v", pubs)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
}
