package kvcrouter

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/kvevents"
	"github.com/kvc-router/kvc-router/core/internal/metrics"
	"github.com/kvc-router/kvc-router/core/internal/router"
)

// TestLibraryLifecycle: New builds a router fed by its collectors (a real
// metrics endpoint on loopback), the push paths reach it, Close stops it.
func TestLibraryLifecycle(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("vllm:num_requests_running 5\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.25\n"))
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	addr := ln.Addr().String()
	var logs bytes.Buffer
	c, err := Parse([]byte(`{"router": {"mode": "kvc_aware"}, "collectors": {"collectors": [{"name": "vllm_metrics", "interval_ms": 10}]}, "log_level": "info"}`))
	if err != nil {
		t.Fatal(err)
	}
	lib, err := New(c, Options{LogOutput: &logs})
	if err != nil {
		t.Fatal(err)
	}
	if err := lib.AddServers([]string{addr, "b"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		st := lib.Status().Router.Servers[0]
		if st.Load.HasMetric && st.Load.Metrics.Running == 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics never arrived: %+v", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := lib.PushMetrics("b", []byte("vllm:num_requests_running 2\n"), metrics.VLLM); err != nil {
		t.Fatal(err)
	}
	if err := lib.PushMetrics("nope", []byte("vllm:num_requests_running 2\n"), metrics.VLLM); err == nil {
		t.Fatal("metrics for an unknown server accepted")
	}
	payload, err := kvevents.Encode(&kvevents.Batch{TS: 1, DPRank: -1, Events: []kvevents.Event{
		{Kind: kvevents.KindStored, BlockHashes: []uint64{1, 2}, TokenIDs: make([]int32, 32), BlockSize: 16, LoraID: -1, GroupIdx: -1},
	}}, kvevents.LayoutArray)
	if err != nil {
		t.Fatal(err)
	}
	if err := lib.PushEvents("b", payload); err != nil {
		t.Fatal(err)
	}
	if st := lib.Status().Router.Servers[1]; !st.Events {
		t.Fatalf("a server that pushed events is not event-fed: %+v", st)
	}
	if d, err := lib.Router().Acquire(router.Request{ID: "q", Tokens: make([]int32, 32), Pin: -1}); err != nil || d.Server != "b" {
		t.Fatalf("acquire: %+v %v", d, err)
	}
	if err := lib.SetEndpoints("b", nil); err == nil || !strings.Contains(err.Error(), "no vllm_zmq") {
		t.Fatalf("endpoints without vllm_zmq: %v", err)
	}
	if err := lib.Close(); err != nil {
		t.Fatal(err)
	}
	if err := lib.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second close: %v", err)
	}
}

// TestNewConfigErrors: New validates, and a collector's start-up error is
// a FieldError on the collectors section.
func TestNewConfigErrors(t *testing.T) {
	_, err := New(Config{LogLevel: "loud"}, Options{})
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Key != "log_level" {
		t.Fatalf("got %v", err)
	}
	c, err := Parse([]byte(`{"collectors": {"collectors": [{"name": "vllm_zmq"}, {"name": "vllm_zmq"}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(c, Options{})
	if !errors.As(err, &fe) || fe.Key != "collectors" || !strings.Contains(fe.Reason, "vllm_zmq configured twice") {
		t.Fatalf("got %v", err)
	}
}

// TestLibraryAdmission: the library passes admission through: a request
// is held while every server is at its cap, a release admits it, a pump
// admits into a server added later, a cancelled one is never admitted.
func TestLibraryAdmission(t *testing.T) {
	c, err := Parse([]byte(`{"router": {"mode": "kvc_aware", "admission": {"enabled": true, "max_inflight": 1, "max_queue": 3}}}`))
	if err != nil {
		t.Fatal(err)
	}
	lib, err := New(c, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Close()
	if err := lib.AddServers([]string{"a"}); err != nil {
		t.Fatal(err)
	}
	req := func(id string) router.Request { return router.Request{ID: id, Tokens: make([]int32, 64), Pin: -1} }
	if d, held, err := lib.Submit(req("r0"), 0); err != nil || held || d.Server != "a" {
		t.Fatalf("first request: %+v held=%v %v", d, held, err)
	}
	for tk := uint64(1); tk <= 3; tk++ {
		if _, held, err := lib.Submit(req(fmt.Sprint("r", tk)), tk); err != nil || !held {
			t.Fatalf("ticket %d: held=%v %v", tk, held, err)
		}
	}
	if _, _, err := lib.Submit(req("r4"), 4); !errors.Is(err, router.ErrQueueFull) {
		t.Fatalf("fourth held request: %v, want ErrQueueFull", err)
	}
	if !lib.Cancel(2) || lib.Cancel(2) || lib.Held() != 2 {
		t.Fatalf("cancel: held %d", lib.Held())
	}
	got, ok := lib.ReleaseAdmit("a", nil)
	if !ok || len(got) != 1 || got[0].Ticket != 1 || got[0].Decision.Server != "a" {
		t.Fatalf("release admitted %+v (released %v)", got, ok)
	}
	if err := lib.AddServers([]string{"b"}); err != nil {
		t.Fatal(err)
	}
	if got := lib.Pump(nil); len(got) != 1 || got[0].Ticket != 3 || got[0].Decision.Server != "b" {
		t.Fatalf("pump admitted %+v", got)
	}
	if st := lib.Status().Router.Admission; st.Held != 0 || st.Admitted != 2 || st.Cancelled != 1 || st.Rejected != 1 {
		t.Fatalf("status %+v", st)
	}
}
