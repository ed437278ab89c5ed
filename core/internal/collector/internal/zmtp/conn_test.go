package zmtp

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvc-router/kvc-router/core/internal/hangguard"
)

// peer is a raw ZMTP peer on loopback: it accepts one connection at a
// time, optionally completes the handshake as sockType, then runs script.
type peer struct {
	l     net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func newPeer(t *testing.T, sockType string, script func(c net.Conn)) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &peer{l: l}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, c)
			p.mu.Unlock()
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				if sockType != "" && !handshakeAs(c, sockType) {
					return
				}
				script(c)
			}()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return "tcp://" + l.Addr().String()
}

// handshakeAs plays the server side of a NULL handshake.
func handshakeAs(c net.Conn, sockType string) bool {
	var g [64]byte
	g[0], g[9], g[10] = 0xff, 0x7f, 3
	copy(g[12:], "NULL")
	g[32] = 1
	if _, err := c.Write(g[:]); err != nil {
		return false
	}
	if _, err := io.ReadFull(c, g[:]); err != nil {
		return false
	}
	ready := appendProperty(appendCommandName(nil, "READY"), "Socket-Type", sockType)
	if _, err := c.Write(append([]byte{flagCommand, byte(len(ready))}, ready...)); err != nil {
		return false
	}
	// The client's READY.
	var h [2]byte
	if _, err := io.ReadFull(c, h[:]); err != nil {
		return false
	}
	_, err := io.CopyN(io.Discard, c, int64(h[1]))
	return err == nil
}

func longHeader(flags byte, size uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{flags | flagLong}, size)
}

var testLimits = Limits{MaxFrame: 1 << 20, MaxMessage: 1<<20 + 4096, MaxFrames: 4}

