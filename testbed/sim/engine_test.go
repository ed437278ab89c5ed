package sim

import (
	"errors"
	"fmt"
	"github.com/kvc-router/kvc-router/core/kvcrouter"
	"math/rand/v2"
	"testing"
)

// seqTokens returns n tokens start, start+1, ...
func seqTokens(start, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(start + i)
	}
	return out
}

func newEngine(t testing.TB, cfg Config) *Engine {
	t.Helper()
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// drain steps until idle and returns completions by id plus all events.
func drain(t testing.TB, e *Engine, now *float64) (map[string]Completion, []kvcrouter.Event) {
	t.Helper()
	done := map[string]Completion{}
	var evs []kvcrouter.Event
	for i := 0; e.HasWork(); i++ {
		if i > 1_000_000 {
			t.Fatal("engine does not drain")
		}
		res := e.Step(*now)
		*now += res.Duration
		evs = append(evs, res.Events...)
		for _, c := range res.Finished {
			done[c.ID] = c
		}
		if t, ok := t.(*testing.T); ok {
			checkInvariants(t, e)
		}
	}
	return done, evs
}

func run1(t *testing.T, e *Engine, now *float64, id string, prompt []int32, maxTokens int) Completion {
	t.Helper()
	if err := e.Submit(Request{ID: id, Prompt: prompt, MaxTokens: maxTokens, Arrival: *now}); err != nil {
		t.Fatal(err)
	}
	done, _ := drain(t, e, now)
	c, ok := done[id]
	if !ok {
		t.Fatalf("%s did not finish", id)
	}
	return c
}

func TestPrefixHitSemantics(t *testing.T) {
	const bs = 16
	tests := []struct {
		name       string
		first      []int32
		second     []int32
		maxTokens  int
		wantFirst  int
		wantSecond int
	}{
		{"exact k blocks hits k-1", seqTokens(1, 4*bs), seqTokens(1, 4*bs), 1, 0, 3 * bs},
		{"k blocks plus tail hits k", seqTokens(1, 4*bs+5), seqTokens(1, 4*bs+5), 1, 0, 4 * bs},
		{"one block prompt hits nothing", seqTokens(1, bs), seqTokens(1, bs), 1, 0, 0},
		{"shorter than a block", seqTokens(1, 7), seqTokens(1, 7), 3, 0, 0},
		{"shared prefix only", seqTokens(1, 3*bs), append(seqTokens(1, 2*bs), seqTokens(500, bs+1)...), 1, 0, 2 * bs},
		{"different first block", seqTokens(1, 3*bs), seqTokens(2, 3*bs), 1, 0, 0},
		// Generated tokens fill and cache blocks: a 31-token prompt with 18
		// outputs computes KV for 48 tokens = 3 full blocks, the last two
		// holding generated tokens; the follow-up prompt hits all three.
		{"generated tokens are cached", seqTokens(1, 2*bs-1), nil, 18, 0, 3 * bs},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, Config{NumGPUBlocks: 64})
			now := 0.0
			c1 := run1(t, e, &now, "a", tc.first, tc.maxTokens)
			if c1.CachedTokens != tc.wantFirst {
				t.Fatalf("first cached %d want %d", c1.CachedTokens, tc.wantFirst)
			}
			second := tc.second
			if second == nil { // prompt = first prompt + its output + 1 token
				second = append(append(append([]int32{}, tc.first...), c1.OutputTokens...), 7)
			}
			c2 := run1(t, e, &now, "b", second, 1)
			if c2.CachedTokens != tc.wantSecond {
				t.Fatalf("second cached %d want %d", c2.CachedTokens, tc.wantSecond)
			}
			st := e.Stats()
			if st.PrefixQueries != int64(len(tc.first)+len(second)) || st.PrefixHits != int64(tc.wantFirst+tc.wantSecond) {
				t.Fatalf("queries %d hits %d", st.PrefixQueries, st.PrefixHits)
			}
		})
	}
}

