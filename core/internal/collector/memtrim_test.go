package collector

import (
	"context"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/clock"
	"github.com/kvc-router/kvc-router/core/internal/memtrim"
)

// retainedHeap is the heap memory the runtime keeps mapped: every heap
// class but what it has released to the OS (runtime/metrics, not RSS,
// which the race detector and the test binary blur).
func retainedHeap() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64() - s[1].Value.Uint64()
}

// Issue 20 O1: after giant inputs (one 4M-token event, one 131,072-event
// batch) and an emptied index, memory goes back to the OS within seconds;
// before, ~40 MiB more than at the start stayed mapped indefinitely (an
// idle router runs no GC cycle for the scavenger to act on).
func TestMemoryReturnsAfterGiantBatches(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates ~200 MiB")
	}
	const delay = 200 * time.Millisecond
	fc := clock.NewFake(time.Unix(1_700_000_000, 0))
	defer memtrim.UseClock(fc)()
	memtrim.Configure(memtrim.DefaultThreshold, delay, delay)
	defer memtrim.Configure(memtrim.DefaultThreshold, memtrim.DefaultDelay, memtrim.DefaultMinInterval)
	r := newRouter(t, "push", "live")
	live := NewSubscriber(r, "live", Endpoint{Endpoint: "tcp://127.0.0.1:1"}, fastCfg())
	debug.FreeOSMemory()
	base := retainedHeap()
	var next uint64
	giantEvent := floodBatch(&next, 1, 1<<18) // 4,194,304 tokens
	giantBatch := floodBatch(&next, 1<<17, 1) // 131,072 events
	trims0 := memtrim.Snapshot().Trims

	var st EventStats
	for _, p := range [][]byte{giantEvent, giantBatch} {
		if err := ApplyPayload(r, "push", p, &st); err != nil {
			t.Fatal(err)
		}
	}
	live.handle(context.Background(), [][]byte{nil, be(0), giantEvent})
	live.handle(context.Background(), [][]byte{nil, be(1), giantBatch})
	if n := live.batch.Retained(); n > maxRetainedBatch {
		t.Fatalf("subscriber keeps %d bytes of decode buffers", n)
	}
	giantEvent, giantBatch = nil, nil
	runtime.GC()
	peak := retainedHeap()
	for _, s := range []string{"push", "live"} {
		w, _ := r.EventWriter(s)
		if err := w.Cleared(); err != nil {
			t.Fatal(err)
		}
	}
	if n := r.Status().Index.Entries; n != 0 {
		t.Fatalf("index not empty: %d entries", n)
	}
	// The inputs armed one trim; it runs once its delay has passed.
	if memtrim.Snapshot().Trims != trims0 {
		t.Fatal("trimmed before the delay")
	}
	fc.Advance(delay)
	const bound = 16 << 20
	got := retainedHeap()
	t.Logf("retained heap: %d MiB at start, %d MiB after the batches, %d MiB after clearing and the trim (%d trims)",
		base>>20, peak>>20, got>>20, memtrim.Snapshot().Trims-trims0)
	if got > base+bound {
		t.Fatalf("retained heap %d MiB, more than %d MiB over the %d MiB at start, after clearing and the trim",
			got>>20, bound>>20, base>>20)
	}
	if memtrim.Snapshot().Trims == trims0 {
		t.Fatal("no memory return was armed")
	}
}
