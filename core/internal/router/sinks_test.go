package router

import (
	"errors"
	"testing"

	"github.com/kvc-router/kvc-router/core/internal/index"
)

// TestEventWriterNamespaces: a writer keys token-carrying stores in the
// namespace of the router's model and the event's lora, so a request for
// the same tokens under another lora sees no hit.
func TestEventWriterNamespaces(t *testing.T) {
	p := prompt(64, 1)
	cases := []struct {
		name, storeLora, askLora string
		wantHit                  bool
	}{
		{"base model", "", "", true},
		{"same lora", "a", "a", true},
		{"lora stored, base asked", "a", "", false},
		{"base stored, lora asked", "", "a", false},
		{"other lora", "a", "b", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := mustNew(t, kvcConfig(), "s0", "s1")
			w, ok := r.EventWriter("s1")
			if !ok {
				t.Fatal("no writer for a pool member")
			}
			if w2, _ := r.EventWriter("s1"); w2 != w {
				t.Fatal("a second call made a new writer")
			}
			hashes := []uint64{11, 12, 13, 14}
			if err := w.Stored(index.GPU, false, 0, hashes, p, 16, tc.storeLora); err != nil {
				t.Fatal(err)
			}
			d, err := r.Acquire(Request{ID: "q", Tokens: p, Pin: -1, Lora: tc.askLora})
			if err != nil {
				t.Fatal(err)
			}
			if hit := d.HitBlocks[index.GPU] > 0; hit != tc.wantHit {
				t.Fatalf("decision %+v, want hit %v", d, tc.wantHit)
			}
			if got := len(r.Residency("s1")); got != len(hashes) {
				t.Fatalf("residency %d blocks, want %d", got, len(hashes))
			}
			if err := w.Removed(index.GPU, hashes[2:]); err != nil {
				t.Fatal(err)
			}
			if got := len(r.Residency("s1")); got != 2 {
				t.Fatalf("after remove: %d blocks, want 2", got)
			}
			if err := w.Cleared(); err != nil {
				t.Fatal(err)
			}
			if got := len(r.Residency("s1")); got != 0 {
				t.Fatalf("after clear: %d blocks", got)
			}
		})
	}
}

// TestSinkUnknownServer: a server outside the pool has no writer, no
// residency, and its metrics are refused.
func TestSinkUnknownServer(t *testing.T) {
	r := mustNew(t, kvcConfig(), "s0")
	if _, ok := r.EventWriter("nope"); ok {
		t.Fatal("writer for an unknown server")
	}
	if r.Residency("nope") != nil {
		t.Fatal("residency for an unknown server")
	}
	if r.SetEventFeed("nope", true) {
		t.Fatal("event feed set on an unknown server")
	}
	r.RemoveServers([]string{"s0"})
	if _, ok := r.EventWriter("s0"); ok {
		t.Fatal("writer for a removed server")
	}
}

// TestMetricsFailed: a refused connection marks a server unhealthy at
// once; other failures only after Load.UnhealthyAfter in a row.
func TestMetricsFailed(t *testing.T) {
	cfg := kvcConfig()
	cfg.Load.UnhealthyAfter = 3
	r := mustNew(t, cfg, "s0", "s1")
	err := errors.New("scrape failed")
	for i := 1; i <= 3; i++ {
		if got, want := r.MetricsFailed("s0", err, false), i == 3; got != want {
			t.Fatalf("failure %d: unhealthy %v, want %v", i, got, want)
		}
	}
	if !r.MetricsFailed("s1", err, true) {
		t.Fatal("a refused connection did not mark the server unhealthy")
	}
	for _, s := range r.Status().Servers {
		if s.Load.Healthy {
			t.Fatalf("%s still healthy", s.ID)
		}
	}
}