func TestEvictionLRU(t *testing.T) {
	const bs = 16
	// 8 blocks: A (3 blocks + 1 token -> 4 blocks), B the same, then C needs 4.
	e := newEngine(t, Config{NumGPUBlocks: 8})
	now := 0.0
	a := seqTokens(1000, 3*bs+1)
	b := seqTokens(2000, 3*bs+1)
	c := seqTokens(3000, 3*bs+1)
	run1(t, e, &now, "a", a, 1)
	run1(t, e, &now, "b", b, 1)
	// A was freed first, so its blocks are LRU and C takes them.
	_, evs := func() (map[string]Completion, []kvcrouter.Event) {
		if err := e.Submit(Request{ID: "c", Prompt: c, MaxTokens: 1}); err != nil {
			t.Fatal(err)
		}
		return drain(t, e, &now)
	}()
	removed := map[uint64]bool{}
	for _, ev := range evs {
		if ev.Kind == kvcrouter.EventRemoved {
			removed[ev.BlockHashes[0]] = true
		}
	}
	for _, h := range e.EngineHashes(a) {
		if !removed[h] {
			t.Fatalf("A block %x not evicted", h)
		}
	}
	for _, h := range e.EngineHashes(b) {
		if removed[h] {
			t.Fatalf("B block %x evicted before LRU A", h)
		}
	}
	if got := run1(t, e, &now, "b2", b, 1).CachedTokens; got != 3*bs {
		t.Fatalf("B hit %d want %d", got, 3*bs)
	}
	if got := run1(t, e, &now, "a2", a, 1).CachedTokens; got != 0 {
		t.Fatalf("A hit %d want 0 after eviction", got)
	}
}

func TestTierOffloadReload(t *testing.T) {
	const bs = 16
	tests := []struct {
		name       string
		cpu, ssd   int
		fillers    int
		wantMedium string
	}{
		{"cpu", 64, 0, 2, MediumCPU},
		{"ssd only", 0, 64, 2, MediumStorage},
		{"cpu spills to ssd", 4, 64, 4, MediumStorage},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, Config{NumGPUBlocks: 8, CPUBlocks: tc.cpu, SSDBlocks: tc.ssd})
			now := 0.0
			a := seqTokens(1, 3*bs+1)
			run1(t, e, &now, "a", a, 1)
			for i := 0; i < tc.fillers; i++ {
				run1(t, e, &now, fmt.Sprint("f", i), seqTokens(10000*(i+1), 7*bs+1), 1)
			}
			res := e.CachedBlocks()
			for _, h := range e.EngineHashes(a)[:3] {
				if res[CachedBlock{h, MediumGPU}] != 0 {
					t.Fatalf("block still on GPU")
				}
				if res[CachedBlock{h, tc.wantMedium}] != 1 {
					t.Fatalf("block not in %s: %v", tc.wantMedium, res)
				}
			}
			before := e.Stats()
			if err := e.Submit(Request{ID: "a2", Prompt: a, MaxTokens: 1}); err != nil {
				t.Fatal(err)
			}
			r := e.Step(now)
			if r.LoadedBlocks != 3 {
				t.Fatalf("loaded %d blocks", r.LoadedBlocks)
			}
			cfg := e.Config()
			load := cfg.CPULoadPerBlock
			if tc.wantMedium == MediumStorage {
				load = cfg.SSDLoadPerBlock
			}
			want := cfg.StepBase + cfg.PrefillPerToken*1 + 3*load
			if d := r.Duration - want; d > 1e-12 || d < -1e-12 {
				t.Fatalf("duration %g want %g", r.Duration, want)
			}
			if len(r.Finished) != 1 || r.Finished[0].CachedTokens != 3*bs {
				t.Fatalf("finished %+v", r.Finished)
			}
			after := e.Stats()
			if after.PrefixHits != before.PrefixHits || after.ExternalHits-before.ExternalHits != 3*bs ||
				after.ExternalQueries-before.ExternalQueries != int64(len(a)) {
				t.Fatalf("stats before %+v after %+v", before, after)
			}
			tierHits := after.CPUHitTokens + after.SSDHitTokens
			if tierHits != 3*bs {
				t.Fatalf("tier hit tokens %d", tierHits)
			}
			// Loaded blocks are registered on GPU again.
			res = e.CachedBlocks()
			for _, h := range e.EngineHashes(a)[:3] {
				if res[CachedBlock{h, MediumGPU}] != 1 {
					t.Fatal("reloaded block not on GPU")
				}
			}
		})
	}
}

