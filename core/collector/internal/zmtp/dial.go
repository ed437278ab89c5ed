// Package zmtp dials ZeroMQ publishers with a bounded handshake and closes
// go-zeromq sockets without leaking their reader goroutines.
package zmtp

import (
	"context"
	"net"
	"strings"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// go-zeromq's Dial runs the ZMTP handshake with no deadline: a peer that
// accepts the TCP connection but never speaks ZMTP (a stopped engine
// process, another service on the port) would block a subscriber forever,
// and with it Close, server removal and kvr_router_close. Publishers are
// therefore dialled through guardedTCP, which bounds the handshake.

// zmtpScheme is the transport name tcp:// endpoints are dialled through.
const zmtpScheme = "kvr-tcp"

// HandshakeTimeout bounds the peer's ZMTP greeting and first command
// (a variable so that tests can shorten it).
var HandshakeTimeout = 2 * time.Second

// zmtpHandshakeBytes is the ZMTP 3 greeting (64 bytes) plus a command
// header and name: once read, the peer speaks ZMTP and later reads may
// wait for messages indefinitely.
const zmtpHandshakeBytes = 64 + 8

func init() {
	if err := zmq4.RegisterTransport(zmtpScheme, guardedTCP{}); err != nil {
		panic(err)
	}
}

// DialEndpoint maps an endpoint to the one handed to zmq4's Dial.
func DialEndpoint(ep string) string {
	if rest, ok := strings.CutPrefix(ep, "tcp://"); ok {
		return zmtpScheme + "://" + rest
	}
	return ep
}

type guardedTCP struct{}

func (guardedTCP) Dial(ctx context.Context, dialer transport.Dialer, addr string) (net.Conn, error) {
	c, err := dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if err := c.SetReadDeadline(time.Now().Add(HandshakeTimeout)); err != nil {
		c.Close()
		return nil, err
	}
	return &handshakeConn{Conn: c}, nil
}

func (guardedTCP) Listen(ctx context.Context, addr string) (net.Listener, error) {
	return net.Listen("tcp", addr)
}

func (guardedTCP) Addr(ep string) (string, error) { return transport.New("tcp").Addr(ep) }

// handshakeConn lifts its read deadline once the handshake bytes arrived.
// Reads are sequential (the handshake in Dial, then the socket's reader).
type handshakeConn struct {
	net.Conn
	read int
}

func (c *handshakeConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if c.read < zmtpHandshakeBytes {
		c.read += n
		if c.read >= zmtpHandshakeBytes {
			_ = c.Conn.SetReadDeadline(time.Time{})
		}
	}
	return n, err
}

// closeDrainAttempts bounds the receives CloseDrained makes after Close.
const closeDrainAttempts = 64

// CloseDrained closes a go-zeromq socket and frees its reader goroutines.
// go-zeromq's per-connection reader blocks on its 10-message queue without
// watching its context, so a socket closed while a publisher was still
// sending (a replay ended early, a session ended during a burst) left that
// goroutine blocked forever: the slow goroutine growth of the 1M-pair soak.
// After Close a Recv either takes a queued message or returns the context
// error (Go picks between ready select cases at random); taking one message
// is enough, because the reader then sees the cancelled context and exits.
// closeDrainAttempts receives leave a full queue undrained with
// probability 2^-64.
func CloseDrained(s zmq4.Socket) {
	_ = s.Close()
	for i := 0; i < closeDrainAttempts; i++ {
		_, _ = s.Recv()
	}
}
