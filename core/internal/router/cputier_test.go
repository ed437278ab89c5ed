package router

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/index"
)

// TestClearKeepsOtherServersCPUTier (issue 28's SGLang rollout test): an
// AllBlocksCleared from one server drops that server's records only. A
// prompt another server holds in its CPU tier (offloaded blocks, events
// with medium "CPU") still matches there in full, whatever speculation
// the router made about the cleared server (or the holder) before or after
// the clear, and however far the clock moves past the speculation TTL.
func TestClearKeepsOtherServersCPUTier(t *testing.T) {
	const bs, nb = 16, 8
	p := prompt(nb*bs+1, 7) // nb full blocks, all hittable
	other := prompt(nb*bs+1, 50_000)
	s1Hashes := engineHashes(101, nb)
	s0Hashes := engineHashes(101, nb) // an engine's hashes do not depend on the server

	type env struct {
		t      *testing.T
		r      *Router
		now    *time.Time
		w0, w1 sinkWriter
	}
	gpu := func(w func(env) sinkWriter, hashes []uint64) func(env) {
		return func(e env) {
			if err := w(e).Stored(index.GPU, false, 0, hashes, p[:nb*bs], bs, ""); err != nil {
				e.t.Fatal(err)
			}
		}
	}
	s0 := func(e env) sinkWriter { return e.w0 }
	s1 := func(e env) sinkWriter { return e.w1 }
	// SGLang HiCache / vLLM offload: a token-less CPU store of blocks the
	// GPU store bridged, then the GPU copies evicted.
	cpuTokenless := func(e env) {
		if err := e.w1.Stored(index.CPU, false, 0, s1Hashes, nil, 0, ""); err != nil {
			e.t.Fatal(err)
		}
	}
	cpuTokens := func(e env) {
		if err := e.w1.Stored(index.CPU, false, 0, s1Hashes, p[:nb*bs], bs, ""); err != nil {
			e.t.Fatal(err)
		}
	}
	// A CPU store in runs of 2 blocks, each anchored on the previous run.
	cpuChained := func(e env) {
		for i := 0; i < nb; i += 2 {
			if err := e.w1.Stored(index.CPU, i > 0, parentOf(s1Hashes, i), s1Hashes[i:i+2], p[i*bs:(i+2)*bs], bs, ""); err != nil {
				e.t.Fatal(err)
			}
		}
	}
	evictGPU := func(e env) {
		if err := e.w1.Removed(index.GPU, s1Hashes); err != nil {
			e.t.Fatal(err)
		}
	}
	clear0 := func(e env) {
		if err := e.w0.Cleared(); err != nil {
			e.t.Fatal(err)
		}
	}
	// pinTo routes the prompt (or another one) to pool[pin]: with
	// speculation on, the router presumes its blocks resident there.
	pinTo := func(pin int, tokens []int32) func(env) {
		return func(e env) {
			if _, err := e.r.Acquire(Request{ID: fmt.Sprintf("pin-%d-%d", pin, tokens[0]), Tokens: tokens, Pin: pin}); err != nil {
				e.t.Fatal(err)
			}
		}
	}
	advance := func(d time.Duration) func(env) {
		return func(e env) { *e.now = e.now.Add(d) }
	}
	const ttl = time.Second
	past := advance(ttl + 50*time.Millisecond)

	cases := []struct {
		name      string
		speculate bool
		steps     []func(env)
		want1     [index.NumTiers]int // s1's hit, per tier
		want0     [index.NumTiers]int // s0's hit, per tier
	}{
		{"cpu only with tokens", false,
			[]func(env){cpuTokens, clear0}, cpuHit(nb), none()},
		{"cpu only chained runs", false,
			[]func(env){cpuChained, clear0}, cpuHit(nb), none()},
		{"gpu then cpu tokenless then gpu evicted", false,
			[]func(env){gpu(s1, s1Hashes), cpuTokenless, evictGPU, clear0}, cpuHit(nb), none()},
		{"gpu then cpu with tokens then gpu evicted", false,
			[]func(env){gpu(s1, s1Hashes), cpuTokens, evictGPU, clear0}, cpuHit(nb), none()},
		{"gpu and cpu both held", false,
			[]func(env){gpu(s1, s1Hashes), cpuTokenless, clear0}, gpuHit(nb), none()},
		{"s0 held the prompt on gpu first", false,
			[]func(env){gpu(s0, s0Hashes), gpu(s1, s1Hashes), cpuTokenless, evictGPU, clear0}, cpuHit(nb), none()},
		{"s0 held the prompt on gpu last", false,
			[]func(env){gpu(s1, s1Hashes), cpuTokenless, evictGPU, gpu(s0, s0Hashes), clear0}, cpuHit(nb), none()},
		{"clear twice", false,
			[]func(env){gpu(s0, s0Hashes), cpuTokens, clear0, clear0}, cpuHit(nb), none()},
		{"speculated on s0 then cleared", true,
			[]func(env){gpu(s1, s1Hashes), cpuTokenless, evictGPU, pinTo(0, p), clear0}, cpuHit(nb), none()},
		{"speculated on s0 before the cpu events, then cleared", true,
			[]func(env){pinTo(0, p), gpu(s1, s1Hashes), cpuTokenless, evictGPU, clear0}, cpuHit(nb), none()},
		{"speculated on s0, cleared, speculated again", true,
			[]func(env){cpuTokens, pinTo(0, p), clear0, pinTo(0, p)}, cpuHit(nb), gpuHit(nb)},
		// Unexpired speculation counts as GPU (index.MatchPrefix's rule).
		{"speculated on s1 before its events", true,
			[]func(env){pinTo(1, p), gpu(s1, s1Hashes), cpuTokenless, evictGPU, pinTo(0, p), clear0}, gpuHit(nb), none()},
		{"speculated on s1 before its events, ttl passes", true,
			[]func(env){pinTo(1, p), gpu(s1, s1Hashes), cpuTokenless, evictGPU, pinTo(0, p), clear0, past}, cpuHit(nb), none()},
		{"speculation ttl passes, then clear", true,
			[]func(env){pinTo(1, p), pinTo(0, p), gpu(s1, s1Hashes), cpuTokenless, evictGPU, past, clear0}, cpuHit(nb), none()},
		{"clear, then ttl passes and both sweep", true,
			[]func(env){pinTo(0, p), pinTo(1, p), gpu(s1, s1Hashes), cpuTokenless, evictGPU, clear0, past,
				pinTo(0, other), pinTo(1, other)}, cpuHit(nb), none()},
		{"ttl passes long after, sweeps on both", true,
			[]func(env){cpuTokens, pinTo(0, p), clear0, pinTo(0, p), past, advance(24 * time.Hour),
				pinTo(0, other), pinTo(1, other), pinTo(0, prompt(nb*bs+1, 90_000))}, cpuHit(nb), none()},
		{"cleared before the cpu events arrive", true,
			[]func(env){pinTo(0, p), clear0, gpu(s1, s1Hashes), cpuTokenless, evictGPU, past, pinTo(1, other)}, cpuHit(nb), none()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Unix(1_000_000, 0)
			cfg := kvcConfig()
			cfg.BlockSize = bs
			cfg.Speculate = &tc.speculate
			cfg.Index.SpecTTLMS = int(ttl / time.Millisecond)
			cfg.Now = func() time.Time { return now }
			r := mustNew(t, cfg, "s0", "s1")
			e := env{t: t, r: r, now: &now, w0: writerOf(t, r, "s0"), w1: writerOf(t, r, "s1")}
			for _, step := range tc.steps {
				step(e)
			}
			hits := probeHits(t, r, p)
			if got := hits["s1"]; got != tc.want1 {
				t.Errorf("s1 hit %v, want %v (s1 residency %+v)", got, tc.want1, r.Residency("s1"))
			}
			if got := hits["s0"]; got != tc.want0 {
				t.Errorf("s0 hit %v, want %v (s0 residency %+v)", got, tc.want0, r.Residency("s0"))
			}
		})
	}
}