func TestEventSemantics(t *testing.T) {
	const bs = 4
	e := newEngine(t, Config{BlockSize: bs, NumGPUBlocks: 6, MaxNumBatchedTokens: 8, CPUBlocks: 2})
	now := 0.0
	p := seqTokens(1, 3*bs+2) // 14 tokens; chunks of 8: blocks 0-1 then block 2
	if err := e.Submit(Request{ID: "a", Prompt: p, MaxTokens: 4}); err != nil {
		t.Fatal(err)
	}
	hs := e.EngineHashes(append(append([]int32{}, p...), 0, 0)) // only first 3 used
	r1 := e.Step(now)
	if len(r1.Events) != 1 {
		t.Fatalf("step1 events %+v", r1.Events)
	}
	ev := r1.Events[0]
	if ev.Kind != kvcrouter.EventStored || ev.HasParent || len(ev.BlockHashes) != 2 || ev.BlockHashes[0] != hs[0] ||
		ev.BlockHashes[1] != hs[1] || len(ev.TokenIDs) != 2*bs || ev.BlockSize != bs || ev.Medium != MediumGPU {
		t.Fatalf("step1 event %+v", ev)
	}
	r2 := e.Step(now)
	if len(r2.Events) != 1 || !r2.Events[0].HasParent || r2.Events[0].ParentBlockHash != hs[1] ||
		len(r2.Events[0].BlockHashes) != 1 || r2.Events[0].BlockHashes[0] != hs[2] ||
		fmt.Sprint(r2.Events[0].TokenIDs) != fmt.Sprint(p[2*bs:3*bs]) {
		t.Fatalf("step2 events %+v", r2.Events)
	}
	// Decode: tokens 14,15 computed -> block 3 full after 2 more steps.
	var got []kvcrouter.Event
	for e.HasWork() {
		got = append(got, e.Step(now).Events...)
	}
	if len(got) != 1 || got[0].ParentBlockHash != hs[2] || len(got[0].TokenIDs) != bs {
		t.Fatalf("decode events %+v", got)
	}
	// A different 6-block request evicts LRU blocks: per-block removals + CPU offload.
	if err := e.Submit(Request{ID: "b", Prompt: seqTokens(100, 5*bs+1), MaxTokens: 1}); err != nil {
		t.Fatal(err)
	}
	var evs []kvcrouter.Event
	for e.HasWork() {
		evs = append(evs, e.Step(now).Events...)
	}
	var removedGPU, storedCPU, removedCPU int
	for _, ev := range evs {
		switch {
		case ev.Kind == kvcrouter.EventRemoved && ev.Medium == MediumGPU:
			removedGPU++
			if len(ev.BlockHashes) != 1 {
				t.Fatal("removal not per block")
			}
		case ev.Kind == kvcrouter.EventStored && ev.Medium == MediumCPU:
			storedCPU++
			if len(ev.TokenIDs) != 0 || ev.HasParent || ev.BlockSize != 0 {
				t.Fatalf("CPU store should be token-less: %+v", ev)
			}
		case ev.Kind == kvcrouter.EventRemoved && ev.Medium == MediumCPU:
			removedCPU++
		}
	}
	if removedGPU != 4 || storedCPU != 4 || removedCPU != 2 {
		t.Fatalf("removedGPU %d storedCPU %d removedCPU %d", removedGPU, storedCPU, removedCPU)
	}
	evsReset, ok := e.ResetPrefixCache(false)
	if !ok || len(evsReset) != 1 || evsReset[0].Kind != kvcrouter.EventCleared {
		t.Fatalf("reset %v %+v", ok, evsReset)
	}
	if n := len(e.CachedBlocks()); n != 0 {
		t.Fatalf("%d blocks after reset", n)
	}
}

func TestResetWhileRunning(t *testing.T) {
	e := newEngine(t, Config{NumGPUBlocks: 64})
	now := 0.0
	p := seqTokens(1, 40)
	if err := e.Submit(Request{ID: "a", Prompt: p, MaxTokens: 10}); err != nil {
		t.Fatal(err)
	}
	e.Step(now)
	if _, ok := e.ResetPrefixCache(false); ok {
		t.Fatal("reset accepted while running")
	}
	if _, ok := e.ResetPrefixCache(true); !ok {
		t.Fatal("forced reset refused")
	}
	if e.Stats().Preemptions != 1 || len(e.CachedBlocks()) != 0 {
		t.Fatalf("stats %+v", e.Stats())
	}
	done, _ := drain(t, e, &now)
	if len(done["a"].OutputTokens) != 10 {
		t.Fatal("request did not finish after reset")
	}
}

func TestSubmitErrors(t *testing.T) {
	e := newEngine(t, Config{NumGPUBlocks: 4, BlockSize: 16})
	tests := []struct {
		name string
		req  Request
		want error
	}{
		{"empty prompt", Request{ID: "x", MaxTokens: 1}, ErrBadRequest},
		{"zero max tokens", Request{ID: "x", Prompt: []int32{1}}, ErrBadRequest},
		{"too long", Request{ID: "x", Prompt: seqTokens(1, 60), MaxTokens: 6}, ErrTooLong},
		{"fits exactly", Request{ID: "ok", Prompt: seqTokens(1, 60), MaxTokens: 5}, nil},
		{"duplicate", Request{ID: "ok", Prompt: []int32{1}, MaxTokens: 1}, ErrDuplicateID},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := e.Submit(tc.req); !errors.Is(err, tc.want) {
				t.Fatalf("got %v want %v", err, tc.want)
			}
		})
	}
	if _, err := New(Config{BlockSize: -1}); err == nil {
		t.Fatal("bad config accepted")
	}
}

