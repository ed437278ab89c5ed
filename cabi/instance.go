package main

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/cgo"
	"sync"
	"sync/atomic"

	json "github.com/goccy/go-json"

	"github.com/kvc-router/kvc-router/core/collector"
	"github.com/kvc-router/kvc-router/core/metrics"
	"github.com/kvc-router/kvc-router/core/router"
)

// Limits on borrowed inputs, checked before any copy.
const (
	maxIDBytes        = 64 << 10
	maxJSONBytes      = 64 << 20
	defaultMaxMetrics = metrics.DefaultLimit
	defaultMaxEvents  = 64 << 20
)

// libConfig is the JSON accepted by kvr_router_new:
//
//	{"router":     <router.Config JSON, see core/router/config.go>,
//	 "collectors": <collector.Config JSON: {"collectors": [collector.Spec...]}>,
//	 "max_procs":  0,
//	 "log_level":  "warn",
//	 "push":       {"max_metrics_bytes": 0, "max_event_bytes": 0}}
//
// Every key is optional; unknown keys are errors at every level.
type libConfig struct {
	Router     json.RawMessage `json:"router"`
	Collectors json.RawMessage `json:"collectors"`
	// MaxProcs > 0 calls runtime.GOMAXPROCS (process-wide).
	MaxProcs int `json:"max_procs"`
	// LogLevel of the collectors' logger on stderr: debug, info, warn
	// (default) or error.
	LogLevel string     `json:"log_level"`
	Push     pushConfig `json:"push"`
}

type pushConfig struct {
	MaxMetricsBytes int64 `json:"max_metrics_bytes"`
	MaxEventBytes   int64 `json:"max_event_bytes"`
}

// instance is what a handle points to: one router and the collectors that
// feed it, closed together.
type instance struct {
	// mu: readers are every operation; writers are pool changes and close.
	mu        sync.RWMutex
	r         *router.Router
	coll      *collector.Manager
	closed    bool
	handle    cgo.Handle
	maxTokens int
	push      pushConfig
	// fed records servers that received pushed KV events.
	fed sync.Map

	// Pool mirror in router order, refreshed under mu.Lock after every
	// membership change; gen counts the changes.
	gen  int64
	pool []string
	pos  map[string]int32

	poisoned atomic.Pointer[string]
}

func newInstance(data []byte) (*instance, error) {
	var lc libConfig
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&lc); err != nil {
		return nil, errf(codeInvalidConfig, "invalid config JSON: %v", err)
	}
	if dec.More() {
		return nil, errf(codeInvalidConfig, "invalid config JSON: trailing data after the top-level object")
	}
	if lc.MaxProcs < 0 || lc.MaxProcs > 4096 {
		return nil, errf(codeInvalidConfig, "max_procs must be in [0, 4096], got %d", lc.MaxProcs)
	}
	if lc.Push.MaxMetricsBytes < 0 || lc.Push.MaxEventBytes < 0 {
		return nil, errf(codeInvalidConfig, "push.max_metrics_bytes and push.max_event_bytes must not be negative")
	}
	if lc.Push.MaxMetricsBytes == 0 {
		lc.Push.MaxMetricsBytes = defaultMaxMetrics
	}
	if lc.Push.MaxEventBytes == 0 {
		lc.Push.MaxEventBytes = defaultMaxEvents
	}
	raw := lc.Router
	if len(bytes.TrimSpace(raw)) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		raw = []byte("{}")
	}
	cfg, err := router.ParseConfig(raw)
	if err != nil {
		return nil, err
	}
	r, err := router.New(cfg)
	if err != nil {
		return nil, err
	}
	if lc.MaxProcs > 0 {
		runtime.GOMAXPROCS(lc.MaxProcs)
	}
	var level slog.Level
	switch lc.LogLevel {
	case "", "warn":
		level = slog.LevelWarn
	case "debug":
		level = slog.LevelDebug
	case "info":
		level = slog.LevelInfo
	case "error":
		level = slog.LevelError
	default:
		return nil, errf(codeInvalidConfig, "log_level %q (allowed: debug, info, warn, error)", lc.LogLevel)
	}
	ccfg, err := collector.ParseConfig(lc.Collectors)
	if err != nil {
		return nil, err
	}
	inst := &instance{r: r, maxTokens: r.Config().MaxPromptTokens, push: lc.Push, pos: map[string]int32{}}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	coll, err := collector.Start(r, ccfg, logger)
	if err != nil {
		return nil, err
	}
	inst.coll = coll
	return inst, nil
}

// lookup resolves a handle without letting a stale one panic.
func lookup(h uint64) (inst *instance, err error) {
	if h == 0 {
		return nil, errf(codeInvalidArgument, "invalid handle 0 (never valid)")
	}
	defer func() {
		if recover() != nil {
			inst, err = nil, errf(codeInvalidState, "invalid or closed router handle %d", uint64(h))
		}
	}()
	v, ok := cgo.Handle(h).Value().(*instance)
	if !ok {
		return nil, errf(codeInvalidState, "handle %d is not a router handle", uint64(h))
	}
	return v, nil
}

// usable checks an instance under (at least) its read lock.
func (inst *instance) usable() error {
	if inst.closed {
		return errf(codeInvalidState, "router handle is closed")
	}
	if p := inst.poisoned.Load(); p != nil {
		return errf(codePoisoned, "router handle is poisoned by an earlier panic (%s); close it and create a new one", *p)
	}
	return nil
}

func (inst *instance) poison(msg string) { inst.poisoned.CompareAndSwap(nil, &msg) }

// refreshPool re-reads the router's pool order; callers hold mu.Lock.
func (inst *instance) refreshPool() {
	inst.pool = inst.r.Servers()
	inst.pos = make(map[string]int32, len(inst.pool))
	for i, id := range inst.pool {
		inst.pos[id] = int32(i)
	}
	inst.gen++
}

// close stops the collectors and releases the handle; callers hold mu.Lock.
func (inst *instance) close() error {
	if inst.closed {
		return errf(codeInvalidState, "router handle is already closed")
	}
	inst.closed = true
	inst.handle.Delete()
	if inst.coll != nil {
		if err := inst.coll.Close(); err != nil {
			return fmt.Errorf("closing collectors: %w", err)
		}
	}
	return nil
}
