package router

import (
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/blockhash"
	"github.com/kvc-router/kvc-router/core/internal/load"
)

// benchRouter has 64 event-fed servers; the prompt's blocks are indexed on
// four of them (as after a GRPO group's first sibling) and every server has
// fresh metrics.
func benchRouter(b *testing.B, tokens int, mode string) (*Router, []int32) {
	f := false
	r, err := New(Config{Mode: mode, Model: "m", EventsDefault: true, Speculate: &f})
	if err != nil {
		b.Fatal(err)
	}
	var ids []string
	for i := 0; i < 64; i++ {
		ids = append(ids, fmt.Sprintf("10.0.0.%d:8000", i))
	}
	if err := r.AddServers(ids); err != nil {
		b.Fatal(err)
	}
	for i, id := range ids {
		r.UpdateMetrics(id, load.Metrics{Running: float64(i % 9), HasKVUsage: true, KVUsage: 0.3, BlockSize: 16})
	}
	p := prompt(tokens, 7)
	for s := 0; s < 4; s++ {
		storeOn(b, r, ids[s*16], p, 16)
	}
	return r, p
}

func benchAcquire(b *testing.B, tokens int, mode string) {
	r, p := benchRouter(b, tokens, mode)
	loopAcquire(b, r, func(int) []int32 { return p }, mode == ModeKVCAware)
}

// loopAcquire runs Acquire/Release for the benchmark, prompt i from
// pick(i), failing on a decision without a GPU hit when wantHit, and reports
// the thread's CPU time per op next to wall time: on a shared,
// oversubscribed machine wall time mostly measures waiting for a CPU.
func loopAcquire(b *testing.B, r *Router, pick func(i int) []int32, wantHit bool) {
	b.ReportAllocs()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu0 := threadCPU()
	i := 0
	for b.Loop() {
		d, err := r.Acquire(Request{ID: fmt.Sprint(i), Tokens: pick(i), Pin: -1})
		if err != nil {
			b.Fatal(err)
		}
		if wantHit && d.HitBlocks[0] == 0 {
			b.Fatalf("no hit: %+v", d)
		}
		r.Release(d.Server)
		i++
	}
	b.ReportMetric(float64(threadCPU()-cpu0)/float64(i), "cpu-ns/op")
}

// threadCPU is the calling OS thread's CPU time (user + system).
func threadCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Acquire cost for the kvc_aware path against the default (least in-flight)
// path measured in the same run: the ratio is the price of cache awareness.
func BenchmarkAcquire8kKVC(b *testing.B)      { benchAcquire(b, 8192, ModeKVCAware) }
func BenchmarkAcquire32kKVC(b *testing.B)     { benchAcquire(b, 32768, ModeKVCAware) }
func BenchmarkAcquire8kDefault(b *testing.B)  { benchAcquire(b, 8192, ModeDefault) }
func BenchmarkAcquire32kDefault(b *testing.B) { benchAcquire(b, 32768, ModeDefault) }

// BenchmarkAcquireGRPO8k is the Python benchmark's workload in Go: 8
// servers without events (speculation on, the default), 64 prompts of 8k
// tokens in GRPO groups sharing their first 7680 tokens.
func BenchmarkAcquireGRPO8k(b *testing.B) {
	r, err := New(Config{Mode: ModeKVCAware, Model: "m"})
	if err != nil {
		b.Fatal(err)
	}
	var ids []string
	for i := 0; i < 8; i++ {
		ids = append(ids, fmt.Sprintf("10.0.0.%d:8000", i))
	}
	if err := r.AddServers(ids); err != nil {
		b.Fatal(err)
	}
	base := prompt(8192, 11)
	ps := make([][]int32, 64)
	for i := range ps {
		ps[i] = append([]int32(nil), base...)
		for j := 7680; j < 8192; j++ {
			ps[i][j] = int32(1_000_000 + i*8192 + j)
		}
	}
	loopAcquire(b, r, func(i int) []int32 { return ps[i%len(ps)] }, false)
}

// BenchmarkAcquire8kKVCCold is BenchmarkAcquire8kKVC without help from the
// key memo: it cycles over more distinct prompts than the memo keeps, each
// indexed on four servers, so every Acquire hashes all 512 blocks. The
// figure for a prompt the router has not seen recently.
func BenchmarkAcquire8kKVCCold(b *testing.B) {
	r, _ := benchRouter(b, 8192, ModeKVCAware)
	n := blockhash.MemoMaxEntries + 8
	ps := make([][]int32, n)
	for k := range ps {
		ps[k] = prompt(8192, int32(1_000_000*(k+1)))
		storeOn(b, r, fmt.Sprintf("10.0.0.%d:8000", (k%4)*16), ps[k], 16)
	}
	loopAcquire(b, r, func(i int) []int32 { return ps[i%n] }, true)
}

// Decode blocks as vLLM publishes them (one BlockStored per filled block,
// parented on the block before) for 256 in-flight requests: the event path's
// cost with length learning off, and on (each block extends a followed
// request's chain, progress.go).
func BenchmarkDecodeEventsLengthsOff(b *testing.B) { benchDecodeEvents(b, false) }
func BenchmarkDecodeEventsLengthsOn(b *testing.B)  { benchDecodeEvents(b, true) }

func benchDecodeEvents(b *testing.B, lengths bool) {
	const bs, reqs = 16, 256
	r, err := New(Config{Mode: ModeKVCAware, Model: "m", BlockSize: bs, Lengths: LengthsSpec{Enabled: lengths},
		Servers: map[string]ServerSpec{"ev": {Capacity: 1 << 22}}})
	if err != nil {
		b.Fatal(err)
	}
	if err := r.AddServers([]string{"ev"}); err != nil {
		b.Fatal(err)
	}
	r.SetEventFeed("ev", true)
	wr, _ := r.EventWriter("ev")
	tips := make([]uint64, reqs) // each request's last published engine hash
	next := uint64(1 << 40)
	for i := range tips {
		p := prompt(64, int32(i*1000))
		hs := []uint64{next, next + 1, next + 2, next + 3}
		next += 4
		if err := wr.Stored(0, false, 0, hs, p, bs, ""); err != nil {
			b.Fatal(err)
		}
		tips[i] = hs[3]
		if _, err := r.Acquire(Request{ID: fmt.Sprint("q", i), Tokens: p, Pin: 0}); err != nil {
			b.Fatal(err)
		}
	}
	blk := prompt(bs, 7)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		j := i % reqs
		blk[0] = int32(i)
		if err := wr.Stored(0, true, tips[j], []uint64{next}, blk, bs, ""); err != nil {
			b.Fatal(err)
		}
		tips[j] = next
		next++
	}
}
