package index

import (
	"fmt"
	"runtime"
	"testing"
	"unsafe"
)

func TestRecBytesIsRecSize(t *testing.T) {
	if got := unsafe.Sizeof(rec{}) + unsafe.Sizeof(uint64(0)); got != recBytes {
		t.Fatalf("unsafe.Sizeof(rec) = %d, recBytes = %d", got, recBytes)
	}
	if got := unsafe.Sizeof(u64slot[uint32]{}); got != u64slotBytes {
		t.Fatalf("unsafe.Sizeof(u64slot) = %d, u64slotBytes = %d", got, u64slotBytes)
	}
}

// Status.Bytes (bytes_estimate) must track the index's real heap: within
// 10% of the live heap the index holds at 1M entries, bridges included,
// measured with runtime.MemStats after GC.
func TestBytesEstimateMatchesLiveHeap(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 1M-entry index")
	}
	const entries, blocks, bs, servers = 1 << 20, 64, 16, 16
	tokens := make([]int32, blocks*bs)
	hashes := make([]uint64, blocks)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	ix := New(Config{MaxEntries: entries})
	var ids []ServerID
	for i := 0; i < servers; i++ {
		id, err := ix.AddServer(fmt.Sprint("s", i), ServerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	for n := 0; n < entries/blocks; n++ {
		for i := range tokens {
			tokens[i] = int32(n*13 + i)
		}
		for i := range hashes {
			hashes[i] = uint64(n)<<8 | uint64(i) | 1
		}
		if err := ix.Stored(ids[n%servers], GPU, false, 0, hashes, tokens, bs, 0); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	st := ix.Status()
	runtime.KeepAlive(ix)
	if st.Entries != entries {
		t.Fatalf("entries %d, want %d", st.Entries, entries)
	}
	live := float64(after.HeapAlloc) - float64(before.HeapAlloc)
	ratio := float64(st.Bytes) / live
	t.Logf("bytes_estimate %.1f MiB, live heap %.1f MiB (ratio %.3f), %.1f bytes/entry",
		float64(st.Bytes)/(1<<20), live/(1<<20), ratio, live/entries)
	if ratio < 0.9 || ratio > 1.1 {
		t.Fatalf("bytes_estimate %d is %.1f%% of the live heap %.0f (want within 10%%)", st.Bytes, ratio*100, live)
	}
}
