package kvcrouter

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"sync"

	"github.com/kvc-router/kvc-router/core/internal/collector"
	"github.com/kvc-router/kvc-router/core/internal/metrics"
	"github.com/kvc-router/kvc-router/core/internal/router"
)

// Library is one router and the collectors that feed it, closed together.
// Its methods are safe for concurrent use; after Close the push paths and
// Close itself return ErrClosed.
type Library struct {
	cfg  Config
	r    *router.Router
	coll *collector.Manager
	// fed records servers that received pushed KV events.
	fed sync.Map

	mu     sync.Mutex
	closed bool
}

// ErrClosed is returned by a closed Library.
var ErrClosed = errors.New("kvcrouter: library is closed")

// Options are what a Go caller may add to a Config.
type Options struct {
	// LogOutput receives the collectors' log; nil means os.Stderr.
	LogOutput io.Writer
	// LogJSON writes one JSON object per record (time, level, msg, then
	// the attributes) instead of logfmt text: for a host that re-emits the
	// records through its own logging (the C ABI's kvr_set_log_fd).
	LogJSON bool
}

// New validates cfg, builds the router and starts the configured
// collectors. Configuration errors are *FieldError.
func New(cfg Config, opts Options) (*Library, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r, err := router.New(cfg.Router)
	if err != nil {
		return nil, fieldError("router", err)
	}
	if cfg.MaxProcs > 0 {
		runtime.GOMAXPROCS(cfg.MaxProcs)
	}
	level, err := logLevel(cfg.LogLevel)
	if err != nil {
		return nil, err
	}
	out := opts.LogOutput
	if out == nil {
		out = os.Stderr
	}
	hopts := &slog.HandlerOptions{Level: level}
	var handler slog.Handler = slog.NewTextHandler(out, hopts)
	if opts.LogJSON {
		handler = slog.NewJSONHandler(out, hopts)
	}
	logger := slog.New(handler)
	coll, err := collector.Start(r, cfg.Collectors, logger)
	if err != nil {
		return nil, fieldError("collectors", err)
	}
	return &Library{cfg: cfg, r: r, coll: coll}, nil
}

// Config returns the validated configuration the library runs with.
func (l *Library) Config() Config { return l.cfg }

// Router is the library's router (routing decisions and pool changes).
func (l *Library) Router() *router.Router { return l.r }

// PushMetrics parses Prometheus text for a server and stores it. The size
// bound (push.max_metrics_bytes) is the caller's to apply before copying.
// Errors name the server and wrap the cause.
func (l *Library) PushMetrics(server string, text []byte, flavor metrics.Flavor) error {
	if err := l.coll.PushMetrics(server, text, flavor); err != nil {
		return fmt.Errorf("metrics for server %q: %w", server, err)
	}
	return nil
}

// PushEvents decodes and applies one raw KV-event payload for a server.
// A server that pushes events has an authoritative feed from then on.
func (l *Library) PushEvents(server string, payload []byte) error {
	if err := l.coll.PushEvents(server, payload); err != nil {
		return fmt.Errorf("KV events for server %q: %w", server, err)
	}
	if _, seen := l.fed.LoadOrStore(server, true); !seen {
		l.r.SetEventFeed(server, true)
	}
	return nil
}

// AddServers adds servers to the pool.
func (l *Library) AddServers(ids []string) error { return l.r.AddServers(ids) }

// RemoveServers removes servers from the pool.
func (l *Library) RemoveServers(ids []string) {
	l.r.RemoveServers(ids)
	for _, id := range ids {
		l.fed.Delete(id)
	}
}

// SetEndpoints (re)configures a server's KV-event publishers; it needs a
// vllm_zmq collector.
func (l *Library) SetEndpoints(server string, eps []collector.Endpoint) error {
	return l.coll.SetEndpoints(server, eps)
}

// Status is the router's and the collectors' state.
type Status struct {
	Router     router.Status    `json:"router"`
	Collectors collector.Status `json:"collectors"`
}

// Status reports the router and the collectors.
func (l *Library) Status() Status {
	st := Status{Router: l.r.Status(), Collectors: l.coll.Status()}
	if st.Router.Servers == nil {
		st.Router.Servers = []router.ServerStatus{}
	}
	return st
}

// Close stops the collectors. A second Close returns ErrClosed.
func (l *Library) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	l.closed = true
	if err := l.coll.Close(); err != nil {
		return fmt.Errorf("closing collectors: %w", err)
	}
	return nil
}

// Submit routes req as the router's Acquire does unless admission holds it
// (router.Config.Admission): then queued is true and the request is decided
// later, in the list of the ReleaseAdmit or Pump call that gives it a slot.
// ticket names the held request to the caller; it must be unique among the
// requests held. router.ErrQueueFull when admission.max_queue are held.
func (l *Library) Submit(req router.Request, ticket uint64) (router.Decision, bool, error) {
	return l.r.Submit(req, ticket)
}

// ReleaseAdmit counts one request finished on server (as Release) and
// appends the held requests admitted into the room it freed to out;
// released is false for unknown ids and zero counts.
func (l *Library) ReleaseAdmit(server string, out []router.Admitted) (admitted []router.Admitted, released bool) {
	return l.r.ReleaseAdmit(server, out)
}

// ReleaseDone is ReleaseAdmit for a caller that knows which request
// finished and how many tokens it generated (0 = unknown): the length
// learner (router.LengthsSpec) learns the prompt's response length from it.
func (l *Library) ReleaseDone(server, requestID string, outputTokens int, out []router.Admitted) (admitted []router.Admitted, released bool) {
	return l.r.ReleaseDone(server, requestID, outputTokens, out)
}

// Pump admits held requests into room that appeared without a release
// (servers added, caps raised by fresh metrics), appending them to out.
func (l *Library) Pump(out []router.Admitted) []router.Admitted { return l.r.Pump(out) }

// Cancel drops a held request; false when ticket is not held (already
// admitted, cancelled, or never held).
func (l *Library) Cancel(ticket uint64) bool { return l.r.Cancel(ticket) }

// Held is the number of requests admission holds.
func (l *Library) Held() int { return l.r.Held() }
