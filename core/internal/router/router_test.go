package router

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/blockhash"
	"github.com/kvc-router/kvc-router/core/internal/index"
	"github.com/kvc-router/kvc-router/core/internal/load"
	"github.com/kvc-router/kvc-router/core/internal/strategy"
)

func mustNew(t testing.TB, cfg Config, servers ...string) *Router {
	t.Helper()
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.AddServers(servers); err != nil {
		t.Fatal(err)
	}
	return r
}

func acq(t testing.TB, r *Router, id string, tokens ...int32) string {
	t.Helper()
	d, err := r.Acquire(Request{ID: id, Tokens: tokens, Pin: -1})
	if err != nil {
		t.Fatalf("acquire %q: %v", id, err)
	}
	return d.Server
}

func TestDefaultModeReproducesVerl(t *testing.T) {
	three := []string{"s0", "s1", "s2"}
	cases := []struct {
		name string
		run  func(t *testing.T, r *Router)
	}{
		{"distributes across servers", func(t *testing.T, r *Router) {
			got := []string{acq(t, r, "r0"), acq(t, r, "r1"), acq(t, r, "r2")}
			if strings.Join(got, ",") != "s0,s1,s2" {
				t.Fatalf("got %v", got)
			}
		}},
		{"new requests route to least loaded", func(t *testing.T, r *Router) {
			for i := 0; i < 3; i++ {
				if s := acq(t, r, "a"); s != "s0" {
					t.Fatalf("sticky a -> %s", s)
				}
			}
			if r.Inflight("s0") != 3 {
				t.Fatalf("s0 inflight %d", r.Inflight("s0"))
			}
			if s := acq(t, r, "b"); s != "s1" {
				t.Fatalf("b -> %s", s)
			}
			if s := acq(t, r, "d"); s != "s2" {
				t.Fatalf("d -> %s", s)
			}
		}},
		{"release rebalances", func(t *testing.T, r *Router) {
			a, b := acq(t, r, "r0"), acq(t, r, "r1")
			r.Release(a)
			r.Release(b)
			if c, d := acq(t, r, "r2"), acq(t, r, "r3"); c == d {
				t.Fatalf("r2, r3 both on %s", c)
			}
		}},
		{"release of unknown or idle server is silent", func(t *testing.T, r *Router) {
			if r.Release("nonexistent") || r.Release("s1") {
				t.Fatal("release must be a no-op")
			}
			if r.TotalInflight() != 0 {
				t.Fatal("counts went negative or changed")
			}
		}},
		{"sticky survives release", func(t *testing.T, r *Router) {
			s := acq(t, r, "conv-abc")
			r.Release(s)
			acq(t, r, "other")
			if s2 := acq(t, r, "conv-abc"); s2 != s {
				t.Fatalf("sticky moved %s -> %s", s, s2)
			}
		}},
		{"removed server invalidates sticky lazily", func(t *testing.T, r *Router) {
			acq(t, r, "occupy")
			s := acq(t, r, "sticky-req")
			if s != "s1" {
				t.Fatalf("first %s", s)
			}
			r.Release(s)
			r.RemoveServers([]string{"s1"})
			if s := acq(t, r, "sticky-req"); s != "s0" {
				t.Fatalf("after removal %s", s)
			}
			if r.Status().Counters.StickyStale != 1 {
				t.Fatal("stale binding not counted")
			}
		}},
		{"remove then acquire picks first", func(t *testing.T, r *Router) {
			r.RemoveServers([]string{"s1", "unknown"})
			if s := acq(t, r, "r1"); s != "s0" {
				t.Fatalf("got %s", s)
			}
			if got := strings.Join(r.Servers(), ","); got != "s0,s2" {
				t.Fatalf("servers %s", got)
			}
		}},
		{"re-add appends and resets count", func(t *testing.T, r *Router) {
			acq(t, r, "x")
			r.RemoveServers([]string{"s1"})
			_ = r.AddServers([]string{"s1"})
			if got := strings.Join(r.Servers(), ","); got != "s0,s2,s1" {
				t.Fatalf("order %s", got)
			}
			_ = r.AddServers([]string{"s0"})
			if r.Inflight("s0") != 0 || strings.Join(r.Servers(), ",") != "s0,s2,s1" {
				t.Fatal("re-adding a present server keeps position and zeroes count")
			}
		}},
		{"empty pool error text", func(t *testing.T, r *Router) {
			r.RemoveServers(three)
			_, err := r.Acquire(Request{ID: "r", Pin: -1})
			if !errors.Is(err, ErrNoServers) || err.Error() != "No available servers in load balancer" {
				t.Fatalf("err %v", err)
			}
			_ = r.AddServers([]string{"s9"})
			if s := acq(t, r, "r"); s != "s9" {
				t.Fatalf("after re-add %s", s)
			}
		}},
		{"clear sticky keeps counts", func(t *testing.T, r *Router) {
			acq(t, r, "a")
			acq(t, r, "b")
			n, loads := r.ClearSticky()
			if n != 2 || len(loads) != 3 || loads[0].Inflight != 1 || loads[1].Inflight != 1 {
				t.Fatalf("cleared %d loads %+v", n, loads)
			}
			if r.TotalInflight() != 2 {
				t.Fatal("counts changed")
			}
			if s := acq(t, r, "a"); s != "s2" {
				t.Fatalf("a rebound to %s, want least loaded s2", s)
			}
		}},
		{"load is ignored for sticky in default mode", func(t *testing.T, r *Router) {
			acq(t, r, "a")
			r.UpdateMetrics("s0", load.Metrics{Running: 1000, Waiting: 1000, KVUsage: 1, HasKVUsage: true})
			for i := 0; i < 5; i++ {
				if s := acq(t, r, "a"); s != "s0" {
					t.Fatalf("default mode broke stickiness: %s", s)
				}
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			servers := three
			if strings.Contains(c.name, "invalidates sticky") {
				servers = three[:2] // verl's peer test uses two servers here
			}
			c.run(t, mustNew(t, Config{}, servers...))
		})
	}
}

func TestStickyLRUSemantics(t *testing.T) {
	r := mustNew(t, Config{StickyMaxSize: 2}, "s0", "s1", "s2")
	acq(t, r, "a") // s0
	acq(t, r, "b") // s1
	acq(t, r, "a") // sticky read refreshes a; b is now least recent
	acq(t, r, "c") // s2, evicts b
	r.Release("s2")
	// counts: s0=2 s1=1 s2=0. A sticky b would return s1.
	if s := acq(t, r, "b"); s != "s2" {
		t.Fatalf("b should have been evicted and re-picked on s2, got %s", s)
	}
	// Binding b evicted a (c was more recent): a is re-picked on s1.
	if s := acq(t, r, "a"); s != "s1" {
		t.Fatalf("a should have been evicted, got %s", s)
	}
	if r.Status().StickySize != 2 {
		t.Fatal("sticky size bound")
	}
}

func TestPinned(t *testing.T) {
	r := mustNew(t, Config{}, "s0", "s1", "s2")
	d, _ := r.Acquire(Request{ID: "a", Pin: 4})
	if d.Server != "s1" || d.Reason != ReasonPinned {
		t.Fatalf("%+v", d)
	}
	d, _ = r.Acquire(Request{ID: "a", Pin: 0})
	if d.Server != "s1" || d.Reason != ReasonSticky {
		t.Fatalf("sticky must win over pin: %+v", d)
	}
}

func prompt(n int, base int32) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = base + int32(i)
	}
	return p
}

