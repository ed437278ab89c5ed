package collector

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/clock"
	"github.com/kvc-router/kvc-router/core/internal/metrics"
	"github.com/kvc-router/kvc-router/core/internal/router"
)

const vllmText = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} %d.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
vllm:num_requests_waiting{engine="1",model_name="m"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.789095700123456e+09
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 400.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="32",enable_prefix_caching="True",engine="0",num_gpu_blocks="5000"} 1.0
`

type fakeEngine struct {
	mode    atomic.Value // "ok", "500", "garbage", "slow"
	running atomic.Int64
	hits    atomic.Int64
	accept  atomic.Value
}

func (f *fakeEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.hits.Add(1)
	f.accept.Store(r.Header.Get("Accept"))
	if r.URL.Path != "/metrics" {
		http.NotFound(w, r)
		return
	}
	switch f.mode.Load().(string) {
	case "500":
		http.Error(w, "boom", http.StatusInternalServerError)
	case "garbage":
		fmt.Fprint(w, "vllm:num_requests_running{engine=\"0\" 3\n<html>")
	case "slow":
		time.Sleep(300 * time.Millisecond)
		fmt.Fprintf(w, vllmText, f.running.Load())
	case "huge":
		fmt.Fprintf(w, vllmText, f.running.Load())
		fmt.Fprint(w, strings.Repeat("# padding comment line\n", 100000))
	default:
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		fmt.Fprintf(w, vllmText, f.running.Load())
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

func TestPollerLifecycle(t *testing.T) {
	eng := &fakeEngine{}
	eng.mode.Store("ok")
	eng.running.Store(3)
	srv := httptest.NewServer(eng)
	defer srv.Close()
	id := strings.TrimPrefix(srv.URL, "http://")

	r, err := router.New(router.Config{Mode: router.ModeKVCAware, Load: router.LoadSpec{UnhealthyAfter: 2, StaleAfterMS: 150}})
	if err != nil {
		t.Fatal(err)
	}
	_ = r.AddServers([]string{id})
	p := NewPoller(r, PollerConfig{Interval: 10 * time.Millisecond, Timeout: 100 * time.Millisecond, BackoffMax: 40 * time.Millisecond, MaxBytes: 64 << 10})
	p.Start()
	defer p.Close()

	status := func() router.ServerStatus { return r.Status().Servers[0] }
	waitFor(t, "first scrape", 2*time.Second, func() bool { return status().Load.HasMetric })
	s := status()
	// Two engines aggregated: running 3+1, waiting 2, block size from cache_config_info.
	if s.Running != 4 || s.Waiting != 2 || s.BlockSize != 32 || s.PrefixHitRate != 0.4 || !s.Load.Fresh {
		t.Fatalf("scraped %+v", s)
	}
	if a, _ := eng.accept.Load().(string); strings.Contains(a, "openmetrics") {
		t.Fatalf("sent OpenMetrics Accept header %q", a)
	}
	if r.Status().Index.Servers[0].Capacity != 5000 {
		t.Fatalf("num_gpu_blocks did not reach the index: %+v", r.Status().Index.Servers[0])
	}

	// Garbage: counted as malformed, previous snapshot kept.
	eng.mode.Store("garbage")
	waitFor(t, "malformed counted", 2*time.Second, func() bool { return p.Status()[0].Malformed > 0 })
	if status().Running != 4 {
		t.Fatal("previous snapshot lost on malformed text")
	}
	// 5xx: unhealthy after UnhealthyAfter consecutive failures; load falls back.
	eng.mode.Store("500")
	waitFor(t, "unhealthy", 2*time.Second, func() bool { return !status().Load.Healthy })
	waitFor(t, "stale", 2*time.Second, func() bool { return !status().Load.Fresh })
	if !p.Status()[0].Unhealthy || !strings.Contains(p.Status()[0].LastError, "500") {
		t.Fatalf("%+v", p.Status()[0])
	}
	// Backoff while failing: TestPollerBacksOff.
	// Recovery.
	eng.running.Store(7)
	eng.mode.Store("ok")
	waitFor(t, "healthy again", 2*time.Second, func() bool { return status().Load.Healthy && status().Running == 8 })
	// Oversized body rejected at its limit.
	eng.mode.Store("huge")
	// Reading up to the size limit takes a while under -race on a loaded
	// host (it timed out at 2 s once): a behaviour check, not a speed one.
	waitFor(t, "too large counted", 10*time.Second, func() bool {
		return strings.Contains(p.Status()[0].LastError, "too large")
	})
	// Timeout.
	eng.mode.Store("slow")
	waitFor(t, "timeout error", 3*time.Second, func() bool {
		e := p.Status()[0].LastError
		return strings.Contains(e, "deadline") || strings.Contains(e, "Timeout")
	})
}

func TestPollerFollowsPool(t *testing.T) {
	a, b := &fakeEngine{}, &fakeEngine{}
	a.mode.Store("ok")
	b.mode.Store("ok")
	sa, sb := httptest.NewServer(a), httptest.NewServer(b)
	defer sa.Close()
	defer sb.Close()
	ida, idb := strings.TrimPrefix(sa.URL, "http://"), strings.TrimPrefix(sb.URL, "http://")
	r, _ := router.New(router.Config{})
	_ = r.AddServers([]string{ida})
	p := NewPoller(r, PollerConfig{Interval: 10 * time.Millisecond})
	p.Start()
	defer p.Close()
	waitFor(t, "a scraped", 2*time.Second, func() bool { return a.hits.Load() > 0 })
	_ = r.AddServers([]string{idb})
	waitFor(t, "b scraped", 2*time.Second, func() bool { return b.hits.Load() > 0 })
	r.RemoveServers([]string{ida})
	// A tick drops the removed server's target (its worker ends) once no
	// scrape of it is running; from then on only b is scraped.
	waitFor(t, "a's target dropped", 2*time.Second, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		_, ok := p.tgts[ida]
		return !ok
	})
	n, nb := a.hits.Load(), b.hits.Load()
	waitFor(t, "b scraped three more times", 2*time.Second, func() bool { return b.hits.Load() >= nb+3 })
	if a.hits.Load() != n {
		t.Fatalf("removed server scraped %d more times while b was scraped 3", a.hits.Load()-n)
	}
	if len(p.Status()) != 1 {
		t.Fatalf("status %+v", p.Status())
	}
}

// failingEngine is an engine whose /metrics answers 500 (eng.mode
// switches it), served until the test ends; id is its server id.
func failingEngine(t *testing.T) (*fakeEngine, string) {
	t.Helper()
	eng := &fakeEngine{}
	eng.mode.Store("500")
	srv := httptest.NewServer(eng)
	t.Cleanup(srv.Close)
	return eng, strings.TrimPrefix(srv.URL, "http://")
}

// A failing server is scraped again only after a backoff of Interval <<
// consecutive failures, capped at BackoffMax; a good scrape makes it due at
// the next tick. The poller's clock is a fake one the test advances, and
// the test calls tick itself: each step is exact.
func TestPollerBacksOff(t *testing.T) {
	eng, id := failingEngine(t)
	r, err := router.New(router.Config{})
	if err != nil {
		t.Fatal(err)
	}
	_ = r.AddServers([]string{id})
	const interval, backoffMax = 10 * time.Millisecond, 80 * time.Millisecond
	p := NewPoller(r, PollerConfig{Interval: interval, BackoffMax: backoffMax,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	fc := clock.NewFake(time.Unix(1_700_000_000, 0))
	p.now = fc.Now
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); p.wg.Wait() }()

	scrapes := func() (uint64, bool) {
		p.mu.Lock()
		defer p.mu.Unlock()
		tg := p.tgts[id]
		return tg.scrapes, tg.running
	}
	// tickKicks ticks at the fake clock's time and says whether that tick
	// started a scrape (then waits for it to end): tick marks a target
	// running before it returns, and only a finished scrape clears it.
	tickKicks := func(done uint64) bool {
		p.tick(ctx, fc.Now())
		if n, running := scrapes(); !running && n == done {
			return false
		}
		waitFor(t, "the scrape", 5*time.Second, func() bool { n, running := scrapes(); return !running && n == done+1 })
		return true
	}
	for done := uint64(0); done < 6; done++ {
		if !tickKicks(done) {
			t.Fatalf("failure %d: not scraped when due", done+1)
		}
		wait := min(interval<<(done+1), backoffMax) // 20, 40, 80, 80, ... ms
		fc.Advance(wait - time.Nanosecond)
		if tickKicks(done + 1) {
			t.Fatalf("failure %d: scraped again %v after it, before its %v backoff", done+1, wait-time.Nanosecond, wait)
		}
		fc.Advance(time.Nanosecond)
	}
	eng.mode.Store("ok")
	if !tickKicks(6) || !tickKicks(7) {
		t.Fatal("a recovered server is not due at every tick")
	}
	if st := p.Status()[0]; st.Scrapes != 8 || st.Errors != 6 || st.Failures != 0 {
		t.Fatalf("%+v", st)
	}
}

func TestPushMetrics(t *testing.T) {
	r, _ := router.New(router.Config{})
	_ = r.AddServers([]string{"a"})
	if err := PushMetrics(r, "a", []byte(fmt.Sprintf(vllmText, 9)), metrics.VLLM); err != nil {
		t.Fatal(err)
	}
	if s := r.Status().Servers[0]; s.Running != 10 {
		t.Fatalf("%+v", s)
	}
	if err := PushMetrics(r, "a", []byte("not metrics {"), metrics.VLLM); err == nil {
		t.Fatal("garbage accepted")
	}
	if s := r.Status().Servers[0]; s.Running != 10 {
		t.Fatal("snapshot lost")
	}
	if err := PushMetrics(r, "zz", []byte(fmt.Sprintf(vllmText, 1)), metrics.VLLM); err == nil {
		t.Fatal("unknown server accepted")
	}
}

// A server that cannot be scraped is logged once with its URL and the
// reason, then at most once per LogEvery with the failures in between; a
// good scrape logs the recovery and re-arms the first-failure line.
func TestPollerFailureLogRateLimited(t *testing.T) {
	eng, id := failingEngine(t)
	r, err := router.New(router.Config{Mode: router.ModeKVCAware, Load: router.LoadSpec{UnhealthyAfter: 3}})
	if err != nil {
		t.Fatal(err)
	}
	_ = r.AddServers([]string{id})
	var buf syncBuffer
	p := NewPoller(r, PollerConfig{LogEvery: time.Minute, Logger: slog.New(slog.NewJSONHandler(&buf, nil))})
	clock := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	p.now = func() time.Time { return clock }
	tg := &target{url: p.url(id), kick: make(chan struct{}, 1)}
	p.tgts[id] = tg
	scrape := func(n int, step time.Duration) {
		for i := 0; i < n; i++ {
			p.scrape(context.Background(), id, tg)
			clock = clock.Add(step)
		}
	}
	lines := func() []map[string]any {
		var out []map[string]any
		for _, ln := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			if ln == "" {
				continue
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(ln), &m); err != nil {
				t.Fatalf("log line %q: %v", ln, err)
			}
			out = append(out, m)
		}
		return out
	}

	scrape(10, time.Second) // 10 failures within 10 s (turning unhealthy at the 3rd): one line
	got := lines()
	if len(got) != 1 {
		t.Fatalf("%d lines for 10 failures in 10 s, want 1: %v", len(got), got)
	}
	first := got[0]
	if first["msg"] != "metrics: cannot scrape server" || first["level"] != "WARN" || first["url"] != "http://"+id+"/metrics" ||
		!strings.Contains(first["err"].(string), "500") || first["server"] != id || first["consecutive_failures"] != 1.0 {
		t.Fatalf("first failure line %v", first)
	}
	scrape(51, time.Second) // past the minute: one more line, counting the 59 failures not logged
	got = lines()
	if len(got) != 2 || got[1]["failures_not_logged"] != 59.0 || got[1]["unhealthy"] != true ||
		got[1]["consecutive_failures"] != 61.0 {
		t.Fatalf("after 61 failures in 61 s: %v", got)
	}
	eng.mode.Store("ok")
	scrape(3, time.Second) // recovery: one line, then quiet
	got = lines()
	if len(got) != 3 || got[2]["msg"] != "metrics: server answers again" || got[2]["url"] != "http://"+id+"/metrics" {
		t.Fatalf("recovery: %v", got)
	}
	eng.mode.Store("500")
	scrape(1, time.Second) // a new failure episode is logged at once, however recent the last line
	if got = lines(); len(got) != 4 || got[3]["msg"] != "metrics: cannot scrape server" || got[3]["consecutive_failures"] != 1.0 {
		t.Fatalf("second episode: %v", got)
	}
}

// syncBuffer is a bytes.Buffer safe for the logger and the test together.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
