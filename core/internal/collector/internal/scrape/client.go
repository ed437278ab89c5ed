// Package scrape is the metrics poller's own HTTP/1.1 client for plain-http
// metrics endpoints. net/http and the goroutines, buffers, timers and header
// maps around it were ~60% of the poller's CPU (docs/performance.md
// section 4). A scrape is one fixed GET on one kept-alive connection per
// target, read by the target's worker goroutine itself straight into a
// reused buffer, and a response reader that only looks at the few headers
// framing the body. https and URLs with credentials stay on net/http.
package scrape

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/metrics"
)

// ErrBadResponse wraps every error about an HTTP response the scrape client
// cannot accept: a malformed status line or header, an unsupported
// transfer or content encoding, broken chunked framing, a truncated body,
// a header block over its limit. A status other than 200 is not one of
// them (the response is well formed, the server said no).
var ErrBadResponse = errors.New("metrics: bad HTTP response")

const (
	// maxHeaderBytes bounds the status line and header block, and the
	// trailer block of a chunked body (net/http allows 1 MiB; a metrics
	// endpoint sends a few hundred bytes).
	maxHeaderBytes = 64 << 10
	// maxChunkLine bounds one chunk-size line, extensions included.
	maxChunkLine = 4 << 10
	// minReadRoom is the least free space offered to one read; a vLLM
	// scrape (40-100 KiB) then takes a few reads.
	minReadRoom = 32 << 10
	// initialBuf holds a typical scrape with its header.
	initialBuf = 64 << 10
	// scrapeIdle closes a connection unused for this long rather than
	// reuse one the server has most likely dropped.
	scrapeIdle = 30 * time.Second
)

// Conn fetches one metrics URL over one kept-alive connection. It is
// used by a single goroutine (the target's worker).
type Conn struct {
	url     string // as configured, for errors
	addr    string // host:port dialed; nothing else ever is
	req     []byte // the complete request, built once
	timeout time.Duration
	limit   int
	conn    net.Conn
	stop    func() bool // unregisters the conn's context.AfterFunc
	lastUse time.Time
	buf     []byte // reused across scrapes; the returned body aliases it
	lastLen int    // the last body's length
}

// New prepares a client for rawURL, or returns ok=false when the
// URL needs net/http (https, credentials, anything but plain http).
func New(rawURL string, timeout time.Duration, limit int64) (*Conn, bool) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "http" || u.User != nil || u.Host == "" || u.Opaque != "" {
		return nil, false
	}
	host := u.Host
	addr := host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), "80")
		host = u.Hostname()
		if bytes.IndexByte([]byte(host), ':') >= 0 {
			host = "[" + host + "]"
		}
	}
	path := u.RequestURI()
	// url.Parse rejects control characters, but the request bytes are
	// written verbatim: refuse anything that could split them.
	for _, s := range []string{host, path} {
		for i := 0; i < len(s); i++ {
			if s[i] <= ' ' || s[i] == 0x7f {
				return nil, false
			}
		}
	}
	if limit <= 0 {
		limit = metrics.DefaultLimit
	}
	limit = min(limit, 1<<40) // an int on every platform the router runs on
	// No Accept header: vLLM then serves the classic text format. No
	// Accept-Encoding: the body comes uncompressed.
	req := "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: kvc-router\r\n\r\n"
	return &Conn{url: rawURL, addr: addr, req: []byte(req), timeout: timeout, limit: int(limit)}, true
}

// Close drops the connection; the next Get dials again.
func (s *Conn) Close() {
	if s.conn == nil {
		return
	}
	if s.stop != nil {
		s.stop()
		s.stop = nil
	}
	_ = s.conn.Close()
	s.conn = nil
}

// Get fetches the body of one scrape. The body aliases an internal buffer
// and is valid until the next Get. The whole scrape, dial and a possible
// retry included, is bounded by the timeout; cancelling ctx aborts it.
func (s *Conn) Get(ctx context.Context) ([]byte, error) {
	deadline := time.Now().Add(s.timeout)
	if s.conn != nil && time.Since(s.lastUse) > scrapeIdle {
		s.Close()
	}
	reused := s.conn != nil
	body, silent, err := s.roundTrip(ctx, deadline)
	if err != nil && reused && silent && ctx.Err() == nil {
		// The kept connection failed before any byte of a response: the
		// server most likely closed it while idle. GET is idempotent;
		// try once on a fresh connection, as net/http does.
		body, _, err = s.roundTrip(ctx, deadline)
	}
	return body, err
}