func TestStepTime(t *testing.T) {
	cfg := Config{NumGPUBlocks: 100, BlockSize: 16, StepBase: 0.01, PrefillPerToken: 1e-4, DecodePerContextToken: 1e-5}
	e := newEngine(t, cfg)
	if err := e.Submit(Request{ID: "a", Prompt: seqTokens(1, 100), MaxTokens: 3}); err != nil {
		t.Fatal(err)
	}
	want := []float64{0.01 + 100*1e-4, 0.01 + 101*1e-5, 0.01 + 102*1e-5}
	for i, w := range want {
		r := e.Step(0)
		if d := r.Duration - w; d > 1e-12 || d < -1e-12 {
			t.Fatalf("step %d duration %g want %g", i, r.Duration, w)
		}
	}
	if e.HasWork() || e.Step(0).Duration != 0 {
		t.Fatal("idle step should take no time")
	}
	// Derived c: a full cache adds DecodeFullKV.
	d := newEngine(t, Config{NumGPUBlocks: 1000, BlockSize: 16}).Config()
	if got := d.DecodePerContextToken * 16000; got < DefaultDecodeFullKV*0.999 || got > DefaultDecodeFullKV*1.001 {
		t.Fatalf("derived c gives %g at full cache", got)
	}
}

func TestChunkedPrefillAndFirstToken(t *testing.T) {
	e := newEngine(t, Config{NumGPUBlocks: 200, MaxNumBatchedTokens: 100})
	if err := e.Submit(Request{ID: "a", Prompt: seqTokens(1, 250), MaxTokens: 2, Arrival: 0}); err != nil {
		t.Fatal(err)
	}
	now := 0.0
	var prefill []int
	var first float64 = -1
	for e.HasWork() {
		r := e.Step(now)
		now += r.Duration
		prefill = append(prefill, r.PrefillTokens)
		for _, tk := range r.Tokens {
			if tk.Index == 0 {
				first = now
			}
		}
		if len(r.Finished) == 1 && r.Finished[0].FirstTokenTime != first {
			t.Fatalf("first token time %g vs %g", r.Finished[0].FirstTokenTime, first)
		}
	}
	if fmt.Sprint(prefill) != "[100 100 50 0]" {
		t.Fatalf("prefill per step %v", prefill)
	}
}

func TestAbort(t *testing.T) {
	e := newEngine(t, Config{NumGPUBlocks: 64, MaxNumSeqs: 1})
	for _, id := range []string{"a", "b"} {
		if err := e.Submit(Request{ID: id, Prompt: seqTokens(1, 40), MaxTokens: 50}); err != nil {
			t.Fatal(err)
		}
	}
	e.Step(0)
	if !e.Abort("a") || !e.Abort("b") || e.Abort("c") {
		t.Fatal("abort results")
	}
	checkInvariants(t, e)
	if e.HasWork() || e.Stats().FreeGPUBlocks != 64 || e.Stats().Aborted != 2 {
		t.Fatalf("stats after abort %+v", e.Stats())
	}
}

func TestDeterminismAndSalt(t *testing.T) {
	runOnce := func(cfg Config) ([]int32, []uint64) {
		e := newEngine(t, cfg)
		now := 0.0
		if err := e.Submit(Request{ID: "a", Prompt: seqTokens(1, 50), MaxTokens: 20}); err != nil {
			t.Fatal(err)
		}
		done, evs := drain(t, e, &now)
		var hs []uint64
		for _, ev := range evs {
			hs = append(hs, ev.BlockHashes...)
		}
		return done["a"].OutputTokens, hs
	}
	o1, h1 := runOnce(Config{Seed: 1})
	o2, h2 := runOnce(Config{Seed: 1})
	o3, h3 := runOnce(Config{Seed: 1, HashSalt: 99})
	o4, _ := runOnce(Config{Seed: 2})
	if fmt.Sprint(o1) != fmt.Sprint(o2) || fmt.Sprint(h1) != fmt.Sprint(h2) {
		t.Fatal("not deterministic")
	}
	if fmt.Sprint(o1) != fmt.Sprint(o3) || fmt.Sprint(h1) == fmt.Sprint(h3) {
		t.Fatal("salt should change hashes only")
	}
	if fmt.Sprint(o1) == fmt.Sprint(o4) {
		t.Fatal("seed should change outputs")
	}
	for _, tok := range o1 {
		if tok < 0 || tok >= DefaultVocabSize {
			t.Fatalf("token %d out of vocab", tok)
		}
	}
}

