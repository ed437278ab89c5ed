package scrape

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/metrics"
)

// rawServer is a loopback TCP server that answers every request (read up to
// its blank line) with the bytes reply returns. It counts accepted
// connections so tests can check keep-alive reuse.
type rawServer struct {
	ln       net.Listener
	accepted atomic.Int64
	requests atomic.Int64
	mu       sync.Mutex
	conns    []net.Conn
	wg       sync.WaitGroup
	lastReq  atomic.Value // string
	// reply gives the response to the n-th request (from 0) and whether to
	// close the connection after writing it.
	reply func(n int64) (resp []byte, closeAfter bool)
}

func newRawServer(t testing.TB, reply func(n int64) ([]byte, bool)) *rawServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &rawServer{ln: ln, reply: reply}
	s.wg.Add(1)
	go s.serve()
	t.Cleanup(s.close)
	return s
}

func (s *rawServer) url() string { return "http://" + s.ln.Addr().String() + "/metrics" }

func (s *rawServer) serve() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.accepted.Add(1)
		s.mu.Lock()
		s.conns = append(s.conns, c)
		s.mu.Unlock()
		s.wg.Add(1)
		go s.handle(c)
	}
}

func (s *rawServer) handle(c net.Conn) {
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
		i := bytes.Index(pending, []byte("\r\n\r\n"))
		s.lastReq.Store(string(pending[:i+4]))
		pending = pending[i+4:]
		resp, closeAfter := s.reply(s.requests.Add(1) - 1)
		if _, err := c.Write(resp); err != nil || closeAfter {
			return
		}
	}
}