// roundTrip sends the request and reads one response. silent reports that
// the error came before any response byte arrived.
func (s *Conn) roundTrip(ctx context.Context, deadline time.Time) (body []byte, silent bool, err error) {
	if s.conn == nil {
		d := net.Dialer{Deadline: deadline}
		c, err := d.DialContext(ctx, "tcp", s.addr)
		if err != nil {
			return nil, false, s.wrapIOErr(err, "connecting")
		}
		s.conn = c
		// Close aborts a scrape in flight through the conn's deadline,
		// registered once per connection rather than once per scrape.
		s.stop = context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	}
	if err := s.conn.SetDeadline(deadline); err != nil {
		s.Close()
		return nil, true, fmt.Errorf("metrics: %s: %w", s.url, err)
	}
	// Checked after setting the deadline: a cancel from now on lands
	// after it and wins.
	if err := ctx.Err(); err != nil {
		s.Close()
		return nil, false, err
	}
	if _, err := s.conn.Write(s.req); err != nil {
		s.Close()
		return nil, !errors.Is(err, os.ErrDeadlineExceeded), s.wrapIOErr(err, "sending the request")
	}
	if s.buf == nil || (len(s.buf) > 1<<20 && s.lastLen < len(s.buf)/4) {
		// Do not pin a huge buffer for 64 targets after one large body.
		s.buf = make([]byte, initialBuf)
	}
	resp, err := readResponse(s.conn, s.buf, s.limit)
	s.buf = resp.buf
	if err != nil {
		s.Close()
		if resp.got == 0 && !errors.Is(err, ErrBadResponse) {
			silent := !errors.Is(err, os.ErrDeadlineExceeded)
			return nil, silent, s.wrapIOErr(err, "waiting for the response")
		}
		if errors.Is(err, ErrBadResponse) || errors.Is(err, metrics.ErrTooLarge) {
			return nil, false, fmt.Errorf("metrics: %s: %w", s.url, err)
		}
		return nil, false, s.wrapIOErr(err, "reading the response")
	}
	if !resp.keepAlive {
		s.Close()
	} else {
		s.lastUse = time.Now()
	}
	if resp.status != 200 {
		return nil, false, statusError(s.url, resp)
	}
	s.lastLen = len(resp.body)
	return resp.body, false, nil
}

func (s *Conn) wrapIOErr(err error, doing string) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("metrics: %s: scrape deadline of %v exceeded %s: %w", s.url, s.timeout, doing, err)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("metrics: %s: server closed the connection %s: %w", s.url, doing, err)
	}
	return fmt.Errorf("metrics: %s: %s: %w", s.url, doing, err)
}

func statusError(u string, r response) error {
	msg := fmt.Sprintf("metrics: %s answered %d %s", u, r.status, clipPrintable(r.reason, 80))
	if r.status >= 300 && r.status < 400 {
		msg += "; redirects are not followed"
		if r.location != "" {
			msg += " (Location: " + clipPrintable(r.location, 200) + ")"
		}
	}
	return errors.New(msg)
}

// clipPrintable shortens server-supplied text for an error message and
// replaces bytes outside printable ASCII.
func clipPrintable(s string, n int) string {
	b := []byte(s)
	if len(b) > n {
		b = append(b[:n:n], "..."...)
	}
	for i, c := range b {
		if c < ' ' || c > '~' {
			b[i] = '?'
		}
	}
	return string(b)
}

// response is what readResponse found. body aliases buf.
type response struct {
	status    int
	reason    string
	location  string
	body      []byte
	keepAlive bool
	// buf is the (possibly grown) buffer to keep for the next response.
	buf []byte
	// got counts the bytes read from the connection.
	got int
}

// respReader holds one response's bytes in buf: buf[:n] has been read,
// buf[r:n] is not yet consumed. Chunked bodies are decoded in place into
// buf[bs:w] (w <= r always: decoding only removes framing bytes).
type respReader struct {
	rd   io.Reader
	buf  []byte
	n, r int
	got  int
	eof  bool
}

func badResponse(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrBadResponse}, args...)...)
}

