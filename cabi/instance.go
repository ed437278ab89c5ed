package main

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"runtime"
	"runtime/cgo"
	"strings"
	"sync"
	"sync/atomic"

	json "github.com/goccy/go-json"

	"github.com/kvc-router/kvc-router/core/collector"
	"github.com/kvc-router/kvc-router/core/metrics"
	"github.com/kvc-router/kvc-router/core/router"
	"github.com/kvc-router/kvc-router/core/strictjson"
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

// parsedConfig is a validated libConfig: everything kvr_router_new needs
// before it starts anything.
type parsedConfig struct {
	lib    libConfig
	router router.Config
	level  slog.Level
	coll   collector.Config
}

// parseConfig decodes and validates the kvr_router_new JSON without side
// effects. Every error is codeInvalidConfig and starts with the key at
// fault as a path from the document's root ("router.strategies[0].params.alpha:
// must be in [0, 1], got 2"), which callers map back onto their own keys.
func parseConfig(data []byte) (*parsedConfig, error) {
	p := &parsedConfig{}
	lc := &p.lib
	if len(bytes.TrimSpace(data)) == 0 {
		data = []byte("{}")
	}
	if err := strictjson.Decode(data, lc); err != nil {
		return nil, configError("", err)
	}
	if lc.MaxProcs < 0 || lc.MaxProcs > 4096 {
		return nil, configError("", strictjson.Errorf("max_procs", "must be in [0, 4096], got %d", lc.MaxProcs))
	}
	if lc.Push.MaxMetricsBytes < 0 {
		return nil, configError("", strictjson.Errorf("push.max_metrics_bytes", "must not be negative, got %d", lc.Push.MaxMetricsBytes))
	}
	if lc.Push.MaxEventBytes < 0 {
		return nil, configError("", strictjson.Errorf("push.max_event_bytes", "must not be negative, got %d", lc.Push.MaxEventBytes))
	}
	if lc.Push.MaxMetricsBytes == 0 {
		lc.Push.MaxMetricsBytes = defaultMaxMetrics
	}
	if lc.Push.MaxEventBytes == 0 {
		lc.Push.MaxEventBytes = defaultMaxEvents
	}
	switch lc.LogLevel {
	case "", "warn":
		lc.LogLevel, p.level = "warn", slog.LevelWarn
	case "debug":
		p.level = slog.LevelDebug
	case "info":
		p.level = slog.LevelInfo
	case "error":
		p.level = slog.LevelError
	default:
		return nil, configError("", strictjson.Errorf("log_level", "%q (allowed: debug, info, warn, error)", lc.LogLevel))
	}
	raw := lc.Router
	if len(bytes.TrimSpace(raw)) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		raw = []byte("{}")
	}
	cfg, err := router.ParseConfig(raw)
	if err != nil {
		return nil, configError("router", err)
	}
	p.router = cfg
	craw := lc.Collectors
	if len(bytes.TrimSpace(craw)) > 0 && !bytes.Equal(bytes.TrimSpace(craw), []byte("null")) {
		// Strict decoding first, for key-named errors; ParseConfig then
		// checks values (its messages name "collectors[i].key").
		var probe collector.Config
		if err := strictjson.Decode(craw, &probe); err != nil {
			return nil, configError("collectors", err)
		}
	}
	ccfg, err := collector.ParseConfig(craw)
	if err != nil {
		return nil, collectorConfigError(err)
	}
	p.coll = ccfg
	return p, nil
}

// collectorKey splits collector.ParseConfig's messages, which start with
// the key ("collectors[1].interval_ms must not be negative").
var collectorKey = regexp.MustCompile(`^(collectors\[\d+\](?:\.[a-z_]+|\[[^\]]*\])*):? (.*)$`)

// collectorConfigError puts a collector configuration error in the
// "key: reason" form, rooted at the document's "collectors" key.
func collectorConfigError(err error) error {
	msg := strings.TrimPrefix(err.Error(), collector.ErrConfig.Error()+": ")
	if m := collectorKey.FindStringSubmatch(msg); m != nil {
		return errf(codeInvalidConfig, "collectors.%s: %s", m[1], m[2])
	}
	return errf(codeInvalidConfig, "collectors: %s", msg)
}

// configError is a codeInvalidConfig error whose message starts with the
// key path under prefix.
func configError(prefix string, err error) error {
	var ke *strictjson.KeyError
	if errors.As(err, &ke) {
		return errf(codeInvalidConfig, "%s", strictjson.Prefixed(prefix, ke).Error())
	}
	if prefix == "" {
		return errf(codeInvalidConfig, "%v", err)
	}
	return errf(codeInvalidConfig, "%s: %v", prefix, err)
}

// effective is the configuration a router built from p runs with: every
// key that has a default filled in (the document kvr_validate_config returns).
func (p *parsedConfig) effective() (map[string]any, error) {
	rc := p.router
	strategies, err := rc.ResolvedStrategies()
	if err != nil {
		return nil, configError("router", err)
	}
	rc.Strategies = strategies
	colls := p.coll.Collectors
	if colls == nil {
		colls = []collector.Spec{}
	}
	return map[string]any{
		"router":     rc,
		"collectors": collector.Config{Collectors: colls},
		"max_procs":  p.lib.MaxProcs,
		"log_level":  p.lib.LogLevel,
		"push":       p.lib.Push,
	}, nil
}

func newInstance(data []byte) (*instance, error) {
	p, err := parseConfig(data)
	if err != nil {
		return nil, err
	}
	r, err := router.New(p.router)
	if err != nil {
		return nil, configError("router", err)
	}
	if p.lib.MaxProcs > 0 {
		runtime.GOMAXPROCS(p.lib.MaxProcs)
	}
	inst := &instance{r: r, maxTokens: r.Config().MaxPromptTokens, push: p.lib.Push, pos: map[string]int32{}}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: p.level}))
	coll, err := collector.Start(r, p.coll, logger)
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
