// Package zmtp is the collector's own ZMTP 3.0 client (rfc.zeromq.org
// 23/ZMTP, NULL security): a SUB socket for vLLM's KV-event publishers and a
// DEALER for their replay ROUTER, over one TCP (or IPC) connection each.
//
// It exists because a general ZMQ library trusts the peer: go-zeromq
// allocates a frame of whatever size its header claims (2^50 bytes panics in
// makeslice in the library's own goroutine, where no recover can reach it),
// reads frames of any size in full before the caller can reject them, and
// sleeps between dial retries without watching its context. Here every frame
// header is checked against the caller's limits before a byte is allocated,
// a multipart message is bounded in frames and in total bytes, and every
// blocking step ends when the caller's context does (the connection is
// closed under the reader). Reads happen on the caller's goroutine: a
// subscription holds at most one message in memory.
package zmtp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"
)

// Socket types this client speaks, and the peers it accepts (ZMTP 23,
// "The Socket Type property"; vLLM's publisher is PUB, its replay ROUTER).
const (
	Sub    = "SUB"
	Dealer = "DEALER"
)

var compatible = map[string][]string{
	Sub:    {"PUB", "XPUB"},
	Dealer: {"ROUTER", "DEALER", "REP"},
}

// Errors a connection ends with. A frame over the limits is ErrTooLarge; any
// other deviation from the protocol is ErrProtocol. Both mean the peer is
// broken or hostile: the caller drops the connection and counts it.
var (
	ErrTooLarge = errors.New("zmtp: frame over the size limit")
	ErrProtocol = errors.New("zmtp: protocol violation")
)

// HandshakeTimeout bounds the greeting and READY exchange (a variable so
// that tests can shorten it). A peer that accepts the TCP connection but
// never speaks ZMTP (a stopped engine process, another service on the
// port) or dribbles its greeting a byte at a time is dropped after it.
var HandshakeTimeout = 2 * time.Second

// writeTimeout bounds one outgoing message (a subscription, a replay
// request, a PONG): a peer that stops reading must not block us.
const writeTimeout = 5 * time.Second

// Wire constants (ZMTP 23).
const (
	greetingLen = 64
	flagMore    = 0x01
	flagLong    = 0x02
	flagCommand = 0x04
	flagsKnown  = flagMore | flagLong | flagCommand
	// maxCommandBytes bounds a command body (READY with its metadata,
	// ERROR, PING): libzmq's READY is a few dozen bytes.
	maxCommandBytes = 64 << 10
	// maxCommandsPerMsg bounds commands a peer may send between two
	// messages, so that a stream of commands cannot hold a reader forever.
	maxCommandsPerMsg = 1024
)

// Limits bound what one message may make us allocate.
type Limits struct {
	// MaxFrame is the largest frame body accepted.
	MaxFrame int
	// MaxMessage bounds the sum of a multipart message's frame bodies.
	MaxMessage int
	// MaxFrames bounds the frames of one message.
	MaxFrames int
}

// ForPayload is the limits for vLLM's messages with payloads of at most
// maxPayload bytes: a topic and a seq frame beside the payload (the topic
// bounded by maxTopic), at most 4 frames (a replay reply with its
// delimiter), and a few bytes of slack.
func ForPayload(maxPayload, maxTopic int) Limits {
	frame := max(maxPayload, maxTopic, 8)
	return Limits{MaxFrame: frame, MaxMessage: maxPayload + maxTopic + 64, MaxFrames: 4}
}

func (l Limits) valid() bool { return l.MaxFrame > 0 && l.MaxMessage > 0 && l.MaxFrames > 0 }

// Options configure Dial.
type Options struct {
	// Type is this end's socket type (Sub or Dealer).
	Type string
	// DialTimeout bounds the TCP connect; HandshakeTimeout bounds the rest.
	DialTimeout time.Duration
	// Limits bound incoming messages.
	Limits Limits
}

// Conn is one ZMTP connection. ReadMsg must not be called concurrently with
// itself; writes are serialised.
type Conn struct {
	nc       net.Conn
	br       *bufio.Reader
	lim      Limits
	wmu      sync.Mutex
	stop     func() bool
	closeMu  sync.Once
	PeerType string // the peer's Socket-Type property
}