// TestRandomWorkloads is the property test: random shared-prefix workloads
// under tight caches with every invariant checked after each step, events
// replayed into a multiset that must equal CachedBlocks().
func TestRandomWorkloads(t *testing.T) {
	configs := []Config{
		{BlockSize: 4, NumGPUBlocks: 40, MaxNumSeqs: 4, MaxNumBatchedTokens: 32},
		{BlockSize: 16, NumGPUBlocks: 64, MaxNumSeqs: 8, MaxNumBatchedTokens: 64, CPUBlocks: 16},
		{BlockSize: 8, NumGPUBlocks: 50, MaxNumSeqs: 16, MaxNumBatchedTokens: 128, CPUBlocks: 8, SSDBlocks: 24},
		{BlockSize: 2, NumGPUBlocks: 30, MaxNumSeqs: 3, MaxNumBatchedTokens: 7, SSDBlocks: 10},
	}
	for ci, cfg := range configs {
		for seed := uint64(1); seed <= 6; seed++ {
			t.Run(fmt.Sprintf("cfg%d/seed%d", ci, seed), func(t *testing.T) {
				randomWorkload(t, cfg, seed)
			})
		}
	}
}

func randomWorkload(t *testing.T, cfg Config, seed uint64) {
	cfg.Seed = seed
	e := newEngine(t, cfg)
	rng := rand.New(rand.NewPCG(seed, 7))
	bs := e.Config().BlockSize
	prefixes := make([][]int32, 5)
	for i := range prefixes {
		prefixes[i] = seqTokens(1000*(i+1), rng.IntN(6*bs)+1)
	}
	want := map[string]int{}
	ledger := map[CachedBlock]int{}
	apply := func(evs []kvcrouter.Event) {
		for _, ev := range evs {
			switch ev.Kind {
			case kvcrouter.EventStored:
				for _, h := range ev.BlockHashes {
					ledger[CachedBlock{h, ev.Medium}]++
				}
			case kvcrouter.EventRemoved:
				for _, h := range ev.BlockHashes {
					k := CachedBlock{h, ev.Medium}
					ledger[k]--
					if ledger[k] < 0 {
						t.Fatalf("removal of unknown block %v", k)
					}
					if ledger[k] == 0 {
						delete(ledger, k)
					}
				}
			case kvcrouter.EventCleared:
				clear(ledger)
			}
		}
	}
	now := 0.0
	next := 0
	var hitSum int64
	maxPrompt := e.Config().NumGPUBlocks * bs / 3
	for step := 0; step < 4000 && (next < 120 || e.HasWork()); step++ {
		for k := rng.IntN(4); k > 0 && next < 120; k-- {
			p := append([]int32{}, prefixes[rng.IntN(len(prefixes))]...)
			p = append(p, seqTokens(rng.IntN(1<<20), rng.IntN(3*bs))...)
			if len(p) > maxPrompt {
				p = p[:maxPrompt]
			}
			id := fmt.Sprint("r", next)
			mt := rng.IntN(3*bs) + 1
			if err := e.Submit(Request{ID: id, Prompt: p, MaxTokens: mt, Arrival: now}); err != nil {
				t.Fatal(err)
			}
			want[id] = mt
			next++
		}
		if rng.IntN(200) == 0 {
			evs, ok := e.ResetPrefixCache(rng.IntN(2) == 0)
			if ok {
				apply(evs)
			}
		}
		if rng.IntN(100) == 0 && next > 0 {
			id := fmt.Sprint("r", rng.IntN(next))
			if e.Abort(id) {
				delete(want, id)
			}
		}
		res := e.Step(now)
		now += res.Duration
		apply(res.Events)
		for _, c := range res.Finished {
			mt, ok := want[c.ID]
			if !ok {
				t.Fatalf("unexpected completion %s", c.ID)
			}
			if len(c.OutputTokens) != mt {
				t.Fatalf("%s produced %d tokens want %d", c.ID, len(c.OutputTokens), mt)
			}
			if c.CachedTokens >= c.PromptTokens || c.CachedTokens%bs != 0 {
				t.Fatalf("%s cached %d of %d", c.ID, c.CachedTokens, c.PromptTokens)
			}
			if c.FirstTokenTime < c.Arrival || c.FinishTime < c.FirstTokenTime {
				t.Fatalf("%s times %+v", c.ID, c)
			}
			hitSum += int64(c.CachedTokens)
			delete(want, c.ID)
		}
		checkInvariants(t, e)
		truth := e.CachedBlocks()
		if len(truth) != len(ledger) {
			t.Fatalf("step %d: events give %d blocks, engine has %d", step, len(ledger), len(truth))
		}
		for k, v := range truth {
			if ledger[k] != v {
				t.Fatalf("step %d: block %v engine %d events %d", step, k, v, ledger[k])
			}
		}
	}
	if len(want) != 0 || e.HasWork() {
		t.Fatalf("%d requests never finished", len(want))
	}
	st := e.Stats()
	if st.PrefixHits > st.PrefixQueries || st.ExternalHits > st.ExternalQueries {
		t.Fatalf("hits exceed queries: %+v", st)
	}
	// Completed requests' cached tokens account for all hits but those of
	// aborted requests.
	if hitSum > st.PrefixHits+st.ExternalHits {
		t.Fatalf("completion hits %d > counted %d", hitSum, st.PrefixHits+st.ExternalHits)
	}
	if st.Aborted == 0 && hitSum != st.PrefixHits+st.ExternalHits {
		t.Fatalf("completion hits %d != counted %d", hitSum, st.PrefixHits+st.ExternalHits)
	}
	if st.GPUHitTokens != st.PrefixHits || st.CPUHitTokens+st.SSDHitTokens != st.ExternalHits {
		t.Fatalf("tier split %+v", st)
	}
}