// serverIndexID is a pool member's id in the index.
func serverIndexID(r *Router, server string) (index.ServerID, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.byID[server]
	if !ok {
		return 0, false
	}
	return s.ix, true
}

// storeOn feeds BlockStored events for the prompt's full blocks.
func storeOn(t testing.TB, r *Router, server string, tokens []int32, bs int) {
	t.Helper()
	id, ok := serverIndexID(r, server)
	if !ok {
		t.Fatalf("unknown %s", server)
	}
	nb := len(tokens) / bs
	hashes := make([]uint64, nb)
	for i := range hashes {
		hashes[i] = uint64(i+1)*1000 + uint64(id)
	}
	ns := blockhash.Namespace(r.Config().Model, "")
	if err := r.ix.Stored(id, index.GPU, false, 0, hashes, tokens[:nb*bs], bs, ns); err != nil {
		t.Fatal(err)
	}
}

func kvcConfig() Config {
	f := false
	return Config{Mode: ModeKVCAware, Model: "m", EventsDefault: true, Speculate: &f}
}

func TestKVCAwareRouting(t *testing.T) {
	t.Run("prefix holder wins", func(t *testing.T) {
		r := mustNew(t, kvcConfig(), "s0", "s1", "s2")
		p := prompt(256, 1)
		storeOn(t, r, "s2", p, 16)
		d, err := r.Acquire(Request{ID: "x", Tokens: p, Pin: -1})
		if err != nil || d.Server != "s2" || d.HitBlocks[0] != 15 || d.HittableBlocks != 15 || d.Reason != ReasonScored {
			t.Fatalf("%+v %v", d, err)
		}
	})
	t.Run("partial prefix still counts", func(t *testing.T) {
		r := mustNew(t, kvcConfig(), "s0", "s1")
		storeOn(t, r, "s1", prompt(64, 1), 16)
		p := append(prompt(64, 1), prompt(64, 500)...)
		if s := acq(t, r, "y", p...); s != "s1" {
			t.Fatalf("got %s", s)
		}
	})
	t.Run("other lora namespace does not match", func(t *testing.T) {
		r := mustNew(t, kvcConfig(), "s0", "s1")
		p := prompt(64, 1)
		storeOn(t, r, "s1", p, 16)
		d, _ := r.Acquire(Request{ID: "z", Tokens: p, Pin: -1, Lora: "alice"})
		if d.Server != "s0" || d.HitBlocks[0] != 0 {
			t.Fatalf("%+v", d)
		}
	})
	t.Run("server block size from metrics", func(t *testing.T) {
		r := mustNew(t, kvcConfig(), "s0", "s1")
		r.UpdateMetrics("s1", load.Metrics{BlockSize: 32, HasKVUsage: true})
		r.UpdateMetrics("s0", load.Metrics{BlockSize: 16, HasKVUsage: true})
		p := prompt(320, 1)
		storeOn(t, r, "s1", p, 32)
		d, _ := r.Acquire(Request{ID: "b", Tokens: p, Pin: -1})
		if d.Server != "s1" || d.BlockSize != 32 || d.HitBlocks[0] != 9 {
			t.Fatalf("%+v", d)
		}
	})
	t.Run("reset cache forgets prefixes", func(t *testing.T) {
		r := mustNew(t, kvcConfig(), "s0", "s1")
		p := prompt(64, 1)
		storeOn(t, r, "s1", p, 16)
		r.ResetCache()
		d, _ := r.Acquire(Request{ID: "c", Tokens: p, Pin: -1})
		if d.Server != "s0" || d.HitBlocks[0] != 0 {
			t.Fatalf("%+v", d)
		}
	})
}