// network maps a tcp:// or ipc:// endpoint to a net.Dial network and address.
func network(endpoint string) (string, string, error) {
	if rest, ok := strings.CutPrefix(endpoint, "tcp://"); ok {
		if _, _, err := net.SplitHostPort(rest); err != nil {
			return "", "", fmt.Errorf("zmtp: endpoint %q: %w", endpoint, err)
		}
		return "tcp", rest, nil
	}
	if strings.HasPrefix(endpoint, "ipc://") {
		u, err := url.Parse(endpoint)
		if err != nil {
			return "", "", fmt.Errorf("zmtp: endpoint %q: %w", endpoint, err)
		}
		return "unix", u.Host + u.Path + u.Opaque, nil
	}
	return "", "", fmt.Errorf("zmtp: endpoint %q: scheme must be tcp or ipc", endpoint)
}

// Dial connects to endpoint and completes the ZMTP handshake as a socket of
// o.Type. Cancelling ctx at any time (during the dial, the handshake, or
// any later read or write) closes the connection: the blocked call returns.
func Dial(ctx context.Context, endpoint string, o Options) (*Conn, error) {
	if !o.Limits.valid() {
		return nil, fmt.Errorf("zmtp: limits %+v must all be positive", o.Limits)
	}
	peers, ok := compatible[o.Type]
	if !ok {
		return nil, fmt.Errorf("zmtp: socket type %q not supported", o.Type)
	}
	netw, addr, err := network(endpoint)
	if err != nil {
		return nil, err
	}
	d := net.Dialer{Timeout: o.DialTimeout}
	nc, err := d.DialContext(ctx, netw, addr)
	if err != nil {
		return nil, err
	}
	c := &Conn{nc: nc, br: bufio.NewReaderSize(nc, 16<<10), lim: o.Limits}
	c.stop = context.AfterFunc(ctx, func() { _ = nc.Close() })
	// One deadline for the whole handshake, not per read: a peer sending
	// one byte a second cannot stretch it.
	_ = nc.SetDeadline(time.Now().Add(HandshakeTimeout))
	if err := c.handshake(o.Type, peers); err != nil {
		c.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			// Silent, or dribbling its greeting: not a ZMTP peer we can use.
			return nil, fmt.Errorf("%w: no ZMTP handshake within %v: %v", ErrProtocol, HandshakeTimeout, err)
		}
		return nil, err
	}
	_ = nc.SetDeadline(time.Time{})
	return c, nil
}

// Close closes the connection; it is safe to call more than once and from
// any goroutine (a blocked ReadMsg returns).
func (c *Conn) Close() {
	c.closeMu.Do(func() {
		c.stop()
		_ = c.nc.Close()
	})
}

// SetReadDeadline bounds the next reads (an idle publisher, a replay's
// deadline); a read past it returns an error with Timeout() true.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.nc.SetReadDeadline(t) }

func (c *Conn) handshake(typ string, peers []string) error {
	var g [greetingLen]byte
	g[0], g[9] = 0xff, 0x7f
	g[10], g[11] = 3, 0 // ZMTP 3.0: subscriptions travel as messages
	copy(g[12:32], "NULL")
	if _, err := c.nc.Write(g[:]); err != nil {
		return err
	}
	var pg [greetingLen]byte
	if _, err := io.ReadFull(c.br, pg[:]); err != nil {
		return fmt.Errorf("zmtp: reading the greeting: %w", err)
	}
	if pg[0] != 0xff || pg[9]&0x01 != 0x01 {
		return fmt.Errorf("%w: not a ZMTP greeting (signature % x)", ErrProtocol, pg[:10])
	}
	if pg[10] < 3 {
		return fmt.Errorf("%w: peer speaks ZMTP %d.%d, need 3.x", ErrProtocol, pg[10], pg[11])
	}
	if mech := string(bytes.TrimRight(pg[12:32], "\x00")); mech != "NULL" {
		return fmt.Errorf("%w: security mechanism %q, only NULL is supported", ErrProtocol, mech)
	}
	ready := appendCommandName(nil, "READY")
	ready = appendProperty(ready, "Socket-Type", typ)
	if typ == Dealer {
		ready = appendProperty(ready, "Identity", "")
	}
	if err := c.writeFrame(flagCommand, ready); err != nil {
		return err
	}
	flags, body, err := c.readCommand()
	if err != nil {
		return err
	}
	if flags&flagCommand == 0 {
		return fmt.Errorf("%w: peer sent a message before READY", ErrProtocol)
	}
	name, data, err := splitCommand(body)
	if err != nil {
		return err
	}
	switch name {
	case "READY":
	case "ERROR":
		return fmt.Errorf("zmtp: peer refused the connection: %q", errorReason(data))
	default:
		return fmt.Errorf("%w: expected READY, got command %q", ErrProtocol, name)
	}
	props, err := parseProperties(data)
	if err != nil {
		return err
	}
	pt := props["socket-type"]
	for _, p := range peers {
		if strings.EqualFold(pt, p) {
			c.PeerType = p
			return nil
		}
	}
	return fmt.Errorf("%w: peer socket type %q cannot talk to %s", ErrProtocol, pt, typ)
}

