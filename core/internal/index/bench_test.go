package index

import (
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/blockhash"
)

// BenchmarkStoredIngest applies BlockStored runs of 32 blocks (a 512-token
// prompt at block size 16) across 8 servers, as events arrive from engines.
func BenchmarkStoredIngest(b *testing.B) {
	ix := New(Config{MaxEntries: 1 << 22})
	var ids []ServerID
	for i := 0; i < 8; i++ {
		id, _ := ix.AddServer(fmt.Sprint("s", i), ServerOptions{})
		ids = append(ids, id)
	}
	const blocks, bs = 32, 16
	tokens := make([]int32, blocks*bs)
	hashes := make([]uint64, blocks)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ResetTimer()
	cpu0 := threadCPU()
	n := 0
	for b.Loop() {
		for i := range tokens {
			tokens[i] = int32(n*7 + i)
		}
		for i := range hashes {
			hashes[i] = uint64(n)<<8 | uint64(i) | 1
		}
		_ = ix.Stored(ids[n%8], GPU, false, 0, hashes, tokens, bs, 0)
		n++
	}
	b.ReportMetric(float64(n*blocks)/b.Elapsed().Seconds(), "blocks/s")
	// Per CPU second of the ingesting thread: wall time on a shared
	// machine mostly measures waiting for a CPU.
	b.ReportMetric(float64(n*blocks)/(threadCPU()-cpu0).Seconds(), "blocks/cpu-s")
}

// threadCPU is the calling OS thread's CPU time (user + system).
func threadCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkMemoryPerEntry reports heap bytes per (server, block) residency
// with 1M entries resident, bridges included.
func BenchmarkMemoryPerEntry(b *testing.B) {
	const entries, blocks, bs = 1 << 20, 64, 16
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		ix := New(Config{MaxEntries: entries})
		var ids []ServerID
		for i := 0; i < 16; i++ {
			id, _ := ix.AddServer(fmt.Sprint("s", i), ServerOptions{})
			ids = append(ids, id)
		}
		tokens := make([]int32, blocks*bs)
		hashes := make([]uint64, blocks)
		for n := 0; n < entries/blocks; n++ {
			for i := range tokens {
				tokens[i] = int32(n*13 + i)
			}
			for i := range hashes {
				hashes[i] = uint64(n)<<8 | uint64(i) | 1
			}
			_ = ix.Stored(ids[n%16], GPU, false, 0, hashes, tokens, bs, 0)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		st := ix.Status()
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(st.Entries), "bytes/entry")
		b.ReportMetric(float64(st.Bytes)/float64(st.Entries), "est-bytes/entry")
		runtime.KeepAlive(ix)
	}
}

// BenchmarkMatchPrefix queries an 8k-token prompt (512 blocks) whose blocks
// are resident on 4 of 64 servers.
func BenchmarkMatchPrefix(b *testing.B) {
	ix := New(Config{})
	var ids []ServerID
	for i := 0; i < 64; i++ {
		id, _ := ix.AddServer(fmt.Sprint("s", i), ServerOptions{})
		ids = append(ids, id)
	}
	prompt := make([]int32, 8192)
	for i := range prompt {
		prompt[i] = int32(i * 31)
	}
	keys := blockhash.Keys(prompt, 16, 0)
	hashes := make([]uint64, len(keys))
	for s := 0; s < 4; s++ {
		for i := range hashes {
			hashes[i] = uint64(s)<<32 | uint64(i) | 1
		}
		_ = ix.Stored(ids[s*16], GPU, false, 0, hashes, prompt, 16, 0)
	}
	out := make([]Match, len(ids))
	var scratch []int32
	for b.Loop() {
		scratch = ix.MatchPrefix(keys, ids, out, scratch)
	}
	if out[0].Blocks != len(keys) {
		b.Fatalf("match %d", out[0].Blocks)
	}
}

// coldMatchIndex is the router's cold benchmark at the index: 64 servers,
// 72 distinct 8k prompts (more than the key memo keeps) each stored on one
// of four servers; every query matches 511 blocks on one candidate, with
// the index (2 MiB) and the prompts (2.3 MiB) beyond a core's L2.
func coldMatchIndex(b *testing.B) (*Index, [][]int32, []ServerID) {
	ix := New(Config{})
	var ids []ServerID
	for i := 0; i < 64; i++ {
		id, _ := ix.AddServer(fmt.Sprint("s", i), ServerOptions{})
		ids = append(ids, id)
	}
	const n, bs = 72, 16
	ps := make([][]int32, n)
	eng := uint64(1)
	for k := range ps {
		p := make([]int32, 8192)
		for i := range p {
			p[i] = int32(k*1_000_003 + i*7919)
		}
		ps[k] = p
		hs := make([]uint64, len(p)/bs)
		for i := range hs {
			hs[i] = eng
			eng++
		}
		if err := ix.Stored(ids[(k%4)*16], GPU, false, 0, hs, p, bs, 0); err != nil {
			b.Fatal(err)
		}
	}
	return ix, ps, ids
}

// BenchmarkMatchCold8k hashes a cold 8k prompt and then walks its prefix
// over 64 candidates, as the router does; the MatchOnly and HashOnly
// benchmarks split it.
func BenchmarkMatchCold8k(b *testing.B) {
	ix, ps, ids := coldMatchIndex(b)
	keys := make([]uint64, 0, 512)
	out := make([]Match, len(ids))
	var scratch []int32
	i := 0
	cpuLoop(b, func() {
		keys = blockhash.AppendKeys(keys[:0], ps[i%len(ps)], 16, 0)
		scratch = ix.MatchPrefix(keys[:511], ids, out, scratch)
		i++
	})
}

// cpuLoop runs f per iteration and reports the thread's CPU ns per op.
func cpuLoop(b *testing.B, f func()) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cpu0 := threadCPU()
	n := 0
	for b.Loop() {
		f()
		n++
	}
	b.ReportMetric(float64(threadCPU()-cpu0)/float64(n), "cpu-ns/op")
}

func BenchmarkMatchOnlyCold8k(b *testing.B) {
	ix, ps, ids := coldMatchIndex(b)
	keys := make([][]uint64, len(ps))
	for k, p := range ps {
		keys[k] = blockhash.Keys(p, 16, 0)
	}
	out := make([]Match, len(ids))
	var scratch []int32
	i := 0
	cpuLoop(b, func() {
		scratch = ix.MatchPrefix(keys[i%len(ps)][:511], ids, out, scratch)
		i++
	})
}

func BenchmarkHashOnlyCold8k(b *testing.B) {
	_, ps, _ := coldMatchIndex(b)
	keys := make([]uint64, 0, 512)
	i := 0
	cpuLoop(b, func() {
		keys = blockhash.AppendKeys(keys[:0], ps[i%len(ps)], 16, 0)
		i++
	})
}

func BenchmarkMatchOnlyHot8k(b *testing.B) {
	ix, ps, ids := coldMatchIndex(b)
	keys := blockhash.Keys(ps[0], 16, 0)
	out := make([]Match, len(ids))
	var scratch []int32
	cpuLoop(b, func() {
		scratch = ix.MatchPrefix(keys[:511], ids, out, scratch)
	})
}