// checkInvariants verifies the block pool, tiers and request bookkeeping.
func checkInvariants(t *testing.T, e *Engine) {
	t.Helper()
	p := e.pool
	refs := make([]int32, p.n)
	held := 0
	for _, r := range e.run {
		if !r.running || r.done {
			t.Fatalf("running list holds %s in bad state", r.id)
		}
		if want := (r.computed + e.bs - 1) / e.bs; len(r.blocks) != want {
			t.Fatalf("%s holds %d blocks for %d computed tokens", r.id, len(r.blocks), r.computed)
		}
		if r.numCached > len(r.blocks) || r.numCached != r.computed/e.bs {
			t.Fatalf("%s numCached %d blocks %d computed %d", r.id, r.numCached, len(r.blocks), r.computed)
		}
		for i, id := range r.blocks {
			refs[id]++
			held++
			if i < r.numCached {
				b := p.b[id]
				if !b.cached || b.hash != r.hashes[i] {
					t.Fatalf("%s block %d not cached with its hash", r.id, i)
				}
			}
		}
		if len(r.tokens)-r.promptLen >= r.maxTokens {
			t.Fatalf("%s running with all tokens", r.id)
		}
	}
	if len(e.run) > e.cfg.MaxNumSeqs {
		t.Fatalf("running %d > max %d", len(e.run), e.cfg.MaxNumSeqs)
	}
	for i := e.wait.head; i < len(e.wait.buf); i++ {
		r := e.wait.buf[i]
		if r.running || len(r.blocks) != 0 || r.computed != 0 {
			t.Fatalf("waiting %s holds state", r.id)
		}
	}
	if e.wait.len()+len(e.run) != len(e.reqs) {
		t.Fatalf("requests map %d vs waiting %d + running %d", len(e.reqs), e.wait.len(), len(e.run))
	}
	// Free queue walk.
	inFree := make([]bool, p.n)
	n := 0
	for id := p.b[p.n].next; id != p.n; id = p.b[id].next {
		if inFree[id] {
			t.Fatal("free queue cycle")
		}
		inFree[id] = true
		n++
		if p.b[p.b[id].next].prev != id {
			t.Fatal("free queue links broken")
		}
	}
	if n != p.numFree {
		t.Fatalf("free queue has %d, numFree %d", n, p.numFree)
	}
	cached := 0
	for id := int32(0); id < p.n; id++ {
		b := p.b[id]
		if b.ref != refs[id] {
			t.Fatalf("block %d ref %d but held %d times", id, b.ref, refs[id])
		}
		if (b.ref == 0) != inFree[id] {
			t.Fatalf("block %d ref %d inFree %v", id, b.ref, inFree[id])
		}
		if b.cached {
			cached++
			found := false
			for cur := p.lookup(b.hash); cur >= 0; cur = p.b[cur].same {
				if cur == id {
					found = true
				}
				if p.b[cur].hash != b.hash || !p.b[cur].cached {
					t.Fatal("hash chain holds foreign block")
				}
			}
			if !found {
				t.Fatalf("cached block %d not reachable by hash", id)
			}
		}
	}
	if cached != p.cached {
		t.Fatalf("cached count %d vs %d", cached, p.cached)
	}
	distinct := 0
	for _, c := range refs {
		if c > 0 {
			distinct++
		}
	}
	if distinct+p.numFree != int(p.n) || held < distinct {
		t.Fatalf("capacity: %d held + %d free != %d blocks", distinct, p.numFree, p.n)
	}
	st := e.Stats()
	if st.KVUsage < 0 || st.KVUsage > 1 {
		t.Fatalf("kv usage %g", st.KVUsage)
	}
	for _, tr := range []*tier{e.cpu, e.ssd} {
		if tr == nil {
			continue
		}
		if tr.len() > len(tr.e)-1 || tr.len()+len(tr.free) != len(tr.e)-1 {
			t.Fatalf("tier %s size %d free %d cap %d", tr.medium, tr.len(), len(tr.free), len(tr.e)-1)
		}
		for h, i := range tr.m {
			if tr.e[i].hash != h || tr.e[i].pinned {
				t.Fatalf("tier %s entry broken", tr.medium)
			}
		}
	}
}