// TestResetCacheClearsEveryTier: a weight update (ResetCache) is the one
// clear meant for every server, CPU tier included.
func TestResetCacheClearsEveryTier(t *testing.T) {
	const bs, nb = 16, 4
	p := prompt(nb*bs+1, 3)
	r := mustNew(t, kvcConfig(), "s0", "s1")
	w1 := writerOf(t, r, "s1")
	if err := w1.Stored(index.CPU, false, 0, engineHashes(1, nb), p[:nb*bs], bs, ""); err != nil {
		t.Fatal(err)
	}
	if got := probeHits(t, r, p)["s1"]; got != cpuHit(nb) {
		t.Fatalf("before reset: s1 hit %v", got)
	}
	r.ResetCache()
	if got := probeHits(t, r, p)["s1"]; got != none() {
		t.Fatalf("after reset: s1 hit %v", got)
	}
}

type sinkWriter interface {
	Stored(tier index.Tier, hasParent bool, parent uint64, engineHashes []uint64, tokens []int32, blockSize int, lora string) error
	Removed(tier index.Tier, engineHashes []uint64) error
	Cleared() error
}

func writerOf(t *testing.T, r *Router, id string) sinkWriter {
	t.Helper()
	w, ok := r.EventWriter(id)
	if !ok {
		t.Fatalf("no event writer for %s", id)
	}
	return w
}

func engineHashes(base uint64, n int) []uint64 {
	h := make([]uint64, n)
	for i := range h {
		h[i] = base + uint64(i)
	}
	return h
}

func parentOf(hashes []uint64, i int) uint64 {
	if i == 0 {
		return 0
	}
	return hashes[i-1]
}

func cpuHit(n int) [index.NumTiers]int { return [index.NumTiers]int{index.CPU: n} }
func gpuHit(n int) [index.NumTiers]int { return [index.NumTiers]int{index.GPU: n} }
func none() [index.NumTiers]int        { return [index.NumTiers]int{} }

// probeHits asks the router (a probe: no binding read or written) and
// returns every candidate's predicted hit per tier, from the decision's
// explanation.
func probeHits(t *testing.T, r *Router, tokens []int32) map[string][index.NumTiers]int {
	t.Helper()
	if _, err := r.Acquire(Request{ID: "probe", Tokens: tokens, Pin: -1, Probe: true}); err != nil {
		t.Fatal(err)
	}
	ex := r.LastDecision()
	if ex == nil {
		t.Fatal("no decision explained")
	}
	out := make(map[string][index.NumTiers]int)
	for _, c := range ex.Candidates {
		out[c.Server] = c.HitBlocks
	}
	return out
}
