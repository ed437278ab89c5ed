package load

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

func TestCompute(t *testing.T) {
	cases := []struct {
		name     string
		m        Metrics
		fresh    bool
		inflight int
		capacity int
		want     float64
	}{
		{"idle fresh", Metrics{HasKVUsage: true}, true, 0, 256, 0},
		{"kv only", Metrics{KVUsage: 0.5, HasKVUsage: true}, true, 0, 256, 0.2},
		{"running half", Metrics{Running: 128, HasKVUsage: true}, true, 0, 256, 0.15},
		{"local inflight dominates stale scrape", Metrics{Running: 10}, true, 128, 256, 0.15},
		{"waiting counts twice", Metrics{Running: 256, Waiting: 128, KVUsage: 1, HasKVUsage: true}, true, 0, 256, 0.4 + 0.3 + 0.15},
		{"saturated", Metrics{Running: 256, Waiting: 1000, KVUsage: 1, HasKVUsage: true}, true, 0, 256, 1},
		{"stale uses inflight", Metrics{Running: 256, KVUsage: 1, HasKVUsage: true}, false, 128, 256, 0.35},
		{"stale overloaded", Metrics{}, false, 512, 256, 1},
		{"kv clamped", Metrics{KVUsage: 7, HasKVUsage: true}, true, 0, 256, 0.4},
		{"zero capacity falls back", Metrics{}, false, 256, 0, 0.7},
	}
	for _, c := range cases {
		if got := Compute(c.m, c.fresh, c.inflight, c.capacity); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%s: got %v want %v", c.name, got, c.want)
		}
	}
}

func TestStoreLifecycle(t *testing.T) {
	now := time.Unix(100, 0)
	s := New(Config{StaleAfter: time.Second, UnhealthyAfter: 2, Now: func() time.Time { return now }})
	s.Add("a")
	s.Acquire("a", 100)
	s.Acquire("a", 300)
	s.Acquire("ghost", 1)
	if got := s.Inflight("a"); got != 2 {
		t.Fatalf("inflight %d", got)
	}
	sn, _ := s.Get("a")
	if sn.InflightTokens != 400 || sn.Fresh || !sn.Healthy {
		t.Fatalf("snapshot %+v", sn)
	}
	if !s.Release("a") || sn2(s).InflightTokens != 200 {
		t.Fatalf("release tokens: %+v", sn2(s))
	}
	s.Release("a")
	if s.Release("a") || s.Release("ghost") {
		t.Fatal("release at zero or unknown must be a no-op")
	}
	s.Update("a", Metrics{Running: 3, HasKVUsage: true, KVUsage: 0.1, MaxNumSeqs: 4})
	if sn := sn2(s); !sn.Fresh || sn.Capacity != 4 {
		t.Fatalf("after update %+v", sn)
	}
	now = now.Add(2 * time.Second)
	if sn := sn2(s); sn.Fresh {
		t.Fatal("metrics older than StaleAfter must not be fresh")
	}
	if s.Fail("a", errors.New("boom")) {
		t.Fatal("unhealthy after one failure")
	}
	if !s.Fail("a", errors.New("boom")) || sn2(s).Healthy {
		t.Fatal("second failure must mark unhealthy")
	}
	s.Update("a", Metrics{})
	if !sn2(s).Healthy {
		t.Fatal("a successful scrape restores health")
	}
	s.Acquire("a", 5)
	s.Add("a")
	if s.Inflight("a") != 0 {
		t.Fatal("re-add resets in-flight")
	}
	s.Remove("a")
	if _, ok := s.Get("a"); ok {
		t.Fatal("removed")
	}
}

func sn2(s *Store) Snapshot { sn, _ := s.Get("a"); return sn }

func TestCheck(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	cases := []struct {
		name string
		m    Metrics
		want string // "" = valid
	}{
		{"zero", Metrics{}, ""},
		{"typical", Metrics{Running: 3, Waiting: 2, KVUsage: 0.4, HasKVUsage: true, PrefixQueries: 10, PrefixHits: 4, BlockSize: 16}, ""},
		{"usage bounds", Metrics{KVUsage: 1, HasKVUsage: true}, ""},
		{"usage absent is not checked", Metrics{KVUsage: nan}, ""},
		{"negative waiting", Metrics{Running: 5, Waiting: -3}, "waiting requests = -3"},
		{"NaN running", Metrics{Running: nan}, "running requests = NaN"},
		{"+Inf waiting", Metrics{Waiting: inf}, "waiting requests = +Inf"},
		{"-Inf hits", Metrics{PrefixHits: math.Inf(-1)}, "prefix cache hits = -Inf"},
		{"negative external queries", Metrics{ExternalPrefixQueries: -1}, "external prefix cache queries = -1"},
		{"usage above 1", Metrics{KVUsage: 1.5, HasKVUsage: true}, "KV cache usage = 1.5"},
		{"usage below 0", Metrics{KVUsage: -0.1, HasKVUsage: true}, "KV cache usage = -0.1"},
		{"usage NaN", Metrics{KVUsage: nan, HasKVUsage: true}, "KV cache usage = NaN"},
		{"negative blocks", Metrics{NumGPUBlocks: -1}, "GPU blocks = -1"},
	}
	for _, c := range cases {
		err := c.m.Check()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: unexpected %v", c.name, err)
		case c.want != "" && (err == nil || !strings.HasPrefix(err.Error(), c.want)):
			t.Errorf("%s: got %v, want prefix %q", c.name, err, c.want)
		}
	}
}

// Issue 20 D2: impossible metrics never become a load. They count as a
// failed scrape with the reason as last error, and the last good metrics
// stay until they age out.
func TestUpdateRefusesImpossibleMetrics(t *testing.T) {
	now := time.Unix(100, 0)
	s := New(Config{StaleAfter: time.Second, UnhealthyAfter: 2, Now: func() time.Time { return now }})
	s.Add("a")
	if !s.Update("a", Metrics{Running: 200, Waiting: 10, KVUsage: 0.5, HasKVUsage: true}) {
		t.Fatal("update of a known server")
	}
	good := sn2(s)
	if !s.Update("a", Metrics{Running: 200, Waiting: -200, KVUsage: 0.5, HasKVUsage: true}) {
		t.Fatal("a refused update still names a known server")
	}
	sn := sn2(s)
	if sn.Metrics.Waiting != 10 || sn.Load != good.Load || sn.Errors != 1 || sn.Failures != 1 || !sn.Healthy {
		t.Fatalf("after one impossible scrape: %+v (before %+v)", sn, good)
	}
	if !strings.Contains(sn.LastError, "impossible metrics: waiting requests = -200") {
		t.Fatalf("last error %q", sn.LastError)
	}
	s.Update("a", Metrics{Running: math.NaN()})
	if sn := sn2(s); sn.Healthy || sn.Failures != 2 || !strings.Contains(sn.LastError, "running requests = NaN") {
		t.Fatalf("after two: %+v", sn)
	}
	now = now.Add(2 * time.Second) // the last good metrics age out as usual
	if sn := sn2(s); sn.Fresh || sn.Metrics.Running != 200 {
		t.Fatalf("aged: %+v", sn)
	}
	if s.Update("ghost", Metrics{Running: -1}) {
		t.Fatal("unknown server")
	}
}
