package collector

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/core/metrics"
	"github.com/kvc-router/kvc-router/core/router"
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
	// Backoff: far fewer than interval-rate requests while failing.
	before := eng.hits.Load()
	time.Sleep(200 * time.Millisecond)
	if n := eng.hits.Load() - before; n > 10 {
		t.Fatalf("%d scrapes in 200ms while failing: no backoff", n)
	}
	// Recovery.
	eng.running.Store(7)
	eng.mode.Store("ok")
	waitFor(t, "healthy again", 2*time.Second, func() bool { return status().Load.Healthy && status().Running == 8 })
	// Oversized body rejected at its limit.
	eng.mode.Store("huge")
	waitFor(t, "too large counted", 2*time.Second, func() bool {
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
	time.Sleep(50 * time.Millisecond)
	n := a.hits.Load()
	time.Sleep(100 * time.Millisecond)
	if a.hits.Load() > n+1 {
		t.Fatal("removed server still scraped")
	}
	if len(p.Status()) != 1 {
		t.Fatalf("status %+v", p.Status())
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
