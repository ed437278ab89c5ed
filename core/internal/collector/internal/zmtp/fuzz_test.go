package zmtp

import (
	"bufio"
	"bytes"
	"net"
	"testing"
	"time"
)

// sinkConn stands in for the network under a Conn fed from memory: writes
// (PONG) are kept, deadlines ignored.
type sinkConn struct {
	net.Conn
	out bytes.Buffer
}

func (s *sinkConn) Write(p []byte) (int, error)      { return s.out.Write(p) }
func (s *sinkConn) SetWriteDeadline(time.Time) error { return nil }
func (s *sinkConn) SetReadDeadline(time.Time) error  { return nil }
func (s *sinkConn) Close() error                     { return nil }

func memConn(data []byte, lim Limits) (*Conn, *sinkConn) {
	sc := &sinkConn{}
	return &Conn{nc: sc, br: bufio.NewReader(bytes.NewReader(data)), lim: lim, stop: func() bool { return true }}, sc
}

// FuzzZMTPReader feeds arbitrary bytes to the frame reader after the
// handshake (headers claiming any size, flags, commands, truncation).
// Whatever arrives, ReadMsg never panics and never returns a message
// outside the limits; and any message Send encodes reads back unchanged.
func FuzzZMTPReader(f *testing.F) {
	f.Add([]byte{0, 3, 'a', 'b', 'c'})
	f.Add([]byte{1, 1, 't', 0, 2, 'h', 'i'})
	f.Add(append([]byte{2}, 0, 4, 0, 0, 0, 0, 0, 0)) // 2^50
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{4, 7, 4, 'P', 'I', 'N', 'G', 0, 1})
	f.Add([]byte{4, 6, 5, 'E', 'R', 'R', 'O', 'R'})
	f.Add([]byte{1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 0, 0})
	f.Add([]byte{1, 1, 'x', 4, 0})
	lim := Limits{MaxFrame: 64, MaxMessage: 100, MaxFrames: 4}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, _ := memConn(data, lim)
		for i := 0; i < 64; i++ {
			frames, err := c.ReadMsg(nil)
			if err != nil {
				break
			}
			if len(frames) == 0 || len(frames) > lim.MaxFrames {
				t.Fatalf("%d frames", len(frames))
			}
			total := 0
			for _, fr := range frames {
				if len(fr) > lim.MaxFrame {
					t.Fatalf("frame of %d bytes", len(fr))
				}
				total += len(fr)
			}
			if total > lim.MaxMessage {
				t.Fatalf("message of %d bytes", total)
			}
		}
		// Round trip: the input cut into at most 4 frames.
		var frames [][]byte
		for rest := data; len(frames) < 4; {
			if len(rest) == 0 {
				break
			}
			n := min(int(rest[0])%25, len(rest)-1) // 4 x 24 bytes fit the limits
			frames = append(frames, rest[1:1+n])
			rest = rest[1+n:]
		}
		if len(frames) == 0 {
			return
		}
		w, sc := memConn(nil, lim)
		if err := w.Send(frames...); err != nil {
			t.Fatal(err)
		}
		r, _ := memConn(sc.out.Bytes(), lim)
		got, err := r.ReadMsg(nil)
		if err != nil || len(got) != len(frames) {
			t.Fatalf("round trip: %d frames -> %d, %v", len(frames), len(got), err)
		}
		for i := range got {
			if !bytes.Equal(got[i], frames[i]) {
				t.Fatalf("frame %d: %q -> %q", i, frames[i], got[i])
			}
		}
	})
}