func TestPreemption(t *testing.T) {
	// 10 blocks of 4 tokens; 4 requests each growing to 5+ blocks.
	e := newEngine(t, Config{BlockSize: 4, NumGPUBlocks: 10, MaxNumSeqs: 4})
	for i := 0; i < 4; i++ {
		if err := e.Submit(Request{ID: fmt.Sprint(i), Prompt: seqTokens(100*i, 6), MaxTokens: 14}); err != nil {
			t.Fatal(err)
		}
	}
	now := 0.0
	done, _ := drain(t, e, &now)
	if e.Stats().Preemptions == 0 {
		t.Fatal("expected preemptions")
	}
	pre := 0
	for i := 0; i < 4; i++ {
		c := done[fmt.Sprint(i)]
		if len(c.OutputTokens) != 14 {
			t.Fatalf("request %d produced %d", i, len(c.OutputTokens))
		}
		pre += c.Preemptions
		// Outputs are the same as without preemption.
		for j, tok := range c.OutputTokens {
			if tok != sampleToken(sampleKey(0, 0, seqTokens(100*i, 6)), j, DefaultVocabSize) {
				t.Fatal("preemption changed outputs")
			}
		}
	}
	if int64(pre) != e.Stats().Preemptions {
		t.Fatalf("per-request preemptions %d vs %d", pre, e.Stats().Preemptions)
	}
}

func TestTokenize(t *testing.T) {
	a := Tokenize("hello  world foo", 100)
	b := Tokenize("hello world bar", 100)
	if len(a) != 3 || a[0] != b[0] || a[1] != b[1] {
		t.Fatalf("%v %v", a, b)
	}
	if got := Detokenize([]int32{0, 12, -3}); got != " t0 t12 t-3" {
		t.Fatal(got)
	}
}

// TestHBMStepTime checks the HBM model's terms one by one: prefill chunks
// pay attention over every earlier context token (a chunk behind a long
// context costs more than the same chunk at the start), and a decode step
// pays the linear cost per token plus KV bytes / bandwidth per context token.
func TestHBMStepTime(t *testing.T) {
	cfg := HBMModel(Config{NumGPUBlocks: 1000, BlockSize: 16, MaxNumBatchedTokens: 100, StepBase: 0.01, PrefillPerToken: 1e-4})
	e := newEngine(t, cfg)
	c := e.Config()
	if want := DefaultKVBytesPerToken / DefaultMemBandwidth; c.DecodePerContextToken != want {
		t.Fatalf("decode per context token %g, want KV bytes / bandwidth %g", c.DecodePerContextToken, want)
	}
	if err := e.Submit(Request{ID: "a", Prompt: seqTokens(1, 200), MaxTokens: 2}); err != nil {
		t.Fatal(err)
	}
	pairs := func(start, n float64) float64 { return n*start + n*(n+1)/2 }
	want := []float64{
		0.01 + 100*1e-4 + DefaultAttentionPerPair*pairs(0, 100),   // chunk 1: positions 0..99
		0.01 + 100*1e-4 + DefaultAttentionPerPair*pairs(100, 100), // chunk 2 attends to chunk 1 too
		0.01 + c.DecodePerToken + c.DecodePerContextToken*201,     // one decode at context 201
	}
	for i, w := range want {
		r := e.Step(0)
		if d := r.Duration - w; d > 1e-12 || d < -1e-12 {
			t.Fatalf("step %d duration %.9g want %.9g", i, r.Duration, w)
		}
	}
	if want[1] <= want[0] {
		t.Fatal("the attention term must grow with context")
	}
	if _, err := (Config{}).WithModel("gpu9000"); err == nil {
		t.Fatal("unknown engine model accepted")
	}
	// The default model is unchanged by the HBM fields' existence.
	d := newEngine(t, Config{NumGPUBlocks: 1000, BlockSize: 16}).Config()
	if d.AttentionPerPair != 0 || d.DecodePerToken != 0 {
		t.Fatal("the default model gained HBM terms")
	}
}