// more reads at least one byte into buf[n:], first moving the unconsumed
// bytes buf[r:n] down to keep (so a decoded body stays contiguous) and
// growing buf when less than minReadRoom is free and need (the bytes still
// expected, or minReadRoom when unknown) would not fit. It returns io.EOF (or
// the read error) when nothing more can come.
func (p *respReader) more(keep, need int) error {
	if p.eof {
		return io.ErrUnexpectedEOF
	}
	if keep < p.r {
		p.n = keep + copy(p.buf[keep:], p.buf[p.r:p.n])
		p.r = keep
	}
	if room := len(p.buf) - p.n; room < minReadRoom && room < need {
		nb := make([]byte, max(2*len(p.buf), p.n+minReadRoom))
		copy(nb, p.buf[:p.n])
		p.buf = nb
	}
	for empty := 0; ; empty++ {
		if empty == 100 {
			return io.ErrNoProgress // a Reader breaking its contract
		}
		k, err := p.rd.Read(p.buf[p.n:])
		p.n += k
		p.got += k
		if k > 0 {
			if err == io.EOF {
				p.eof = true
			}
			return nil
		}
		if err != nil {
			if err == io.EOF {
				p.eof = true
			}
			return err
		}
	}
}

// line returns the next CRLF-terminated line of buf[r:] (without CRLF),
// reading more as needed, and consumes it. keep is passed to more; maxLen
// bounds the line's length.
func (p *respReader) line(keep, maxLen int, what string) ([]byte, error) {
	from := p.r
	for {
		if i := bytes.IndexByte(p.buf[from:p.n], '\n'); i >= 0 {
			end := from + i
			if end == p.r || p.buf[end-1] != '\r' {
				return nil, badResponse("%s not terminated by CRLF", what)
			}
			l := p.buf[p.r : end-1]
			p.r = end + 1
			return l, nil
		}
		if p.n-p.r > maxLen {
			return nil, badResponse("%s longer than %d bytes", what, maxLen)
		}
		from = p.n
		start := p.r
		if err := p.more(keep, minReadRoom); err != nil {
			return nil, truncated(err, what)
		}
		from -= start - p.r // more may have moved the bytes down
	}
}

func truncated(err error, what string) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return badResponse("connection closed in the %s", what)
	}
	return err
}

// readResponse reads one HTTP/1.x response to a GET from rd into buf
// (grown as needed and returned in response.buf). A body longer than limit
// is metrics.ErrTooLarge; the header block (and a chunked body's trailers)
// may not exceed maxHeaderBytes. For a status other than 200 the body is
// not read and keepAlive is false. Bytes after the response also clear
// keepAlive: the connection is not trusted for another request.
func readResponse(rd io.Reader, buf []byte, limit int) (response, error) {
	p := respReader{rd: rd, buf: buf[:cap(buf)]}
	var resp response
	err := p.read(&resp, limit)
	resp.buf, resp.got = p.buf, p.got
	return resp, err
}