func dialSub(t *testing.T, ep string) *Conn {
	t.Helper()
	c, err := Dial(context.Background(), ep, Options{Type: Sub, DialTimeout: time.Second, Limits: testLimits})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// allocDuring runs fn and returns the bytes it allocated (all goroutines).
func allocDuring(fn func()) uint64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	fn()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// Issue 29 rows 1 and 2: a frame header claiming 2^50 bytes, or a 400 MiB
// frame against a 1 MiB limit, ends the read with ErrTooLarge before
// anything of that size is allocated or read; endless MORE frames end at
// the message bounds. (go-zeromq panicked in makeslice on the first and
// read the second in full.)
func TestHostileFramesRejectedBeforeAllocation(t *testing.T) {
	huge := make([]byte, 1<<20) // streamed repeatedly: 400 MiB claimed
	for _, tc := range []struct {
		name   string
		script func(c net.Conn)
	}{
		{"2^50 header", func(c net.Conn) { _, _ = c.Write(longHeader(0, 1<<50)) }},
		{"2^64-1 header", func(c net.Conn) { _, _ = c.Write(longHeader(0, ^uint64(0))) }},
		{"400 MiB frame", func(c net.Conn) {
			if _, err := c.Write(longHeader(0, 400<<20)); err != nil {
				return
			}
			for i := 0; i < 400; i++ {
				if _, err := c.Write(huge); err != nil {
					return
				}
			}
		}},
		{"endless MORE frames", func(c net.Conn) {
			f := append([]byte{flagMore, 255}, make([]byte, 255)...)
			for {
				if _, err := c.Write(f); err != nil {
					return
				}
			}
		}},
		{"MORE frames over the message budget", func(c net.Conn) {
			f := append(longHeader(flagMore, 600<<10), make([]byte, 600<<10)...)
			for i := 0; i < 3; i++ {
				if _, err := c.Write(f); err != nil {
					return
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialSub(t, newPeer(t, "PUB", tc.script))
			var err error
			alloc := allocDuring(func() { _, err = c.ReadMsg(nil) })
			if !errors.Is(err, ErrTooLarge) {
				t.Fatalf("err = %v, want ErrTooLarge", err)
			}
			if alloc > 4<<20 {
				t.Fatalf("allocated %d bytes reading a hostile message (limit 1 MiB)", alloc)
			}
		})
	}
}

// Reserved flag bits, a command inside a multipart message and a garbage
// greeting are protocol errors, not crashes or hangs.
func TestProtocolViolations(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script func(c net.Conn)
	}{
		{"reserved flags", func(c net.Conn) { _, _ = c.Write([]byte{0x80, 1, 'x'}) }},
		{"command inside message", func(c net.Conn) {
			_, _ = c.Write([]byte{flagMore, 1, 'x', flagCommand, 5, 4, 'P', 'I', 'N', 'G'})
		}},
		{"command with MORE", func(c net.Conn) { _, _ = c.Write([]byte{flagCommand | flagMore, 0}) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialSub(t, newPeer(t, "PUB", tc.script))
			if _, err := c.ReadMsg(nil); !errors.Is(err, ErrProtocol) {
				t.Fatalf("err = %v, want ErrProtocol", err)
			}
		})
	}
	for _, tc := range []struct {
		name   string
		script func(c net.Conn)
	}{
		{"HTTP server", func(c net.Conn) {
			_, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\n\r\n" + string(make([]byte, 64))))
		}},
		{"wrong socket type", func(c net.Conn) { handshakeAs(c, "PULL") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Dial(context.Background(), newPeer(t, "", tc.script), Options{Type: Sub, DialTimeout: time.Second, Limits: testLimits})
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("err = %v, want ErrProtocol", err)
			}
		})
	}
}

// slowLoris is a peer that reads the dialer's greeting (the dial is in its
// handshake), then sends all but the last byte of a valid greeting, one
// byte per 100 ms, then waits for the connection to close. It reports on
// first when the first byte is out, and on sent how many it sent before
// the connection closed or it ran out.
func slowLoris(t *testing.T) (ep string, first <-chan struct{}, sent <-chan int) {
	firstc, sentc := make(chan struct{}), make(chan int, 1)
	ep = newPeer(t, "", func(c net.Conn) {
		var g [greetingLen]byte
		if _, err := io.ReadFull(c, g[:]); err != nil {
			sentc <- 0
			return
		}
		g = [greetingLen]byte{}
		g[0], g[9], g[10] = 0xff, 0x7f, 3
		copy(g[12:], "NULL")
		n := 0
		for ; n < len(g)-1; n++ {
			if _, err := c.Write(g[n : n+1]); err != nil {
				break
			}
			if n == 0 {
				close(firstc)
			}
			time.Sleep(100 * time.Millisecond)
		}
		sentc <- n
		_, _ = io.Copy(io.Discard, c)
	})
	return ep, firstc, sentc
}

// A slow-loris greeting cannot stretch the handshake past HandshakeTimeout:
// one deadline bounds the whole handshake (a per-read deadline would let
// it send its 63 bytes and wait), and the dial fails with ErrProtocol.
func TestSlowHandshakeBounded(t *testing.T) {
	old := HandshakeTimeout
	HandshakeTimeout = 300 * time.Millisecond
	defer func() { HandshakeTimeout = old }()
	ep, _, sent := slowLoris(t)
	var err error
	hangguard.MustReturn(t, "a dial to a slow loris", func() {
		_, err = Dial(context.Background(), ep, Options{Type: Sub, DialTimeout: time.Second, Limits: testLimits})
	})
	if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "no ZMTP handshake within") {
		t.Fatalf("slow-loris greeting: %v, want the handshake bound's ErrProtocol", err)
	}
	if n := <-sent; n >= greetingLen-1 {
		t.Fatalf("the slow loris sent its whole %d-byte greeting prefix before the dial gave up", n)
	}
}

// A cancelled context ends a dial in its handshake at once, whatever
// HandshakeTimeout says.
func TestCancelEndsHandshake(t *testing.T) {
	old := HandshakeTimeout
	HandshakeTimeout = time.Hour
	defer func() { HandshakeTimeout = old }()
	ep, first, _ := slowLoris(t)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-first; cancel() }()
	var err error
	hangguard.MustReturn(t, "a cancelled dial", func() {
		_, err = Dial(ctx, ep, Options{Type: Sub, DialTimeout: time.Second, Limits: testLimits})
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled dial: %v, want context.Canceled", err)
	}
}

