package collector

import (
	"context"
	"errors"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/collector/internal/zmtp"
	"github.com/kvc-router/kvc-router/core/internal/kvevents"
)

// ErrFrameTooLarge and ErrProtocol are the errors a LiveConn (and a replay)
// ends with when the publisher sends a frame over the limits or violates
// ZMTP; match them with errors.Is.
var (
	ErrFrameTooLarge = zmtp.ErrTooLarge
	ErrProtocol      = zmtp.ErrProtocol
)

// LiveConn is one bounded SUB connection to a KV-event publisher, for tools
// that print a live stream (kvctl watch). Messages are read through the
// collector's own ZMTP reader: a frame over maxPayload plus framing ends the
// connection before it is allocated. Cancelling the dial's context closes
// the connection.
type LiveConn struct{ c *zmtp.Conn }

// DialLive connects to a publisher and subscribes to topic (a byte prefix).
// maxPayload <= 0 takes the default KV-event payload limit.
func DialLive(ctx context.Context, endpoint, topic string, maxPayload int, dialTimeout time.Duration) (*LiveConn, error) {
	if maxPayload <= 0 {
		maxPayload = kvevents.DefaultLimits.MaxPayloadBytes
	}
	c, err := zmtp.Dial(ctx, endpoint, zmtp.Options{Type: zmtp.Sub, DialTimeout: dialTimeout,
		Limits: zmtp.ForPayload(maxPayload, maxTopicBytes)})
	if err != nil {
		return nil, err
	}
	if err := c.Subscribe(topic); err != nil {
		c.Close()
		return nil, err
	}
	return &LiveConn{c: c}, nil
}

// Recv returns the next message's frames.
func (l *LiveConn) Recv() ([][]byte, error) { return l.c.ReadMsg(nil) }

// Close closes the connection (a blocked Recv returns).
func (l *LiveConn) Close() { l.c.Close() }

// IsHostile reports whether err ended a connection because of what the
// peer sent (a frame over the limits, a ZMTP violation).
func IsHostile(err error) bool {
	return errors.Is(err, zmtp.ErrTooLarge) || errors.Is(err, zmtp.ErrProtocol)
}