// TestSortWaiting: keyed waiting requests take the queue positions keyed
// requests held, in key order (ties in queue order); unkeyed ones stay put.
func TestSortWaiting(t *testing.T) {
	for _, tc := range []struct {
		name  string
		queue []string
		order map[string]int64
		want  []string
		n     int
	}{
		{"none", []string{"a", "b", "c"}, nil, []string{"a", "b", "c"}, 0},
		{"all reversed", []string{"c", "b", "a"}, map[string]int64{"a": 0, "b": 1, "c": 2}, []string{"a", "b", "c"}, 3},
		{"unkeyed keep their places", []string{"x", "c", "y", "a", "b"}, map[string]int64{"a": 1, "b": 2, "c": 3},
			[]string{"x", "a", "y", "b", "c"}, 3},
		{"ties keep queue order", []string{"b", "a", "c"}, map[string]int64{"a": 5, "b": 5, "c": 1}, []string{"c", "b", "a"}, 3},
		{"negative keys first", []string{"a", "b"}, map[string]int64{"a": 1, "b": -7}, []string{"b", "a"}, 2},
		{"keys of absent requests ignored", []string{"b", "a"}, map[string]int64{"a": 0, "b": 1, "gone": -1}, []string{"a", "b"}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t, Config{BlockSize: 4, NumGPUBlocks: 64, MaxNumSeqs: 1})
			for i, id := range tc.queue {
				if err := e.Submit(Request{ID: id, Prompt: seqTokens(10*i, 5), MaxTokens: 2}); err != nil {
					t.Fatal(err)
				}
			}
			if n := e.SortWaiting(tc.order); n != tc.n {
				t.Fatalf("placed %d, want %d", n, tc.n)
			}
			// One running slot: the requests finish in queue order.
			var got []string
			now := 0.0
			for e.HasWork() {
				res := e.Step(now)
				now += res.Duration
				for _, c := range res.Finished {
					got = append(got, c.ID)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("served %v, want %v", got, tc.want)
			}
		})
	}
}

// TestLazyClearEvent: with LazyClearEvent an idle engine's reset publishes
// AllBlocksCleared with its next step, ahead of that step's BlockStored (as
// vLLM's block pool queues it); without it the reset returns the event.
func TestLazyClearEvent(t *testing.T) {
	for _, lazy := range []bool{false, true} {
		t.Run(fmt.Sprintf("lazy=%v", lazy), func(t *testing.T) {
			e := newEngine(t, Config{NumGPUBlocks: 64, LazyClearEvent: lazy})
			now := 0.0
			if err := e.Submit(Request{ID: "a", Prompt: seqTokens(1, 40), MaxTokens: 2}); err != nil {
				t.Fatal(err)
			}
			drain(t, e, &now)
			evs, ok := e.ResetPrefixCache(false)
			if !ok || (len(evs) == 1) == lazy {
				t.Fatalf("reset %v returned %d events", ok, len(evs))
			}
			if err := e.Submit(Request{ID: "b", Prompt: seqTokens(100, 40), MaxTokens: 2}); err != nil {
				t.Fatal(err)
			}
			next := e.Step(now).Events
			var kinds []string
			for _, ev := range next {
				kinds = append(kinds, ev.TypeName)
			}
			cleared := len(kinds) > 0 && kinds[0] == "AllBlocksCleared"
			if cleared != lazy || len(kinds) == 0 || kinds[len(kinds)-1] != "BlockStored" {
				t.Fatalf("next step's events %v", kinds)
			}
			for _, ev := range e.Step(now).Events {
				if ev.Kind == kvcrouter.EventCleared {
					t.Fatal("the clear was published twice")
				}
			}
		})
	}
}