func (s *rawServer) close() {
	_ = s.ln.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

const okHead = "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"

type respCase struct {
	name  string
	raw   string
	close bool // server closes after writing raw
	limit int
	body  string // wanted body when err is ""
	err   string // wanted error substring
	keep  bool   // wanted keep-alive (when err is "")
	is    error  // wanted errors.Is target, if any
}

var respCases = []respCase{
	{name: "content-length", raw: okHead + "Content-Length: 11\r\n\r\nhello world", body: "hello world", keep: true},
	{name: "content-length zero", raw: okHead + "Content-Length: 0\r\n\r\n", body: "", keep: true},
	{name: "header names any case", raw: "HTTP/1.1 200 OK\r\ncOnTeNt-LeNgTh:3\r\n\r\nabc", body: "abc", keep: true},
	{name: "status line without reason", raw: "HTTP/1.1 200\r\nContent-Length: 2\r\n\r\nok", body: "ok", keep: true},
	{name: "chunked", raw: okHead + "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", body: "hello world", keep: true},
	{name: "chunked uppercase hex", raw: okHead + "Transfer-Encoding: Chunked\r\n\r\nA\r\n0123456789\r\n0\r\n\r\n", body: "0123456789", keep: true},
	{name: "chunk extensions and trailers", raw: okHead + "Transfer-Encoding: chunked\r\n\r\n5;name=\"v\"\r\nhello\r\n1;x \r\n!\r\n2 \r\n!!\r\n0;last\r\nX-Trailer: 1\r\nY: 2\r\n\r\n", body: "hello!!!", keep: true},
	{name: "space before chunk extension", raw: okHead + "Transfer-Encoding: chunked\r\n\r\n1 ;x\r\n!\r\n0\r\n\r\n", err: "chunk-size line", is: ErrBadResponse},
	{name: "chunked framing bloat", raw: okHead + "Transfer-Encoding: chunked\r\n\r\n" + strings.Repeat("1;"+strings.Repeat("x", 1000)+"\r\n!\r\n", 20) + "0\r\n\r\n",
		err: "chunked framing much larger than its data", is: ErrBadResponse},
	{name: "chunked empty body", raw: okHead + "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", body: "", keep: true},
	{name: "connection close", raw: okHead + "Connection: close\r\nContent-Length: 2\r\n\r\nok", close: true, body: "ok", keep: false},
	{name: "connection keep-alive, close", raw: okHead + "Connection: keep-alive, Close\r\nContent-Length: 2\r\n\r\nok", close: true, body: "ok", keep: false},
	{name: "body to end of connection", raw: okHead + "\r\nuntil eof", close: true, body: "until eof", keep: false},
	{name: "http/1.0", raw: "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", close: true, body: "ok", keep: false},
	{name: "chunked wins over content-length", raw: okHead + "Content-Length: 99\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", body: "ok", keep: false},
	{name: "bytes after the response", raw: okHead + "Content-Length: 2\r\n\r\nokEXTRA", body: "ok", keep: false},
	{name: "identity encoding", raw: okHead + "Content-Encoding: identity\r\nContent-Length: 2\r\n\r\nok", body: "ok", keep: true},

	{name: "oversized content-length", raw: okHead + "Content-Length: 11\r\n\r\nhello world", limit: 10, err: "Content-Length 11 exceeds limit 10", is: metrics.ErrTooLarge},
	{name: "oversized chunked", raw: okHead + "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", limit: 10, err: "chunked body exceeds limit 10", is: metrics.ErrTooLarge},
	{name: "oversized until eof", raw: okHead + "\r\n" + strings.Repeat("x", 100), close: true, limit: 10, err: "more than 10 bytes", is: metrics.ErrTooLarge},
	{name: "truncated content-length body", raw: okHead + "Content-Length: 20\r\n\r\nonly ten b", close: true, err: "body truncated: connection closed after 10 of 20 bytes", is: ErrBadResponse},
	{name: "truncated chunk", raw: okHead + "Transfer-Encoding: chunked\r\n\r\n10\r\nshort", close: true, err: "connection closed in the chunk data", is: ErrBadResponse},
	{name: "truncated before last chunk", raw: okHead + "Transfer-Encoding: chunked\r\n\r\n2\r\nok\r\n", close: true, err: "connection closed in the chunk-size line", is: ErrBadResponse},
	{name: "truncated header", raw: okHead + "Content-Len", close: true, err: "connection closed in the header block", is: ErrBadResponse},
	{name: "garbage status line", raw: "SSH-2.0-OpenSSH_9.6\r\n\r\n", close: true, err: "status line \"SSH-2.0-OpenSSH_9.6\"", is: ErrBadResponse},
	{name: "html instead of http", raw: "<html><body>hi</body></html>\n", close: true, err: "connection closed in the header block", is: ErrBadResponse},
	{name: "bare LF status line", raw: "\n\r\n\r\n", close: true, err: "status line not terminated by CRLF", is: ErrBadResponse},
	{name: "status code out of range", raw: "HTTP/1.1 999 Odd\r\nContent-Length: 0\r\n\r\n", err: "status line", is: ErrBadResponse},
	{name: "301", raw: "HTTP/1.1 301 Moved Permanently\r\nLocation: http://elsewhere.example/metrics\r\nContent-Length: 0\r\n\r\n",
		err: "answered 301 Moved Permanently; redirects are not followed (Location: http://elsewhere.example/metrics)"},
	{name: "307", raw: "HTTP/1.1 307 Temporary Redirect\r\nLocation: /metrics/\r\nContent-Length: 0\r\n\r\n", err: "answered 307 Temporary Redirect; redirects are not followed"},
	{name: "404", raw: "HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\n\r\nnot found", err: "answered 404 Not Found"},
	{name: "500", raw: "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nboom", err: "answered 500 Internal Server Error"},
	{name: "header block too large", raw: okHead + "X-Pad: " + strings.Repeat("a", maxHeaderBytes) + "\r\nContent-Length: 2\r\n\r\nok", err: "header block larger than 65536 bytes", is: ErrBadResponse},
	{name: "endless header", raw: okHead + "X-Pad: " + strings.Repeat("a", 2*maxHeaderBytes), err: "header block larger than 65536 bytes", is: ErrBadResponse},
	{name: "gzip", raw: okHead + "Content-Encoding: gzip\r\nContent-Length: 2\r\n\r\n\x1f\x8b", err: "Content-Encoding \"gzip\"", is: ErrBadResponse},
	{name: "transfer-encoding gzip", raw: okHead + "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", err: "unsupported Transfer-Encoding", is: ErrBadResponse},
	{name: "conflicting content-length", raw: okHead + "Content-Length: 2\r\nContent-Length: 3\r\n\r\nabc", err: "conflicting Content-Length", is: ErrBadResponse},
	{name: "negative content-length", raw: okHead + "Content-Length: -1\r\n\r\n", err: "Content-Length \"-1\"", is: ErrBadResponse},
	{name: "bad chunk size", raw: okHead + "Transfer-Encoding: chunked\r\n\r\nzz\r\n", err: "chunk-size line \"zz\"", is: ErrBadResponse},
	{name: "huge chunk size", raw: okHead + "Transfer-Encoding: chunked\r\n\r\nfffffffffffffffffff\r\n", err: "chunk-size line", is: ErrBadResponse},
	{name: "chunk without CRLF", raw: okHead + "Transfer-Encoding: chunked\r\n\r\n2\r\nokXX0\r\n\r\n", err: "chunk data not followed by CRLF", is: ErrBadResponse},
	{name: "chunk-size line too long", raw: okHead + "Transfer-Encoding: chunked\r\n\r\n1;" + strings.Repeat("x", 2*maxChunkLine), err: "chunk-size line longer than", is: ErrBadResponse},
	{name: "folded header", raw: okHead + "X-A: 1\r\n  continued\r\nContent-Length: 0\r\n\r\n", err: "folded", is: ErrBadResponse},
	{name: "header without colon", raw: okHead + "Content-Length 2\r\n\r\nok", err: "header line without a name", is: ErrBadResponse},
	{name: "space before colon", raw: okHead + "Content-Length : 2\r\n\r\nok", err: "header name", is: ErrBadResponse},
	{name: "bad trailer", raw: okHead + "Transfer-Encoding: chunked\r\n\r\n0\r\nnot a trailer\r\n\r\n", err: "trailer line without a name", is: ErrBadResponse},
}

// TestReadResponseCases runs every case through the reader alone, whole and
// one byte per Read (every split point of the framing).
func TestReadResponseCases(t *testing.T) {
	for _, tc := range respCases {
		for _, split := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/split=%v", tc.name, split), func(t *testing.T) {
				if split && tc.name == "bytes after the response" {
					// Read a byte at a time, the extra bytes are never
					// seen: the next response on that connection would
					// fail on them instead.
					t.Skip("extra bytes are only seen when they arrive with the response")
				}
				var rd io.Reader = strings.NewReader(tc.raw)
				if split {
					rd = iotest.OneByteReader(rd)
				}
				limit := tc.limit
				if limit == 0 {
					limit = 1 << 20
				}
				resp, err := readResponse(rd, make([]byte, 64), limit)
				if err == nil && resp.status != 200 {
					err = statusError("http://x/metrics", resp)
				}
				checkResp(t, tc, resp.body, resp.keepAlive, err)
			})
		}
	}
}