func (p *respReader) read(resp *response, limit int) error {
	// Header block: read until the blank line.
	hdrEnd, from := -1, 0
	for hdrEnd < 0 {
		// Search only what the last read added (and the 3 bytes before
		// it): a server dripping its header must not cost quadratic time.
		if i := bytes.Index(p.buf[from:p.n], []byte("\r\n\r\n")); i >= 0 {
			hdrEnd = from + i + 4
			break
		}
		from = max(0, p.n-3)
		if p.n > maxHeaderBytes {
			return badResponse("header block larger than %d bytes", maxHeaderBytes)
		}
		if err := p.more(0, minReadRoom); err != nil {
			if p.got == 0 {
				return err // nothing at all: the caller may retry
			}
			return truncated(err, "header block")
		}
	}
	if hdrEnd > maxHeaderBytes {
		return badResponse("header block larger than %d bytes", maxHeaderBytes)
	}
	hdr := p.buf[:hdrEnd-2]
	p.r = hdrEnd

	// Status line: HTTP/1.x SP 3DIGIT [SP reason].
	i := bytes.IndexByte(hdr, '\n')
	if i < 1 || hdr[i-1] != '\r' {
		return badResponse("status line not terminated by CRLF")
	}
	sl := hdr[:i-1]
	hdr = hdr[i+1:]
	if len(sl) < 12 || string(sl[:7]) != "HTTP/1." || (sl[7] != '0' && sl[7] != '1') || sl[8] != ' ' ||
		sl[9] < '1' || sl[9] > '5' || !isDigit(sl[10]) || !isDigit(sl[11]) || (len(sl) > 12 && sl[12] != ' ') {
		return badResponse("status line %q", clipPrintable(string(sl), 80))
	}
	http10 := sl[7] == '0'
	resp.status = int(sl[9]-'0')*100 + int(sl[10]-'0')*10 + int(sl[11]-'0')
	if len(sl) > 12 {
		resp.reason = string(sl[13:])
	}

	// Headers: only those framing the body matter.
	contentLen, chunked, closeConn, keepAliveHdr := -1, false, false, false
	for len(hdr) > 0 {
		j := bytes.IndexByte(hdr, '\n')
		if j < 1 || hdr[j-1] != '\r' {
			return badResponse("header line not terminated by CRLF")
		}
		ln := hdr[:j-1]
		hdr = hdr[j+1:]
		name, val, err := headerLine(ln, "header")
		if err != nil {
			return err
		}
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			v, ok := parseDecimal(val)
			if !ok {
				return badResponse("Content-Length %q", clipPrintable(string(val), 40))
			}
			if contentLen >= 0 && contentLen != v {
				return badResponse("conflicting Content-Length headers")
			}
			contentLen = v
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			if !bytes.EqualFold(val, []byte("chunked")) || chunked {
				return badResponse("unsupported Transfer-Encoding %q", clipPrintable(string(val), 40))
			}
			chunked = true
		case bytes.EqualFold(name, []byte("Connection")):
			for _, tok := range bytes.Split(val, []byte(",")) {
				tok = bytes.Trim(tok, " \t")
				closeConn = closeConn || bytes.EqualFold(tok, []byte("close"))
				keepAliveHdr = keepAliveHdr || bytes.EqualFold(tok, []byte("keep-alive"))
			}
		case bytes.EqualFold(name, []byte("Content-Encoding")):
			if len(val) > 0 && !bytes.EqualFold(val, []byte("identity")) {
				return badResponse("Content-Encoding %q (the scrape asks for none)", clipPrintable(string(val), 40))
			}
		case bytes.EqualFold(name, []byte("Location")):
			resp.location = string(val)
		}
	}
	if resp.status != 200 {
		return nil // not read: the caller reports the status and drops the connection
	}
	if chunked && http10 {
		// RFC 9112 6.1: such framing is faulty.
		return badResponse("Transfer-Encoding in an HTTP/1.0 response")
	}
	resp.keepAlive = !closeConn && (!http10 || keepAliveHdr)
	if chunked && contentLen >= 0 {
		// RFC 9112 6.3: Transfer-Encoding wins, and the connection must
		// not be reused.
		contentLen, resp.keepAlive = -1, false
	}
	var err error
	switch {
	case chunked:
		resp.body, err = p.chunked(limit)
	case contentLen >= 0:
		resp.body, err = p.sized(contentLen, limit)
	default:
		// Neither: the body runs to the end of the connection.
		resp.keepAlive = false
		resp.body, err = p.untilEOF(limit)
	}
	if err != nil {
		return err
	}
	if p.r != p.n {
		resp.keepAlive = false // bytes after the response
	}
	return nil
}

func (p *respReader) sized(n, limit int) ([]byte, error) {
	if n > limit {
		return nil, fmt.Errorf("%w: Content-Length %d exceeds limit %d", metrics.ErrTooLarge, n, limit)
	}
	start := p.r
	if len(p.buf) < start+n {
		nb := make([]byte, start+n+minReadRoom)
		copy(nb, p.buf[:p.n])
		p.buf = nb
	}
	for p.n-start < n {
		if err := p.more(start, n-(p.n-start)); err != nil {
			return nil, truncatedBody(err, p.n-start, n)
		}
	}
	p.r = start + n
	return p.buf[start : start+n], nil
}

func truncatedBody(err error, got, want int) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return badResponse("body truncated: connection closed after %d of %d bytes", got, want)
	}
	return err
}

func (p *respReader) untilEOF(limit int) ([]byte, error) {
	start := p.r
	for !p.eof {
		if p.n-start > limit {
			return nil, fmt.Errorf("%w: more than %d bytes", metrics.ErrTooLarge, limit)
		}
		if err := p.more(start, minReadRoom); err != nil {
			if err == io.EOF {
				break
			}
			return nil, err
		}
	}
	if p.n-start > limit {
		return nil, fmt.Errorf("%w: more than %d bytes", metrics.ErrTooLarge, limit)
	}
	p.r = p.n
	return p.buf[start:p.n], nil
}

