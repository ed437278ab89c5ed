package scrape

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"testing"

	"github.com/kvc-router/kvc-router/core/internal/metrics"
)

// FuzzReadResponse feeds arbitrary bytes to the scrape client's response
// reader, whole and in small reads. It must never panic, never return a
// body over the limit, keep its buffer bounded by what it read and the
// limit, and give only the documented error kinds. A 200 response it
// accepts must also be accepted by net/http with the same body: the
// hand-written reader may be stricter than net/http, never looser.
func FuzzReadResponse(f *testing.F) {
	for _, tc := range respCases {
		if len(tc.raw) > 4096 {
			continue // the limit cases: covered by the table test, and they slow minimisation
		}
		f.Add([]byte(tc.raw), uint16(tc.limit), uint8(0))
	}
	f.Add([]byte(okHead+"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"), uint16(2), uint8(3))
	f.Add([]byte("HTTP/1.1 200 OK\r\n\r\n"), uint16(0), uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, limit16 uint16, split uint8) {
		limit := int(limit16)
		var rd io.Reader = bytes.NewReader(data)
		if split > 0 {
			rd = &smallReader{r: rd, n: int(split)}
		}
		start := make([]byte, 16)
		resp, err := readResponse(rd, start, limit)
		bound := 2*(len(data)+limit+maxChunkLine+maxHeaderBytes) + 4*minReadRoom
		if len(resp.buf) > bound {
			t.Fatalf("buffer grew to %d for %d input bytes, limit %d", len(resp.buf), len(data), limit)
		}
		if err != nil {
			if !errors.Is(err, ErrBadResponse) && !errors.Is(err, metrics.ErrTooLarge) &&
				!errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("undocumented error kind: %v", err)
			}
			return
		}
		if resp.status < 100 || resp.status > 599 {
			t.Fatalf("status %d accepted", resp.status)
		}
		if resp.status != 200 {
			return
		}
		if len(resp.body) > limit {
			t.Fatalf("body of %d bytes over limit %d", len(resp.body), limit)
		}
		// Differential check against net/http on the same bytes.
		req, _ := http.NewRequest(http.MethodGet, "http://x/metrics", nil)
		hr, herr := http.ReadResponse(bufio.NewReader(bytes.NewReader(data)), req)
		if herr != nil {
			t.Fatalf("accepted a response net/http rejects (%v): body %q", herr, resp.body)
		}
		hb, herr := io.ReadAll(hr.Body)
		if herr != nil {
			t.Fatalf("accepted a body net/http rejects (%v): body %q", herr, resp.body)
		}
		if hr.StatusCode != 200 || !bytes.Equal(hb, resp.body) {
			t.Fatalf("net/http reads %d %q, we read %q", hr.StatusCode, hb, resp.body)
		}
		if resp.keepAlive && hr.Close {
			t.Fatalf("keep-alive where net/http would close")
		}
	})
}

// smallReader returns at most n bytes per Read, like a slow socket.
type smallReader struct {
	r io.Reader
	n int
}

func (s *smallReader) Read(p []byte) (int, error) {
	if len(p) > s.n {
		p = p[:s.n]
	}
	return s.r.Read(p)
}