func checkResp(t *testing.T, tc respCase, body []byte, keep bool, err error) {
	t.Helper()
	if tc.err != "" {
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Fatalf("error %v, want one containing %q", err, tc.err)
		}
		if tc.is != nil && !errors.Is(err, tc.is) {
			t.Fatalf("error %v does not wrap %v", err, tc.is)
		}
		return
	}
	if err != nil {
		t.Fatalf("unexpected error %v", err)
	}
	if string(body) != tc.body || keep != tc.keep {
		t.Fatalf("body %q keep-alive %v, want %q %v", body, keep, tc.body, tc.keep)
	}
}

// TestScrapeConnCases serves every case from a real loopback server; after
// the case, a well-formed response on the same client must succeed (on the
// kept connection when the case allowed keep-alive, else on a new one).
func TestScrapeConnCases(t *testing.T) {
	const good = okHead + "Content-Length: 4\r\n\r\ngood"
	for _, tc := range respCases {
		t.Run(tc.name, func(t *testing.T) {
			srv := newRawServer(t, func(n int64) ([]byte, bool) {
				if n == 0 {
					return []byte(tc.raw), tc.close
				}
				return []byte(good), false
			})
			limit := int64(tc.limit)
			sc, ok := New(srv.url(), 2*time.Second, limit)
			if !ok {
				t.Fatal("plain http URL not handled")
			}
			defer sc.Close()
			body, err := sc.Get(context.Background())
			checkResp(t, tc, body, sc.conn != nil, err)
			if err != nil && !strings.Contains(err.Error(), srv.url()) {
				t.Fatalf("error %q does not name the URL", err)
			}
			body, err = sc.Get(context.Background())
			if err != nil || string(body) != "good" {
				t.Fatalf("scrape after the case: %q, %v", body, err)
			}
			wantConns := int64(2)
			if tc.err == "" && tc.keep {
				wantConns = 1
			}
			if got := srv.accepted.Load(); got != wantConns {
				t.Fatalf("%d connections, want %d", got, wantConns)
			}
		})
	}
}