// Cancelling the context closes the connection under a blocked read.
func TestCancelEndsBlockedRead(t *testing.T) {
	ep := newPeer(t, "PUB", func(c net.Conn) { _, _ = io.Copy(io.Discard, c) })
	ctx, cancel := context.WithCancel(context.Background())
	c, err := Dial(ctx, ep, Options{Type: Sub, DialTimeout: time.Second, Limits: testLimits})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.AfterFunc(100*time.Millisecond, cancel)
	done := make(chan error, 1)
	go func() { _, err := c.ReadMsg(nil); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("read after cancel returned a message")
		}
	case <-time.After(hangguard.Limit):
		t.Fatal("cancel did not end a blocked read")
	}
}

// PING is answered with PONG echoing its context (ZMTP 3.1 heartbeats).
func TestPingAnswered(t *testing.T) {
	pong := make(chan []byte, 1)
	ep := newPeer(t, "PUB", func(c net.Conn) {
		ping := append(appendCommandName(nil, "PING"), 0, 10, 'c', 't', 'x')
		_, _ = c.Write(append([]byte{flagCommand, byte(len(ping))}, ping...))
		var h [2]byte
		if _, err := io.ReadFull(c, h[:]); err != nil {
			return
		}
		b := make([]byte, h[1])
		_, _ = io.ReadFull(c, b)
		pong <- b
		_, _ = c.Write([]byte{0, 2, 'o', 'k'})
	})
	c := dialSub(t, ep)
	frames, err := c.ReadMsg(nil)
	if err != nil || len(frames) != 1 || string(frames[0]) != "ok" {
		t.Fatalf("frames %q err %v", frames, err)
	}
	if b := <-pong; string(b) != "\x04PONGctx" {
		t.Fatalf("pong %q", b)
	}
}

// Interop with a real ZMQ implementation (go-zeromq): SUB from a PUB with
// topic filtering by subscription, DEALER to a ROUTER; long frames both
// ways. tests/test_zmq_interop.py covers libzmq (pyzmq).
func TestInteropGoZeromq(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := zmq4.NewPub(ctx)
	defer pub.Close()
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	c := dialSub(t, "tcp://"+pub.Addr().String())
	if err := c.Subscribe("kv@"); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 300<<10)
	big[len(big)-1] = 7
	got := make(chan [][]byte, 1)
	go func() {
		f, err := c.ReadMsg(nil)
		if err != nil {
			t.Error(err)
		}
		got <- f
	}()
	deadline := time.After(10 * time.Second)
	for done := false; !done; {
		_ = pub.Send(zmq4.NewMsgFrom([]byte("other"), []byte("x")))
		_ = pub.Send(zmq4.NewMsgFrom([]byte("kv@a"), []byte{1, 2}, big))
		select {
		case f := <-got:
			if len(f) != 3 || string(f[0]) != "kv@a" || len(f[2]) != len(big) || f[2][len(big)-1] != 7 {
				t.Fatalf("got %d frames", len(f))
			}
			done = true
		case <-time.After(50 * time.Millisecond): // the subscription propagates
		case <-deadline:
			t.Fatal("no message from go-zeromq PUB")
		}
	}

	router := zmq4.NewRouter(ctx)
	defer router.Close()
	if err := router.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	go func() {
		m, err := router.Recv()
		if err != nil {
			return
		}
		_ = router.Send(zmq4.NewMsgFrom(m.Frames[0], []byte{}, []byte("reply"), big))
	}()
	d, err := Dial(ctx, "tcp://"+router.Addr().String(), Options{Type: Dealer, DialTimeout: time.Second, Limits: testLimits})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Send([]byte{}, big); err != nil {
		t.Fatal(err)
	}
	f, err := d.ReadMsg(nil)
	if err != nil || len(f) != 3 || len(f[0]) != 0 || string(f[1]) != "reply" || len(f[2]) != len(big) {
		t.Fatalf("dealer reply: %d frames, err %v", len(f), err)
	}
}
