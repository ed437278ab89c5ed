package collector

import (
	"encoding/json"
	"log/slog"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvc-router/kvc-router/core/internal/load"
	"github.com/kvc-router/kvc-router/core/internal/router"
)

// pushOnce is a collector registered by a test: on Start it writes one
// metrics snapshot per pool member through the load sink.
type pushOnce struct {
	sinks   Sinks
	running float64
	started atomic.Int32
}

func (p *pushOnce) Name() string { return "test_push_once" }
func (p *pushOnce) Start() {
	p.started.Add(1)
	for _, s := range p.sinks.Servers() {
		p.sinks.UpdateMetrics(s, load.Metrics{Running: p.running})
	}
}
func (p *pushOnce) Close() error { return nil }
func (p *pushOnce) Status() any  { return map[string]int32{"started": p.started.Load()} }

var registered *pushOnce

func init() {
	Register("test_push_once", func(s Spec, sinks Sinks, _ *slog.Logger) (Collector, error) {
		registered = &pushOnce{sinks: sinks, running: float64(s.IntervalMS)}
		return registered, nil
	}, nil)
}

// TestRegisteredCollector: a collector registered by name is built from
// its config entry, started by Start, and writes through the sinks.
func TestRegisteredCollector(t *testing.T) {
	r, err := router.New(router.Config{})
	if err != nil {
		t.Fatal(err)
	}
	_ = r.AddServers([]string{"a", "b"})
	cfg, err := ParseConfig([]byte(`{"collectors": [{"name": "test_push_once", "interval_ms": 7}]}`))
	if err != nil {
		t.Fatal(err)
	}
	m, err := Start(r, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, s := range r.Status().Servers {
		if s.Load.Metrics.Running != 7 || !s.Load.HasMetric {
			t.Fatalf("%s: running %v, want 7 from the registered collector", s.ID, s.Load.Metrics.Running)
		}
	}
	st, _ := json.Marshal(m.Status().Collectors)
	if string(st) != `{"test_push_once":{"started":1}}` {
		t.Fatalf("status %s", st)
	}
	if err := m.SetEndpoints("a", nil); err == nil || !strings.Contains(err.Error(), "no vllm_zmq") {
		t.Fatalf("SetEndpoints without an endpoint collector: %v", err)
	}
}

func TestRegistryNames(t *testing.T) {
	got := strings.Join(Names(), ",")
	if !strings.HasPrefix(got, "vllm_metrics,vllm_polling,sglang_metrics,vllm_zmq") || !strings.Contains(got, "test_push_once") {
		t.Fatalf("names %s", got)
	}
	_, err := ParseConfig([]byte(`{"collectors": [{"name": "os.system"}]}`))
	if err == nil || !strings.Contains(err.Error(), `collectors[0].name: "os.system" (allowed: vllm_metrics, vllm_polling, sglang_metrics, vllm_zmq, test_push_once)`) {
		t.Fatalf("unknown name: %v", err)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("duplicate registration did not panic")
		}
	}()
	Register(NameVLLMZMQ, nil, nil)
}

// TestTwoEndpointCollectors: only one collector may take per-server
// endpoints.
func TestTwoEndpointCollectors(t *testing.T) {
	r, _ := router.New(router.Config{})
	cfg, err := ParseConfig([]byte(`{"collectors": [{"name": "vllm_zmq"}, {"name": "vllm_zmq"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Start(r, cfg, nil); err == nil || !strings.Contains(err.Error(), "vllm_zmq configured twice") {
		t.Fatalf("got %v", err)
	}
}

// TestNoRouterImport: data flows one way. Collectors write through the
// sink interfaces and must not reach for the router package.
func TestNoRouterImport(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go command not found")
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasSuffix(dep, "/core/internal/router") || strings.HasSuffix(dep, "/core/internal/strategy") {
			t.Fatalf("core/internal/collector depends on %s", dep)
		}
	}
}
