package collector

import (
	"context"
	"runtime"
	"testing"
	"time"
)

// go-zeromq's per-connection reader goroutine blocks, without watching its
// context, on a full 10-message queue. A replay that ends early (a gap
// that cannot close, the end of the wanted range, a timeout) while the
// publisher is still sending left that goroutine blocked forever once
// nothing read the socket any more: one goroutine per such replay, the
// slow goroutine growth seen over the 1M-pair soak. Replay must leave no
// goroutine behind however it ends.
func TestReplayEndingEarlyLeaksNoGoroutine(t *testing.T) {
	p := newTestPublisher(t, true, false)
	// 200 buffered batches from seq 50: a replay from 0 that needs the
	// range whole fails at once while the publisher streams the rest.
	for i := 0; i < 250; i++ {
		p.publish(storeBatch([]uint64{uint64(i + 1)}, make([]int32, 16)), true)
	}
	p.mu.Lock()
	for s := uint64(0); s < 50; s++ {
		delete(p.buf, s)
	}
	p.mu.Unlock()
	ep := p.endpoint()

	settle := func() int {
		// Let finished goroutines exit before counting.
		n := runtime.NumGoroutine()
		for i := 0; i < 50; i++ {
			time.Sleep(20 * time.Millisecond)
			m := runtime.NumGoroutine()
			if m == n {
				return m
			}
			n = m
		}
		return n
	}
	run := func() {
		ok, _, err := Replay(context.Background(), ep.Replay, 0, 250, time.Second, time.Second, false,
			func(uint64, []byte) {})
		if ok || err == nil {
			t.Fatalf("replay over a gap reported complete (ok=%v err=%v)", ok, err)
		}
	}
	run() // warm: the first run starts long-lived runtime goroutines
	base := settle()
	for i := 0; i < 20; i++ {
		run()
	}
	// Finished goroutines exit a little after their replay returns: wait
	// for the count to come back (a leaked one never does).
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > base+2 {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			t.Fatalf("goroutines %d -> %d 10 s after 20 early-ended replays\n%s", base, runtime.NumGoroutine(), buf[:n])
		}
		time.Sleep(10 * time.Millisecond)
	}
}