func TestSpeculativeSiblings(t *testing.T) {
	// No events: approximate, speculation on. group_spread and task_spread
	// 0 keep the group together, so every sibling must find the speculated
	// blocks.
	cfg := Config{Mode: ModeKVCAware, Strategies: []StrategySpec{{Name: "kvc_aware", Weight: 1, Params: []byte(`{"group_spread":0,"task_spread":0}`)}}}
	r := mustNew(t, cfg, "s0", "s1", "s2", "s3")
	a, b := prompt(1024, 1), prompt(1024, 90000)
	first := acq(t, r, "a0", a...)
	for i := 1; i < 16; i++ {
		if s := acq(t, r, fmt.Sprint("a", i), a...); s != first {
			t.Fatalf("sibling %d went to %s, first to %s", i, s, first)
		}
	}
	if s := acq(t, r, "b0", b...); s == first {
		t.Fatalf("unrelated prompt piled onto the loaded server %s", s)
	}
	st := r.Status()
	if !st.Approximate || st.Counters.PredictedHits == 0 {
		t.Fatalf("status %+v", st.Counters)
	}
}

func TestStickyOverloadBreakout(t *testing.T) {
	r := mustNew(t, kvcConfig(), "s0", "s1")
	p := prompt(128, 1)
	if s := acq(t, r, "conv", p...); s != "s0" {
		t.Fatalf("first turn %s", s)
	}
	r.UpdateMetrics("s1", load.Metrics{HasKVUsage: true})
	// Sticky honoured below the threshold.
	r.UpdateMetrics("s0", load.Metrics{Running: 200, KVUsage: 0.5, HasKVUsage: true})
	if d, _ := r.Acquire(Request{ID: "conv", Tokens: p, Pin: -1}); d.Server != "s0" || d.Reason != ReasonSticky {
		t.Fatalf("%+v", d)
	}
	// Overloaded: re-scored and re-bound.
	r.UpdateMetrics("s0", load.Metrics{Running: 256, Waiting: 300, KVUsage: 0.99, HasKVUsage: true})
	d, _ := r.Acquire(Request{ID: "conv", Tokens: p, Pin: -1})
	if d.Server != "s1" || d.Reason != ReasonRebalanced {
		t.Fatalf("%+v", d)
	}
	if d, _ := r.Acquire(Request{ID: "conv", Tokens: p, Pin: -1}); d.Server != "s1" || d.Reason != ReasonSticky {
		t.Fatalf("new binding not kept: %+v", d)
	}
	if r.Status().Counters.StickyBroken != 1 {
		t.Fatal("breakout not counted")
	}
}

