package collector

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/core/collector/internal/zmtp"
)

// silentPeer accepts TCP connections and never speaks ZMTP, as a stopped
// (SIGSTOP) engine process or another service on the port would.
func silentPeer(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return "tcp://" + l.Addr().String()
}

// A publisher that never completes the ZMTP handshake must not hang a
// replay, a subscriber, or the subscriber's Close (server removal, router
// close).
func TestStalledPublisherDoesNotHang(t *testing.T) {
	old := zmtp.HandshakeTimeout
	zmtp.HandshakeTimeout = 200 * time.Millisecond
	defer func() { zmtp.HandshakeTimeout = old }()

	ep := silentPeer(t)

	start := time.Now()
	_, _, err := Replay(context.Background(), ep, 0, 10, time.Second, 100*time.Millisecond, true, func(uint64, []byte) {})
	if err == nil {
		t.Fatal("replay from a silent peer succeeded")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("replay took %v", d)
	}

	r := newRouter(t, "s")
	s := NewSubscriber(r, "s", Endpoint{Endpoint: ep, Replay: ep}, SubscriberConfig{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), RetryInterval: 50 * time.Millisecond,
		ReplayTimeout: 300 * time.Millisecond, DialTimeout: 100 * time.Millisecond,
	})
	s.Start()
	time.Sleep(700 * time.Millisecond) // several dial attempts
	done := make(chan struct{})
	go func() { _ = s.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Fatal("Close blocked on a stalled publisher")
	}
	if st := s.Status(); st.Connected || st.Dials < 2 {
		t.Fatalf("%+v", st)
	}
}
