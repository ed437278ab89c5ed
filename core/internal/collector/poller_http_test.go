package collector

import (
	"bytes"
	"fmt"
	"net"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/router"
)

// The poller over the scrape client (internal/scrape, which has its own
// tests of the HTTP reader): what a bad server does to a target's status.

// badHTTPServer answers every request on loopback with what reply returns.
type badHTTPServer struct {
	ln    net.Listener
	reply func() []byte
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func newBadHTTPServer(t *testing.T, reply func() []byte) *badHTTPServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &badHTTPServer{ln: ln, reply: reply}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go s.handle(c)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			_ = c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *badHTTPServer) handle(c net.Conn) {
	defer s.wg.Done()
	defer c.Close()
	var pending []byte
	buf := make([]byte, 4096)
	for {
		for bytes.Index(pending, []byte("\r\n\r\n")) < 0 {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			pending = append(pending, buf[:n]...)
		}
		pending = pending[bytes.Index(pending, []byte("\r\n\r\n"))+4:]
		if _, err := c.Write(s.reply()); err != nil {
			return
		}
	}
}

// TestPollerBadHTTP: a server speaking broken HTTP is counted malformed and
// unhealthy, and the poller recovers when it answers properly again.
func TestPollerBadHTTP(t *testing.T) {
	var bad atomic.Bool
	bad.Store(true)
	good := fmt.Sprintf(vllmText, 2)
	srv := newBadHTTPServer(t, func() []byte {
		if bad.Load() {
			return []byte("HTTP/1.1 200 OK\r\nContent-Length: zz\r\n\r\n")
		}
		return []byte(fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(good), good))
	})
	id := srv.ln.Addr().String()
	r, _ := router.New(router.Config{Load: router.LoadSpec{UnhealthyAfter: 1}})
	_ = r.AddServers([]string{id})
	p := NewPoller(r, PollerConfig{Interval: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond})
	p.Start()
	defer p.Close()
	waitFor(t, "malformed", 2*time.Second, func() bool { st := p.Status(); return len(st) == 1 && st[0].Malformed > 0 && st[0].Unhealthy })
	if e := p.Status()[0].LastError; !strings.Contains(e, "Content-Length \"zz\"") || !strings.Contains(e, id) {
		t.Fatalf("last error %q", e)
	}
	bad.Store(false)
	waitFor(t, "healthy", 2*time.Second, func() bool { return r.Status().Servers[0].Running == 3 && !p.Status()[0].Unhealthy })
}

// TestPollerHTTPSFallsBack: an https URL goes through net/http (TLS), never
// the plain scrape client; a configured Client is used for every URL.
func TestPollerHTTPSFallsBack(t *testing.T) {
	eng := &fakeEngine{}
	eng.mode.Store("ok")
	srv := httptest.NewTLSServer(eng)
	defer srv.Close()
	for _, custom := range []bool{false, true} {
		r, _ := router.New(router.Config{})
		_ = r.AddServers([]string{"tls"})
		cfg := PollerConfig{Interval: 10 * time.Millisecond, URLs: map[string]string{"tls": srv.URL + "/metrics"}}
		if custom {
			cfg.Client = srv.Client() // trusts the test certificate
		}
		p := NewPoller(r, cfg)
		p.Start()
		if custom {
			waitFor(t, "scraped over TLS", 2*time.Second, func() bool { return r.Status().Servers[0].Load.HasMetric })
		} else {
			// The default client does not trust the test certificate:
			// the error proves a TLS handshake was attempted.
			waitFor(t, "TLS error", 2*time.Second, func() bool {
				st := p.Status()
				return len(st) == 1 && strings.Contains(st[0].LastError, "certificate")
			})
		}
		_ = p.Close()
	}
}