// chunked decodes a chunked body in place: each chunk's data is moved down
// over the framing before it, so the body ends up contiguous at bs. The
// first chunk's data does not move at all.
func (p *respReader) chunked(limit int) ([]byte, error) {
	bs, w := -1, p.r
	// excess is framing beyond 16 bytes plus twice the data per chunk; a
	// body mostly made of chunk lines is refused (net/http's rule).
	excess := 0
	for {
		if bs < 0 {
			w = p.r // nothing decoded yet: keep no bytes before the line
		}
		ln, err := p.line(w, maxChunkLine, "chunk-size line")
		if err != nil {
			return nil, err
		}
		size, ok := parseChunkSize(ln)
		if !ok {
			return nil, badResponse("chunk-size line %q", clipPrintable(string(ln), 40))
		}
		if excess = max(0, excess+len(ln)+2-16-2*size); excess > 16<<10 {
			return nil, badResponse("chunked framing much larger than its data")
		}
		if size == 0 {
			break
		}
		if bs < 0 {
			bs, w = p.r, p.r
		}
		if size > limit-(w-bs) {
			return nil, fmt.Errorf("%w: chunked body exceeds limit %d", metrics.ErrTooLarge, limit)
		}
		for size > 0 {
			if p.r == p.n {
				// The chunk's rest, its CRLF and a last-chunk line fit
				// without growing past what the body needs.
				if err := p.more(w, size+7); err != nil {
					return nil, truncated(err, "chunk data")
				}
			}
			k := min(size, p.n-p.r)
			if w != p.r {
				copy(p.buf[w:], p.buf[p.r:p.r+k])
			}
			w, p.r, size = w+k, p.r+k, size-k
		}
		for p.n-p.r < 2 {
			if err := p.more(w, minReadRoom); err != nil {
				return nil, truncated(err, "chunk data")
			}
		}
		if p.buf[p.r] != '\r' || p.buf[p.r+1] != '\n' {
			return nil, badResponse("chunk data not followed by CRLF")
		}
		p.r += 2
	}
	if bs < 0 {
		bs, w = p.r, p.r
	}
	// Trailer section: header lines up to a blank line, ignored.
	trailer := 0
	for {
		ln, err := p.line(w, maxHeaderBytes, "trailer section")
		if err != nil {
			return nil, err
		}
		if len(ln) == 0 {
			break
		}
		if trailer += len(ln) + 2; trailer > maxHeaderBytes {
			return nil, badResponse("trailer section larger than %d bytes", maxHeaderBytes)
		}
		if _, _, err := headerLine(ln, "trailer"); err != nil {
			return nil, err
		}
	}
	return p.buf[bs:w], nil
}

// headerLine splits "Name: value" (a header or trailer field line without
// its CRLF) and checks its syntax.
func headerLine(ln []byte, what string) (name, val []byte, err error) {
	if len(ln) == 0 || ln[0] == ' ' || ln[0] == '\t' {
		return nil, nil, badResponse("folded or empty %s line", what)
	}
	colon := bytes.IndexByte(ln, ':')
	if colon <= 0 {
		return nil, nil, badResponse("%s line without a name: %q", what, clipPrintable(string(ln), 80))
	}
	name, val = ln[:colon], bytes.Trim(ln[colon+1:], " \t")
	for _, c := range name {
		if !isTokenByte(c) {
			return nil, nil, badResponse("%s name %q", what, clipPrintable(string(name), 80))
		}
	}
	for _, c := range val {
		if (c < ' ' && c != '\t') || c == 0x7f {
			return nil, nil, badResponse("control byte in %s %s", what, name)
		}
	}
	return name, val, nil
}

// parseChunkSize reads "HEX[;ext...]" or "HEX" and trailing whitespace;
// extensions are ignored. Whitespace before ';' (RFC 9112's BWS) is
// refused, as net/http does.
func parseChunkSize(ln []byte) (int, bool) {
	n, i := 0, 0
	for ; i < len(ln); i++ {
		c := ln[i]
		var d int
		switch {
		case c >= '0' && c <= '9':
			d = int(c - '0')
		case c >= 'a' && c <= 'f':
			d = int(c-'a') + 10
		case c >= 'A' && c <= 'F':
			d = int(c-'A') + 10
		default:
			goto rest
		}
		if i >= 15 { // 15 hex digits is far beyond any limit
			return 0, false
		}
		n = n<<4 | d
	}
rest:
	if i == 0 {
		return 0, false
	}
	if i < len(ln) && ln[i] != ';' {
		for _, c := range ln[i:] {
			if c != ' ' && c != '\t' {
				return 0, false
			}
		}
	}
	for _, c := range ln[i:] {
		if (c < ' ' && c != '\t') || c == 0x7f {
			return 0, false
		}
	}
	return n, true
}

func parseDecimal(b []byte) (int, bool) {
	if len(b) == 0 || len(b) > 15 {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if !isDigit(c) {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// isTokenByte reports an RFC 9110 tchar.
func isTokenByte(c byte) bool {
	if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || isDigit(c) {
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}