func TestUnhealthyServersSkipped(t *testing.T) {
	r := mustNew(t, kvcConfig(), "s0", "s1")
	p := prompt(64, 1)
	storeOn(t, r, "s0", p, 16)
	for i := 0; i < 3; i++ {
		r.ld.Fail("s0", errors.New("connection refused"))
	}
	if s := acq(t, r, "q", p...); s != "s1" {
		t.Fatalf("routed to unhealthy server: %s", s)
	}
	for i := 0; i < 3; i++ {
		r.ld.Fail("s1", errors.New("down"))
	}
	// All unhealthy: still serve (fail open) rather than error.
	if _, err := r.Acquire(Request{ID: "q2", Tokens: p, Pin: -1}); err != nil {
		t.Fatal(err)
	}
}

func TestRejectsOversizedPrompt(t *testing.T) {
	r := mustNew(t, Config{MaxPromptTokens: 10}, "s0")
	if _, err := r.Acquire(Request{ID: "a", Tokens: prompt(11, 0), Pin: -1}); !errors.Is(err, ErrPromptTooLong) {
		t.Fatalf("err %v", err)
	}
	if r.TotalInflight() != 0 || r.Status().Counters.Rejected != 1 {
		t.Fatal("rejected request counted in flight")
	}
}

func TestConfigErrors(t *testing.T) {
	cases := []struct{ json, want string }{
		{`{"mode": "magic"}`, "mode"},
		{`{"sticky_max_size": -1}`, "sticky_max_size"},
		{`{"block_size": -16}`, "block_size"},
		{`{"unknown_key": 1}`, "unknown_key"},
		{`{"mode": "kvc_aware", "strategies": [{"name": "kvc_aware", "weight": 0}]}`, "weight"},
		{`{"strategies": [{"name": "kvc_aware", "weight": 1}]}`, "needs mode kvc_aware"},
		{`{"strategies": [{"name": "os.system", "weight": 1}]}`, "unknown strategy"},
		{`{"mode": "kvc_aware", "strategies": [{"name": "kvc_aware", "weight": 1, "params": {"alpha": 3}}]}`, "alpha"},
		{`{"index": {"max_entries": -5}}`, "index.max_entries"},
		{`{"load_threshold": 2}`, "load_threshold"},
		{`{"session_move_tokens": 1.5}`, "session_move_tokens"},
		{`{"session_move_tokens": -1}`, "session_move_tokens"},
		{`{"session_move_tokens": 1001}`, "session_move_tokens"},
		{`{"mode": `, "invalid config"},
	}
	for _, c := range cases {
		cfg, err := ParseConfig([]byte(c.json))
		if err == nil {
			_, err = New(cfg)
		}
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, ErrConfig) {
			t.Errorf("%s: err %v, want ErrConfig mentioning %q", c.json, err, c.want)
		}
	}
	cfg, err := ParseConfig([]byte(`{"mode":"kvc_aware","strategies":[{"name":"kvc_aware","weight":1,"params":{"alpha":0.5,"load_threshold":0.8}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(cfg)
	if err != nil || r.Status().LoadThreshold != 0.8 {
		t.Fatalf("threshold from strategy: %v %+v", err, r.Status())
	}
}

func TestConcurrentAcquireRelease(t *testing.T) {
	cfg := Config{Mode: ModeKVCAware, EventsDefault: true}
	r := mustNew(t, cfg, "s0", "s1", "s2", "s3")
	var wg sync.WaitGroup
	stop := make(chan struct{})
	// Event and metrics writers race with routing.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			s := fmt.Sprint("s", i%4)
			storeOn(t, r, s, prompt(128, int32(i%7)), 16)
			r.UpdateMetrics(s, load.Metrics{Running: float64(i % 50), HasKVUsage: true, KVUsage: 0.3})
			if i%50 == 0 {
				if w, ok := r.EventWriter(s); ok {
					_ = w.Cleared()
				}
			}
		}
	}()
	var clients sync.WaitGroup
	for g := 0; g < 8; g++ {
		clients.Add(1)
		go func(g int) {
			defer clients.Done()
			for i := 0; i < 500; i++ {
				d, err := r.Acquire(Request{ID: fmt.Sprint(g, "-", i%20), Tokens: prompt(128, int32(i%7)), Pin: -1})
				if err != nil {
					t.Error(err)
					return
				}
				if i%100 == 0 {
					_ = r.Status()
				}
				r.Release(d.Server)
			}
		}(g)
	}
	clients.Wait()
	close(stop)
	wg.Wait()
	if n := r.TotalInflight(); n != 0 {
		t.Fatalf("in-flight leaked: %d", n)
	}
	if c := r.Status().Counters; c.Acquires != 4000 || c.Releases != 4000 {
		t.Fatalf("counters %+v", c)
	}
}

func TestStatusReportsState(t *testing.T) {
	now := time.Unix(1000, 0)
	r := mustNew(t, Config{Mode: ModeKVCAware, Now: func() time.Time { return now }}, "s0")
	r.UpdateMetrics("s0", load.Metrics{Running: 2, Waiting: 1, KVUsage: 0.25, HasKVUsage: true, PrefixQueries: 100, PrefixHits: 40, BlockSize: 16, NumGPUBlocks: 1000})
	acq(t, r, "a", prompt(64, 1)...)
	st := r.Status()
	s := st.Servers[0]
	if st.Mode != "kvc_aware" || !st.Approximate || st.TotalInflight != 1 || s.PrefixHitRate != 0.4 || s.Running != 2 || !s.Load.Fresh {
		t.Fatalf("%+v", st)
	}
	if st.Index.Entries != 4 || st.Index.Servers[0].Capacity != 1000 {
		t.Fatalf("index %+v", st.Index)
	}
}

func TestEmptyRequestIDIsBoundLikeVerl(t *testing.T) {
	r := mustNew(t, Config{}, "s0", "s1")
	if s := acq(t, r, ""); s != "s0" {
		t.Fatal(s)
	}
	if s := acq(t, r, ""); s != "s0" {
		t.Fatalf("empty id not sticky: %s", s)
	}
	d, _ := r.Acquire(Request{Pin: -1, Probe: true})
	if d.Server != "s1" || r.Status().StickySize != 1 {
		t.Fatalf("probe must neither read nor write bindings: %+v", d)
	}
}

// TestBreakoutAgreesWithScores: the sticky breakout must see a server as
// overloaded exactly when the configured kvc_aware strategy penalises it in
// its scores, whatever kv_tokens and token_load say (the breakout once used
// token load with the default kv_tokens regardless of the configuration).
func TestBreakoutAgreesWithScores(t *testing.T) {
	cases := []struct {
		name     string
		params   string
		capacity int // s0's KV capacity from its metrics; 0 = no metrics
		promptN  int
		broken   bool
	}{
		{"small kv_tokens: token load over threshold", `{"kv_tokens":1000,"group_spread":0}`, 0, 950, true},
		{"small kv_tokens: token load under threshold", `{"kv_tokens":1000,"group_spread":0}`, 0, 500, false},
		{"token_load off: KV pressure ignored", `{"token_load":false,"group_spread":0}`, 160, 150, false},
		{"token_load on: capacity from metrics", `{"group_spread":0}`, 160, 150, true},
		{"token_load off with small kv_tokens", `{"token_load":false,"kv_tokens":1000,"group_spread":0}`, 0, 950, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := kvcConfig()
			cfg.Strategies = []StrategySpec{{Name: "kvc_aware", Weight: 1, Params: []byte(tc.params)}}
			r := mustNew(t, cfg, "s0", "s1")
			if tc.capacity > 0 {
				r.UpdateMetrics("s0", load.Metrics{KVCacheSizeTokens: tc.capacity, BlockSize: 16, HasKVUsage: true, At: time.Now()})
				r.UpdateMetrics("s1", load.Metrics{KVCacheSizeTokens: 1 << 20, BlockSize: 16, HasKVUsage: true, At: time.Now()})
			}
			p := prompt(tc.promptN, 1)
			if s := acq(t, r, "conv", p...); s != "s0" {
				t.Fatalf("first turn on %s", s)
			}
			// What the strategy itself thinks of the bound server now.
			req := Request{ID: "conv", Tokens: p, Pin: -1}
			r.mu.Lock()
			n, _ := r.fillCandidates(&req)
			r.strat.Score(&strategy.Request{ID: req.ID, Tokens: req.Tokens}, r.cands[:n], r.scores[:n])
			penalised := r.scores[0] <= 0 // kvc_aware subtracts 1 above the threshold
			r.mu.Unlock()
			if penalised != tc.broken {
				t.Fatalf("strategy penalises s0: %v, want %v (score %v)", penalised, tc.broken, r.scores[0])
			}
			d, err := r.Acquire(req)
			if err != nil {
				t.Fatal(err)
			}
			want := ReasonSticky
			if tc.broken {
				want = ReasonRebalanced
			}
			if d.Reason != want {
				t.Fatalf("breakout disagrees with the scores: reason %q on %s, want %q", d.Reason, d.Server, want)
			}
		})
	}
}
