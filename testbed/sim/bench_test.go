package sim

import (
	"strconv"
	"testing"
)

// benchWorkload drives b.N requests through the engine on a virtual clock:
// 64 shared 256-token prefixes, 64-token unique suffixes, 32 output tokens,
// with a backlog of up to 512 waiting requests. It reports simulated
// requests per wall second (the scheduling-throughput target is >= 50k/s).
func benchWorkload(b *testing.B, cfg Config) {
	e, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	const prefixes, prefixLen, suffixLen, outLen = 64, 256, 64, 32
	ids := make([]string, b.N)
	for i := range ids {
		ids[i] = "r" + strconv.Itoa(i)
	}
	prompt := make([]int32, prefixLen+suffixLen)
	b.ReportAllocs()
	b.ResetTimer()
	now := 0.0
	next, done, steps := 0, 0, 0
	var tokens int64
	for done < b.N {
		for next < b.N && e.Stats().Waiting < 512 {
			g := next % prefixes
			for j := 0; j < prefixLen; j++ {
				prompt[j] = int32(g*1000 + j)
			}
			for j := prefixLen; j < len(prompt); j++ {
				prompt[j] = int32(next*7 + j)
			}
			if err := e.Submit(Request{ID: ids[next], Prompt: prompt, MaxTokens: outLen, Arrival: now}); err != nil {
				b.Fatal(err)
			}
			next++
		}
		r := e.Step(now)
		now += r.Duration
		steps++
		tokens += int64(len(r.Tokens))
		done += len(r.Finished)
	}
	b.StopTimer()
	sec := b.Elapsed().Seconds()
	b.ReportMetric(float64(b.N)/sec, "req/s")
	b.ReportMetric(float64(steps)/sec, "steps/s")
	b.ReportMetric(float64(tokens)/sec, "gen_tok/s")
	b.ReportMetric(now/float64(b.N)*1e3, "sim_ms/req")
}

func BenchmarkEngine(b *testing.B) {
	b.Run("gpu", func(b *testing.B) { benchWorkload(b, Config{NumGPUBlocks: 8192}) })
	b.Run("gpu_noevents", func(b *testing.B) { benchWorkload(b, Config{NumGPUBlocks: 8192, DisableEvents: true}) })
	b.Run("small_cache_tiers", func(b *testing.B) {
		benchWorkload(b, Config{NumGPUBlocks: 2048, CPUBlocks: 4096, SSDBlocks: 16384})
	})
}