func appendCommandName(b []byte, name string) []byte {
	return append(append(b, byte(len(name))), name...)
}

func appendProperty(b []byte, name, value string) []byte {
	b = append(b, byte(len(name)))
	b = append(b, name...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(value)))
	return append(b, value...)
}

func splitCommand(body []byte) (string, []byte, error) {
	if len(body) == 0 || int(body[0]) > len(body)-1 {
		return "", nil, fmt.Errorf("%w: malformed command name", ErrProtocol)
	}
	n := int(body[0])
	return string(body[1 : 1+n]), body[1+n:], nil
}

// parseProperties reads READY metadata: (name-len u8, name, value-len u32
// BE, value)*. Names are case-insensitive (lower-cased here).
func parseProperties(b []byte) (map[string]string, error) {
	props := map[string]string{}
	for len(b) > 0 {
		n := int(b[0])
		if len(b) < 1+n+4 {
			return nil, fmt.Errorf("%w: truncated READY property", ErrProtocol)
		}
		name := strings.ToLower(string(b[1 : 1+n]))
		vl := binary.BigEndian.Uint32(b[1+n:])
		b = b[1+n+4:]
		if uint64(vl) > uint64(len(b)) {
			return nil, fmt.Errorf("%w: READY property %q claims %d bytes, %d left", ErrProtocol, name, vl, len(b))
		}
		props[name] = string(b[:vl])
		b = b[vl:]
	}
	return props, nil
}

func errorReason(data []byte) string {
	if len(data) == 0 {
		return ""
	}
	n := min(int(data[0]), len(data)-1)
	return string(data[1 : 1+n])
}

// header reads one frame header: flags and body size. The size is checked
// by the caller before anything is allocated.
func (c *Conn) header() (byte, uint64, error) {
	flags, err := c.br.ReadByte()
	if err != nil {
		return 0, 0, err
	}
	if flags&^byte(flagsKnown) != 0 {
		return 0, 0, fmt.Errorf("%w: reserved frame flag bits set (0x%02x)", ErrProtocol, flags)
	}
	if flags&flagCommand != 0 && flags&flagMore != 0 {
		return 0, 0, fmt.Errorf("%w: a command with the MORE flag", ErrProtocol)
	}
	if flags&flagLong == 0 {
		n, err := c.br.ReadByte()
		return flags, uint64(n), err
	}
	var b [8]byte
	if _, err := io.ReadFull(c.br, b[:]); err != nil {
		return 0, 0, err
	}
	return flags, binary.BigEndian.Uint64(b[:]), nil
}

