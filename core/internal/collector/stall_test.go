package collector

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/collector/internal/zmtp"
	"github.com/kvc-router/kvc-router/core/internal/hangguard"
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

	// The replay's own timeout is an hour: only the handshake bound can end it.
	var err error
	hangguard.MustReturn(t, "replay from a silent peer", func() {
		_, _, err = Replay(context.Background(), ep, 0, 10, time.Hour, 100*time.Millisecond, true, func(uint64, []byte) {})
	})
	if !errors.Is(err, zmtp.ErrProtocol) || !strings.Contains(err.Error(), "no ZMTP handshake") {
		t.Fatalf("replay from a silent peer: %v, want the handshake bound's ErrProtocol", err)
	}

	r := newRouter(t, "s")
	s := NewSubscriber(r, "s", Endpoint{Endpoint: ep, Replay: ep}, SubscriberConfig{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), RetryInterval: 50 * time.Millisecond,
		ReplayTimeout: 300 * time.Millisecond, DialTimeout: 100 * time.Millisecond,
	})
	s.Start()
	// Several dial attempts (each times out against the silent peer): wait
	// for them, not for a guessed duration.
	waitFor(t, "two dial attempts", 10*time.Second, func() bool { return s.Status().Dials >= 2 })
	hangguard.MustReturn(t, "Close on a stalled publisher", func() { _ = s.Close() })
	if st := s.Status(); st.Connected || st.Dials < 2 {
		t.Fatalf("%+v", st)
	}
}