func TestScrapeConnRequestBytes(t *testing.T) {
	srv := newRawServer(t, func(int64) ([]byte, bool) { return []byte(okHead + "Content-Length: 0\r\n\r\n"), false })
	sc, _ := New(srv.url()+"?x=1", time.Second, 0)
	defer sc.Close()
	if _, err := sc.Get(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := "GET /metrics?x=1 HTTP/1.1\r\nHost: " + srv.ln.Addr().String() + "\r\nUser-Agent: kvc-router\r\n\r\n"
	if got := srv.lastReq.Load().(string); got != want {
		t.Fatalf("request %q, want %q", got, want)
	}
}

// TestScrapeConnKeepAlive: many scrapes, one connection; the server closing
// the connection between scrapes (silently, or announced by Connection:
// close) costs a reconnect, never a failed scrape.
func TestScrapeConnKeepAlive(t *testing.T) {
	const body = "vllm:num_requests_running 1\n"
	cl := fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(body), body)
	chunked := fmt.Sprintf("Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(body), body)
	for _, tc := range []struct {
		name      string
		resp      string
		closeEach bool
		wantConns int64
	}{
		{"content-length kept", okHead + cl, false, 1},
		{"chunked kept", okHead + chunked, false, 1},
		{"server closes silently", okHead + cl, true, 10},
		{"connection close", okHead + "Connection: close\r\n" + cl, true, 10},
		{"http/1.0", "HTTP/1.0 200 OK\r\n" + cl, false, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newRawServer(t, func(int64) ([]byte, bool) { return []byte(tc.resp), tc.closeEach })
			sc, _ := New(srv.url(), time.Second, 0)
			defer sc.Close()
			for i := 0; i < 10; i++ {
				got, err := sc.Get(context.Background())
				if err != nil || string(got) != body {
					t.Fatalf("scrape %d: %q, %v", i, got, err)
				}
				if tc.closeEach {
					// Let the close reach the client before the next
					// scrape, as between two polls.
					time.Sleep(5 * time.Millisecond)
				}
			}
			if got := srv.accepted.Load(); got != tc.wantConns {
				t.Fatalf("%d connections for 10 scrapes, want %d", got, tc.wantConns)
			}
			if got := srv.requests.Load(); got != 10 {
				t.Fatalf("%d requests for 10 scrapes", got)
			}
		})
	}
}

// TestScrapeConnDeadline: a server that never answers costs one timeout,
// reported as such, and no retry.
func TestScrapeConnDeadline(t *testing.T) {
	release := make(chan struct{})
	srv := newRawServer(t, func(n int64) ([]byte, bool) {
		if n == 0 {
			<-release
			return nil, true
		}
		return []byte(okHead + "Content-Length: 2\r\n\r\nok"), false
	})
	defer close(release)
	sc, _ := New(srv.url(), 100*time.Millisecond, 0)
	defer sc.Close()
	_, err := sc.Get(context.Background())
	if err == nil || !strings.Contains(err.Error(), "scrape deadline of 100ms exceeded waiting for the response") {
		t.Fatalf("error %v", err)
	}
	if n := srv.requests.Load(); n != 1 {
		t.Fatalf("%d requests: a timeout was retried", n)
	}
}

// TestScrapeConnSlowBody: headers arrive, the body never completes.
func TestScrapeConnSlowBody(t *testing.T) {
	srv := newRawServer(t, func(int64) ([]byte, bool) {
		return []byte(okHead + "Content-Length: 100\r\n\r\nonly a part"), false
	})
	sc, _ := New(srv.url(), 100*time.Millisecond, 0)
	defer sc.Close()
	_, err := sc.Get(context.Background())
	if err == nil || !strings.Contains(err.Error(), "scrape deadline of 100ms exceeded reading the response") {
		t.Fatalf("error %v", err)
	}
}

// TestScrapeConnCancel: cancelling the context aborts a scrape in flight
// well before its timeout.
func TestScrapeConnCancel(t *testing.T) {
	release := make(chan struct{})
	srv := newRawServer(t, func(n int64) ([]byte, bool) {
		if n == 0 {
			return []byte(okHead + "Content-Length: 2\r\n\r\nok"), false
		}
		<-release
		return nil, true
	})
	defer close(release)
	sc, _ := New(srv.url(), time.Hour, 0)
	defer sc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := sc.Get(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := sc.Get(ctx); done <- err }()
	for srv.requests.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("cancelled scrape succeeded")
	}
}

func TestScrapeConnRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := "http://" + ln.Addr().String() + "/metrics"
	_ = ln.Close()
	sc, _ := New(u, time.Second, 0)
	if _, err := sc.Get(context.Background()); err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("error %v, want connection refused", err)
	}
}

func TestNewScrapeConnFallsBack(t *testing.T) {
	for _, u := range []string{
		"https://127.0.0.1:1/metrics", "http://user:pw@127.0.0.1:1/metrics", "unix:///x", "http:///metrics", "not a url\x00",
	} {
		if _, ok := New(u, time.Second, 0); ok {
			t.Errorf("%q handled by Conn, want net/http", u)
		}
	}
	sc, ok := New("http://[::1]/metrics", time.Second, 0)
	if !ok || sc.addr != "[::1]:80" || !strings.Contains(string(sc.req), "\r\nHost: [::1]\r\n") {
		t.Fatalf("%+v", sc)
	}
}
