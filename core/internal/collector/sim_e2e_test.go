// An external test package: the simulator (testbed/sim) reaches the
// library through core/kvcrouter, which imports this package, so only a
// _test package may import both.
package collector_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	. "github.com/kvc-router/kvc-router/core/internal/collector"
	"github.com/kvc-router/kvc-router/core/internal/index"
	"github.com/kvc-router/kvc-router/core/internal/kvevents"
	"github.com/kvc-router/kvc-router/core/internal/router"
	"github.com/kvc-router/kvc-router/testbed/sim"
	"github.com/kvc-router/kvc-router/testbed/sim/server"
)

// The strongest end-to-end check the project has: real simulated vLLM
// servers on loopback, their /metrics parsed by our poller, their KV events
// decoded and applied by our subscriber, and the router's index compared
// with the engines' true cache contents.

type simFleet struct {
	t       *testing.T
	servers map[string]*server.Server
	r       *router.Router
	m       *Manager
}

func startSim(t *testing.T, addr string, layout kvevents.Layout, evEP, replayEP string) *server.Server {
	t.Helper()
	srv, err := server.New(server.Config{
		Engine:                 sim.Config{BlockSize: 16, NumGPUBlocks: 48, CPUBlocks: 64, MaxNumSeqs: 8, Seed: 7, HashSalt: 99},
		Addr:                   addr,
		KVEventsEndpoint:       evEP,
		KVEventsReplayEndpoint: replayEP,
		KVEventsLayout:         layout,
		KVEventsTopic:          "kv@sim",
	})
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

func newSimFleet(t *testing.T, n int, layout kvevents.Layout) *simFleet {
	t.Helper()
	f := &simFleet{t: t, servers: map[string]*server.Server{}}
	spec := false
	r, err := router.New(router.Config{Mode: router.ModeKVCAware, Speculate: &spec, Load: router.LoadSpec{StaleAfterMS: 500}})
	if err != nil {
		t.Fatal(err)
	}
	f.r = r
	eps := map[string][]Endpoint{}
	var ids []string
	for i := 0; i < n; i++ {
		srv := startSim(t, "127.0.0.1:0", layout, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
		id := strings.TrimPrefix(srv.URL(), "http://")
		f.servers[id] = srv
		ids = append(ids, id)
		eps[id] = []Endpoint{{Endpoint: srv.KVEventsEndpoints()[0], Replay: srv.ReplayEndpoints()[0], Topic: "kv@"}}
	}
	if err := r.AddServers(ids); err != nil {
		t.Fatal(err)
	}
	m, err := Start(r, Config{Collectors: []Spec{
		{Name: NameVLLMMetrics, IntervalMS: 20},
		{Name: NameVLLMZMQ, Endpoints: eps, IdleRedialMS: 400, RetryMS: 50, ReplayTimeoutMS: 1000},
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.m = m
	t.Cleanup(func() {
		_ = m.Close()
		for _, s := range f.servers {
			_ = s.Close()
		}
	})
	waitFor(t, "subscriptions and scrapes", 5*time.Second, func() bool {
		pubs, _ := m.Status().Collectors[NameVLLMZMQ].([]PublisherStatus)
		for _, p := range pubs {
			if !p.Connected {
				return false
			}
		}
		for _, s := range r.Status().Servers {
			if !s.Load.HasMetric {
				return false
			}
		}
		return len(pubs) == n
	})
	return f
}

type completion struct {
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

func (f *simFleet) complete(id string, prompt []int32, maxTokens int) completion {
	f.t.Helper()
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": maxTokens})
	// No keep-alive: servers are restarted on the same port.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := client.Post("http://"+id+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		f.t.Fatalf("completion: %s", resp.Status)
	}
	var c completion
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
		f.t.Fatal(err)
	}
	return c
}

// truth is the engine's resident set as (engine hash, tier) -> copies.
func (f *simFleet) truth(id string) map[[2]uint64]int {
	out := map[[2]uint64]int{}
	_ = f.servers[id].Do(0, func(e *sim.Engine) {
		for b, n := range e.CachedBlocks() {
			tier, ok := kvevents.TierOf(b.Medium)
			if !ok {
				f.t.Errorf("unknown medium %q", b.Medium)
			}
			out[[2]uint64{b.Hash, uint64(tier)}] += n
		}
	})
	return out
}

// indexed is the router's view of the same server.
func (f *simFleet) indexed(id string) map[[2]uint64]int {
	out := map[[2]uint64]int{}
	for _, rc := range f.r.Residency(id) {
		for t, n := range rc.Copies {
			if n > 0 {
				out[[2]uint64{rc.Engine, uint64(t)}] += n
			}
		}
	}
	return out
}

func (f *simFleet) agree(id string) bool {
	f.servers[id].FlushEvents()
	want, got := f.truth(id), f.indexed(id)
	if len(want) != len(got) {
		return false
	}
	for k, n := range want {
		if got[k] != n {
			return false
		}
	}
	return true
}

func (f *simFleet) waitAgree(id, what string) {
	f.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !f.agree(id) {
		if time.Now().After(deadline) {
			f.t.Fatalf("%s: index disagrees with engine\n truth %v\n index %v", what, f.truth(id), f.indexed(id))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func prompts(n, blocks int, shared int) [][]int32 {
	out := make([][]int32, n)
	for i := range out {
		p := make([]int32, blocks*16+5)
		for j := range p {
			if j < shared*16 {
				p[j] = int32(j + 1) // common system prompt
			} else {
				p[j] = int32(1000*(i+1) + j)
			}
		}
		out[i] = p
	}
	return out
}

func TestSimEndToEndIndexMatchesEngine(t *testing.T) {
	for _, layout := range []kvevents.Layout{kvevents.LayoutMap, kvevents.LayoutArray} {
		t.Run(fmt.Sprintf("layout=%d", layout), func(t *testing.T) {
			f := newSimFleet(t, 2, layout)
			ids := f.r.Servers()
			a := ids[0]
			// Enough distinct prompts to overflow 48 GPU blocks: evictions
			// offload to the CPU tier, CPU evictions drop blocks.
			for i, p := range prompts(12, 6, 2) {
				f.complete(a, p, 8)
				if i%4 == 3 {
					f.waitAgree(a, fmt.Sprintf("after %d requests", i+1))
				}
			}
			f.waitAgree(a, "after the workload")
			if st := f.r.Status().Index; st.Servers[0].Stored == 0 || st.Servers[0].Removed == 0 {
				t.Fatalf("workload exercised no eviction: %+v", st.Servers[0])
			}
			tiers := map[uint64]bool{}
			for k := range f.truth(a) {
				tiers[k[1]] = true
			}
			if !tiers[uint64(index.CPU)] {
				t.Fatal("workload put nothing in the CPU tier")
			}

			// The property is the index, not load: wait until the router
			// sees both servers idle (a scrape can still show the last
			// request running, and that load outweighs a 128-token hit).
			waitFor(t, "an idle fleet in the router's view", 5*time.Second, func() bool {
				for _, s := range f.r.Status().Servers {
					if s.Running != 0 || s.Load.Load != 0 {
						return false
					}
				}
				return true
			})
			// The router predicts exactly the engine's cached prefix.
			p := prompts(12, 6, 2)[11]
			ext := append(append([]int32{}, p...), prompts(1, 2, 0)[0]...)
			d, err := f.r.Acquire(router.Request{ID: "x", Tokens: ext, Pin: -1})
			if err != nil {
				t.Fatal(err)
			}
			f.r.Release(d.Server)
			if d.Server != a {
				// Seen once under load average ~20 (not reproduced in isolation):
				// say whether the holder was skipped (unhealthy, overloaded) or
				// its index emptied.
				t.Fatalf("prefix holder not chosen: %+v; servers %+v", d, f.r.Status().Servers)
			}
			c := f.complete(a, ext, 4)
			predicted := (d.HitBlocks[0] + d.HitBlocks[1] + d.HitBlocks[2]) * d.BlockSize
			if predicted != c.Usage.PromptTokensDetails.CachedTokens || predicted == 0 {
				t.Fatalf("predicted %d cached tokens (%+v), engine reported %d", predicted, d, c.Usage.PromptTokensDetails.CachedTokens)
			}
			// Metrics flowed through the poller.
			waitFor(t, "metrics", 3*time.Second, func() bool {
				for _, s := range f.r.Status().Servers {
					if s.ID == a && s.PrefixHitRate > 0 && s.BlockSize == 16 {
						return true
					}
				}
				return false
			})
		})
	}
}

func TestSimEndToEndGapResetRestart(t *testing.T) {
	f := newSimFleet(t, 1, kvevents.LayoutMap)
	a := f.r.Servers()[0]
	ps := prompts(6, 4, 1)
	f.complete(a, ps[0], 4)
	f.waitAgree(a, "initial")
	g0 := f.m.Status().Collectors[NameVLLMZMQ].([]PublisherStatus)[0]

	// A forced gap: the next two batches are dropped from the live stream
	// and must come back through replay.
	resp, err := http.Post("http://"+a+"/sim/drop_kv_events?next=2", "", nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("drop hook: %v %v", err, resp)
	}
	resp.Body.Close()
	f.complete(a, ps[1], 4)
	f.complete(a, ps[2], 4)
	// No live batch follows the dropped ones, so the subscriber's idle
	// probe finds them; it counts the gap and replay before applying them,
	// so once the index agrees the counters show the recovery.
	f.waitAgree(a, "after gap")
	pubs := f.m.Status().Collectors[NameVLLMZMQ].([]PublisherStatus)
	if pubs[0].Gaps == g0.Gaps || pubs[0].Replays == g0.Replays || pubs[0].ReplayFailed != 0 {
		t.Fatalf("gap not replayed: before %+v\n after %+v", g0, pubs[0])
	}

	// reset_prefix_cache (a weight update) -> AllBlocksCleared -> empty index.
	resp, err = http.Post("http://"+a+"/reset_prefix_cache", "", nil)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("reset: %v %v", err, resp)
	}
	resp.Body.Close()
	f.waitAgree(a, "after reset")
	if len(f.indexed(a)) != 0 {
		t.Fatal("index not empty after reset")
	}

	// Restart on the same ports: the sequence restarts at 0, the old
	// residency is dropped and the new engine's is learned.
	f.complete(a, ps[3], 4)
	f.waitAgree(a, "before restart")
	// The reset's AllBlocksCleared already counts in Events.Cleared.
	pre := f.m.Status().Collectors[NameVLLMZMQ].([]PublisherStatus)[0]
	old := f.servers[a]
	ev, rp := old.KVEventsEndpoints()[0], old.ReplayEndpoints()[0]
	_ = old.Close()
	var srv *server.Server
	waitFor(t, "rebind", 5*time.Second, func() bool {
		s, err := server.New(server.Config{
			Engine: sim.Config{BlockSize: 16, NumGPUBlocks: 48, CPUBlocks: 64, MaxNumSeqs: 8, Seed: 7, HashSalt: 1234},
			Addr:   a, KVEventsEndpoint: ev, KVEventsReplayEndpoint: rp, KVEventsTopic: "kv@sim",
		})
		if err != nil {
			return false
		}
		srv = s
		return true
	})
	f.servers[a] = srv
	f.complete(a, ps[4], 4)
	f.waitAgree(a, "after restart")
	pubs = f.m.Status().Collectors[NameVLLMZMQ].([]PublisherStatus)
	if pubs[0].Restarts == pre.Restarts && pubs[0].Events.Cleared == pre.Events.Cleared {
		t.Fatalf("restart not detected: before %+v\n after %+v", pre, pubs[0])
	}
}

// The real simulator: requests served before the balancer subscribes, then
// silence, as when the balancer is created next to a warm fleet or its
// subscription is still propagating. The index must equal the engine's
// resident set.
func TestSimStartupWindowRecovered(t *testing.T) {
	f := &simFleet{t: t, servers: map[string]*server.Server{}}
	spec := false
	r, err := router.New(router.Config{Mode: router.ModeKVCAware, Speculate: &spec, Load: router.LoadSpec{StaleAfterMS: 500}})
	if err != nil {
		t.Fatal(err)
	}
	f.r = r
	srv := startSim(t, "127.0.0.1:0", kvevents.LayoutMap, "tcp://127.0.0.1:0", "tcp://127.0.0.1:0")
	a := strings.TrimPrefix(srv.URL(), "http://")
	f.servers[a] = srv
	t.Cleanup(func() { _ = srv.Close() })
	if err := r.AddServers([]string{a}); err != nil {
		t.Fatal(err)
	}
	for _, p := range prompts(4, 4, 1) {
		f.complete(a, p, 4)
	}
	srv.FlushEvents()
	m, err := Start(r, Config{Collectors: []Spec{{Name: NameVLLMZMQ, Endpoints: map[string][]Endpoint{
		a: {{Endpoint: srv.KVEventsEndpoints()[0], Replay: srv.ReplayEndpoints()[0], Topic: "kv@"}},
	}, IdleRedialMS: 400, RetryMS: 50, ReplayTimeoutMS: 1000}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.m = m
	t.Cleanup(func() { _ = m.Close() })
	f.waitAgree(a, "after the start-up window")
	pubs := m.Status().Collectors[NameVLLMZMQ].([]PublisherStatus)
	if len(pubs) != 1 || pubs[0].Restarts != 0 || pubs[0].Events.Cleared != 0 || pubs[0].StartupUnreplayed != 0 {
		t.Fatalf("%+v", pubs)
	}
	if len(f.indexed(a)) == 0 {
		t.Fatal("nothing indexed")
	}
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
