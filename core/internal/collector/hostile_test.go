package collector

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/hangguard"
	"github.com/kvc-router/kvc-router/core/internal/kvevents"
)

// hostilePeer completes a ZMTP 3.0 NULL handshake as sockType and then runs
// script on every accepted connection: a publisher or replay endpoint that
// speaks the protocol well enough to be trusted, then lies.
func hostilePeer(t *testing.T, sockType string, script func(c net.Conn)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				var g [64]byte
				g[0], g[9], g[10], g[32] = 0xff, 0x7f, 3, 1
				copy(g[12:], "NULL")
				if _, err := c.Write(g[:]); err != nil {
					return
				}
				if _, err := io.ReadFull(c, g[:]); err != nil {
					return
				}
				ready := append([]byte{5}, "READY"...)
				ready = append(append(ready, 11), "Socket-Type"...)
				ready = binary.BigEndian.AppendUint32(ready, uint32(len(sockType)))
				ready = append(ready, sockType...)
				if _, err := c.Write(append([]byte{0x04, byte(len(ready))}, ready...)); err != nil {
					return
				}
				var h [2]byte // the client's READY
				if _, err := io.ReadFull(c, h[:]); err != nil {
					return
				}
				if _, err := io.CopyN(io.Discard, c, int64(h[1])); err != nil {
					return
				}
				script(c)
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return "tcp://" + l.Addr().String()
}

// frameHeader is a long ZMTP frame header claiming size bytes.
func frameHeader(more bool, size uint64) []byte {
	flags := byte(0x02)
	if more {
		flags |= 0x01
	}
	return binary.BigEndian.AppendUint64([]byte{flags}, size)
}

// Hostile scripts, shared with the memory test below.
var hostileScripts = map[string]func(c net.Conn){
	// 2^50: go-zeromq's reader panicked in makeslice, in its own goroutine
	// (no recover reaches it): the whole process died.
	"2^50 header": func(c net.Conn) { _, _ = c.Write(frameHeader(false, 1<<50)) },
	// 400 MiB against a 1 MiB limit: go-zeromq read it all before the
	// collector could reject it.
	"400 MiB frame": func(c net.Conn) {
		if _, err := c.Write(frameHeader(false, 400<<20)); err != nil {
			return
		}
		chunk := make([]byte, 1<<20)
		for i := 0; i < 400; i++ {
			if _, err := c.Write(chunk); err != nil {
				return
			}
		}
	},
	// MORE-flagged frames without end: unbounded before.
	"endless MORE frames": func(c net.Conn) {
		f := append(frameHeader(true, 64<<10), make([]byte, 64<<10)...)
		for i := 0; i < 6400; i++ { // 400 MiB
			if _, err := c.Write(f); err != nil {
				return
			}
		}
	},
}

// Issue 29 rows 1 and 2: a publisher and a replay endpoint that complete the
// handshake and then send a frame header claiming 2^50 bytes, a 400 MiB
// frame (limit 1 MiB) or endless MORE frames neither crash the process nor
// make it hold more than the limit plus framing: each connection is
// dropped before the frame is allocated, counted, and re-dialled with a
// backoff; Close returns promptly.
func TestHostilePublisherBounded(t *testing.T) {
	for name, script := range hostileScripts {
		t.Run(name, func(t *testing.T) {
			pubEP := hostilePeer(t, "PUB", script)
			replayEP := hostilePeer(t, "ROUTER", script)
			r := newRouter(t, "s")
			s := NewSubscriber(r, "s", Endpoint{Endpoint: pubEP, Replay: replayEP}, SubscriberConfig{
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), RetryInterval: 20 * time.Millisecond,
				ReplayTimeout: 2 * time.Second, Limits: kvevents.Limits{MaxPayloadBytes: 1 << 20},
			})
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			s.Start()
			deadline := time.Now().Add(20 * time.Second)
			for s.Status().OversizedFrames < 3 {
				if time.Now().After(deadline) {
					t.Fatalf("no oversized frame counted: %+v", s.Status())
				}
				time.Sleep(10 * time.Millisecond)
			}
			runtime.ReadMemStats(&after)
			hangguard.MustReturn(t, "Close against a hostile peer", func() { _ = s.Close() })
			st := s.Status()
			// Three dropped connections (live, start-up replay) allocated
			// far less than one hostile frame: nothing was read past a
			// header.
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 64<<20 {
				t.Fatalf("allocated %d MiB against hostile peers with a 1 MiB limit: %+v", alloc>>20, st)
			}
			if st.Connected || st.Panics != 0 || st.Dials < 2 {
				t.Fatalf("%+v", st)
			}
		})
	}
}

// The standalone replay (kvctl watch --replay) ends with ErrFrameTooLarge.
func TestHostileReplayEndpoint(t *testing.T) {
	ep := hostilePeer(t, "ROUTER", hostileScripts["2^50 header"])
	ok, _, err := ReplayWith(context.Background(), ep, 0, 10, ReplayOptions{Timeout: 2 * time.Second, DialTimeout: time.Second,
		MaxPayloadBytes: 1 << 20}, func(uint64, []byte) { t.Fatal("batch from a hostile replay") })
	if ok || !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("ok=%v err=%v", ok, err)
	}
}

// Issue 29 row 11: go-zeromq slept its dial retry interval without
// watching its context, so closing a subscriber (server removal, router
// close, an endpoint update behind it) waited up to retry_ms. With an hour's
// retry against a refused port Close must return (within the hang guard,
// far inside the hour), as must an EventsCollector's endpoint update that
// replaces the subscription.
func TestCloseDuringRetryIsPrompt(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "tcp://" + l.Addr().String()
	l.Close()
	r := newRouter(t, "s")
	cfg := SubscriberConfig{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), RetryInterval: time.Hour}
	for i := 0; i < 3; i++ {
		s := NewSubscriber(r, "s", Endpoint{Endpoint: refused, Replay: refused}, cfg)
		s.Start()
		// The refused dial returns at once: from its count on, the
		// subscriber is in (or entering) its hour-long retry wait.
		waitFor(t, "a refused dial", 10*time.Second, func() bool { return s.Status().Dials >= 1 })
		hangguard.MustReturn(t, "Close in an hour-long retry wait", func() { _ = s.Close() })
		if st := s.Status(); st.Dials != 1 {
			t.Fatalf("%d dials with an hour's retry interval", st.Dials)
		}
	}
	ec := NewEventsCollector(r, cfg)
	ec.Start()
	defer ec.Close()
	ec.SetEndpoints("s", []Endpoint{{Endpoint: refused}})
	waitFor(t, "a refused dial", 10*time.Second, func() bool {
		pubs := ec.Status().([]PublisherStatus)
		return len(pubs) == 1 && pubs[0].Dials >= 1
	})
	// Replaces (closes) the first subscription.
	hangguard.MustReturn(t, "an endpoint update behind a retrying subscription", func() {
		ec.SetEndpoints("s", []Endpoint{{Endpoint: refused + "0"}})
	})
	if pubs := ec.Status().([]PublisherStatus); len(pubs) != 1 || pubs[0].Endpoint != refused+"0" {
		t.Fatalf("after the update: %+v", pubs)
	}
}