// readCommand reads the next frame during the handshake, which must be a
// bounded command.
func (c *Conn) readCommand() (byte, []byte, error) {
	flags, size, err := c.header()
	if err != nil {
		return 0, nil, err
	}
	if size > maxCommandBytes {
		return 0, nil, fmt.Errorf("%w: %d-byte command, limit %d", ErrTooLarge, size, maxCommandBytes)
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(c.br, body); err != nil {
		return 0, nil, err
	}
	return flags, body, nil
}

// ReadMsg reads the next message's frames, appending them to dst[:0]. A
// frame over Limits.MaxFrame, a message over Limits.MaxMessage bytes or
// Limits.MaxFrames frames, or any protocol violation returns an error
// before the offending frame's body is allocated or read; the connection
// is then unusable (the caller closes it). Commands between messages are
// handled here (PING is answered, ERROR ends the connection).
func (c *Conn) ReadMsg(dst [][]byte) ([][]byte, error) {
	frames := dst[:0]
	total, commands := 0, 0
	for {
		flags, size, err := c.header()
		if err != nil {
			return nil, err
		}
		if flags&flagCommand != 0 {
			if len(frames) > 0 {
				return nil, fmt.Errorf("%w: a command inside a multipart message", ErrProtocol)
			}
			if commands++; commands > maxCommandsPerMsg {
				return nil, fmt.Errorf("%w: more than %d commands in a row", ErrProtocol, maxCommandsPerMsg)
			}
			if err := c.command(size); err != nil {
				return nil, err
			}
			continue
		}
		if len(frames) >= c.lim.MaxFrames {
			return nil, fmt.Errorf("%w: message has more than %d frames", ErrTooLarge, c.lim.MaxFrames)
		}
		if size > uint64(c.lim.MaxFrame) {
			return nil, fmt.Errorf("%w: frame of %d bytes, limit %d", ErrTooLarge, size, c.lim.MaxFrame)
		}
		if uint64(total)+size > uint64(c.lim.MaxMessage) {
			return nil, fmt.Errorf("%w: message of more than %d bytes, limit %d", ErrTooLarge, uint64(total)+size, c.lim.MaxMessage)
		}
		body := make([]byte, size)
		if _, err := io.ReadFull(c.br, body); err != nil {
			return nil, err
		}
		total += int(size)
		frames = append(frames, body)
		if flags&flagMore == 0 {
			return frames, nil
		}
	}
}

// command handles one command frame of size bytes between messages.
func (c *Conn) command(size uint64) error {
	if size > maxCommandBytes {
		return fmt.Errorf("%w: %d-byte command, limit %d", ErrTooLarge, size, maxCommandBytes)
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(c.br, body); err != nil {
		return err
	}
	name, data, err := splitCommand(body)
	if err != nil {
		return err
	}
	switch name {
	case "PING": // ZMTP 3.1 heartbeat: TTL (2 bytes), then up to 16 context bytes to echo
		if len(data) < 2 {
			return fmt.Errorf("%w: short PING", ErrProtocol)
		}
		ctxb := data[2:]
		if len(ctxb) > 16 {
			return fmt.Errorf("%w: PING context of %d bytes", ErrProtocol, len(ctxb))
		}
		return c.writeFrame(flagCommand, append(appendCommandName(nil, "PONG"), ctxb...))
	case "ERROR":
		return fmt.Errorf("zmtp: peer sent ERROR: %q", errorReason(data))
	}
	return nil // PONG, and commands this client does not use
}

// writeFrame writes one frame (serialised, bounded by writeTimeout).
func (c *Conn) writeFrame(flags byte, body []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return c.writeLocked(flags, body)
}

func (c *Conn) writeLocked(flags byte, body []byte) error {
	var hdr [9]byte
	n := 2
	if len(body) > 255 {
		flags |= flagLong
		binary.BigEndian.PutUint64(hdr[1:], uint64(len(body)))
		n = 9
	} else {
		hdr[1] = byte(len(body))
	}
	hdr[0] = flags
	_ = c.nc.SetWriteDeadline(time.Now().Add(writeTimeout))
	if _, err := c.nc.Write(hdr[:n]); err != nil {
		return err
	}
	_, err := c.nc.Write(body)
	return err
}

// Send writes one message of the given frames.
func (c *Conn) Send(frames ...[]byte) error {
	if len(frames) == 0 {
		return errors.New("zmtp: a message has at least one frame")
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for i, f := range frames {
		var flags byte
		if i < len(frames)-1 {
			flags = flagMore
		}
		if err := c.writeLocked(flags, f); err != nil {
			return err
		}
	}
	return nil
}

// Subscribe sends a SUB subscription for a topic prefix. Under ZMTP 3.0
// (what we announce) a subscription is a one-frame message: 0x01, topic.
func (c *Conn) Subscribe(topic string) error {
	return c.Send(append([]byte{1}, topic...))
}
