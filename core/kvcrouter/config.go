// Package kvcrouter assembles the library: one Config for every section
// (router, its strategies, index and load; collectors; push limits;
// logging), its defaults and validation, and New, which builds the router
// and starts the collectors that feed it. The C ABI (cabi) is a shell
// around it: C conversions, handles and panic recovery.
package kvcrouter

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"

	json "github.com/goccy/go-json"

	"github.com/kvc-router/kvc-router/core/internal/collector"
	"github.com/kvc-router/kvc-router/core/internal/metrics"
	"github.com/kvc-router/kvc-router/core/internal/router"
	"github.com/kvc-router/kvc-router/core/internal/strictjson"
)

// Defaults of the library's own keys.
const (
	DefaultLogLevel        = "warn"
	DefaultMaxMetricsBytes = metrics.DefaultLimit
	DefaultMaxEventBytes   = 64 << 20
	// MaxPushBytes bounds push.max_metrics_bytes and push.max_event_bytes:
	// one pushed payload is copied whole into Go memory.
	MaxPushBytes = 1 << 30
	// MaxProcsLimit bounds max_procs.
	MaxProcsLimit = 4096
)

// LogLevels are the accepted log_level values, in order of verbosity.
var LogLevels = []string{"debug", "info", "warn", "error"}

// Config is the library's whole configuration, the JSON document
// kvr_router_new and kvr_validate_config take. Every key is optional;
// unknown keys are errors at every level.
type Config struct {
	// Router configures routing: mode, strategies, sticky sessions, and
	// the sizes of the block index (router.index) and load store
	// (router.load).
	// When to change: see its keys.
	Router router.Config `json:"router"`
	// Collectors lists the live sources of server state.
	// When to change: see its keys.
	Collectors collector.Config `json:"collectors"`
	// MaxProcs > 0 calls runtime.GOMAXPROCS (process-wide) when a library
	// instance is built.
	// When to change: set it to the CPUs the balancer should use when its
	// process sees many (Go otherwise uses every visible CPU).
	MaxProcs int `json:"max_procs"`
	// LogLevel of the collectors' logger on stderr: debug, info, warn or
	// error.
	// When to change: info or debug to see collectors' connection and scrape
	// problems.
	LogLevel string `json:"log_level"`
	// Push bounds the payloads callers push (kvr_update_metrics,
	// kvr_update_events).
	// When to change: see its keys.
	Push PushConfig `json:"push"`
	// Integration holds the keys only the Python package and its verl
	// hook act on; the library checks them and reports their defaults.
	// When to change: see its keys.
	Integration Integration `json:"integration"`
}

// PushConfig bounds pushed payloads; 0 means the default.
type PushConfig struct {
	// MaxMetricsBytes bounds one pushed Prometheus text (kvr_update_metrics).
	// When to change: raise it when pushed metrics are refused as too large.
	MaxMetricsBytes int64 `json:"max_metrics_bytes"`
	// MaxEventBytes bounds one pushed KV-event payload (kvr_update_events).
	// When to change: raise it when pushed KV-event batches are refused as too
	// large.
	MaxEventBytes int64 `json:"max_event_bytes"`
}

// ErrConfig is matched (errors.Is) by every configuration error.
var ErrConfig = errors.New("kvcrouter: invalid config")

// FieldError is a configuration error at one key. Key is the path from the
// document's root ("router.strategies[0].params.alpha",
// `collectors.collectors[1].urls["a"]`; "" for the document itself).
type FieldError struct {
	Key    string `json:"key"`
	Reason string `json:"reason"`
}

func (e *FieldError) Error() string {
	if e.Key == "" {
		return e.Reason
	}
	return e.Key + ": " + e.Reason
}

// Is makes every FieldError match ErrConfig.
func (e *FieldError) Is(target error) bool { return target == ErrConfig }

// fieldError turns a section's error into a FieldError rooted at prefix.
// Sections name their keys with *strictjson.KeyError; any other error is
// the section's as a whole.
func fieldError(prefix string, err error) *FieldError {
	var fe *FieldError
	if errors.As(err, &fe) {
		return fe
	}
	var ke *strictjson.KeyError
	if errors.As(err, &ke) {
		return &FieldError{Key: strictjson.Join(prefix, ke.Key), Reason: ke.Msg}
	}
	msg := err.Error()
	for _, sentinel := range []error{router.ErrConfig, collector.ErrConfig} {
		if errors.Is(err, sentinel) {
			msg = trimPrefix(msg, sentinel.Error()+": ")
		}
	}
	return &FieldError{Key: prefix, Reason: msg}
}

func trimPrefix(s, p string) string {
	if len(s) >= len(p) && s[:len(p)] == p {
		return s[len(p):]
	}
	return s
}

// raw is Config as first decoded: the sections stay raw so that each is
// decoded by its own package, with its own key names.
type raw struct {
	Router     json.RawMessage `json:"router"`
	Collectors json.RawMessage `json:"collectors"`
	MaxProcs   int             `json:"max_procs"`
	LogLevel   string          `json:"log_level"`
	Push       PushConfig      `json:"push"`
	// Integration is decoded strictly with the rest.
	Integration Integration `json:"integration"`
}

func isNull(b []byte) bool {
	b = bytes.TrimSpace(b)
	return len(b) == 0 || bytes.Equal(b, []byte("null"))
}

// Parse decodes a configuration document strictly and validates it. The
// result is normalised: Validate has filled in the defaults a router
// applies at construction. Errors are *FieldError. The document is either
// the library's own (Config) or, when it has a router_config key, the
// Python balancer's (Balancer: the configuration in the shape users write,
// translated in user.go).
func Parse(data []byte) (Config, error) {
	var c Config
	if isNull(data) {
		data = []byte("{}")
	}
	if isBalancer(data) {
		return parseBalancer(data)
	}
	var r raw
	if err := strictjson.Decode(data, &r); err != nil {
		return c, fieldError("", err)
	}
	c.MaxProcs, c.LogLevel, c.Push, c.Integration = r.MaxProcs, r.LogLevel, r.Push, r.Integration
	if err := c.validateTop(); err != nil {
		return c, err
	}
	routerDoc := r.Router
	if isNull(routerDoc) {
		routerDoc = []byte("{}")
	}
	rc, err := router.ParseConfig(routerDoc)
	if err != nil {
		return c, fieldError("router", err)
	}
	c.Router = rc
	if !isNull(r.Collectors) {
		cc, err := collector.ParseConfig(r.Collectors)
		if err != nil {
			return c, fieldError("collectors", err)
		}
		c.Collectors = cc
	}
	return c, c.Validate()
}

// Validate checks every section and fills the library's own defaults
// (log level, push limits) and the router's normalised values in place.
// The error, if any, is a *FieldError.
func (c *Config) Validate() error {
	if err := c.validateTop(); err != nil {
		return err
	}
	if err := c.Router.Normalise(); err != nil {
		return fieldError("router", err)
	}
	// Builds the strategies once: their parameters are checked here, not
	// first in New.
	if _, err := c.Router.Effective(); err != nil {
		return fieldError("router", err)
	}
	if err := c.Collectors.Validate(); err != nil {
		return fieldError("collectors", err)
	}
	if err := c.Integration.validate(); err != nil {
		fe := fieldError("", err)
		return &FieldError{Key: strictjson.Join("integration", fe.Key), Reason: fe.Reason}
	}
	return nil
}

func (c *Config) validateTop() error {
	if c.MaxProcs < 0 || c.MaxProcs > MaxProcsLimit {
		return &FieldError{Key: "max_procs", Reason: fmt.Sprintf("must be in [0, %d], got %d", MaxProcsLimit, c.MaxProcs)}
	}
	for _, v := range []struct {
		key string
		n   int64
	}{{"push.max_metrics_bytes", c.Push.MaxMetricsBytes}, {"push.max_event_bytes", c.Push.MaxEventBytes}} {
		if v.n < 0 {
			return &FieldError{Key: v.key, Reason: fmt.Sprintf("must not be negative, got %d", v.n)}
		}
		if v.n > MaxPushBytes {
			return &FieldError{Key: v.key, Reason: fmt.Sprintf("must be at most %d (1 GiB; 0 = default), got %d", int64(MaxPushBytes), v.n)}
		}
	}
	if c.Push.MaxMetricsBytes == 0 {
		c.Push.MaxMetricsBytes = DefaultMaxMetricsBytes
	}
	if c.Push.MaxEventBytes == 0 {
		c.Push.MaxEventBytes = DefaultMaxEventBytes
	}
	if c.LogLevel == "" {
		c.LogLevel = DefaultLogLevel
	}
	if _, err := logLevel(c.LogLevel); err != nil {
		return err
	}
	return nil
}

func logLevel(s string) (slog.Level, error) {
	switch s {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, &FieldError{Key: "log_level", Reason: fmt.Sprintf("%q (allowed: debug, info, warn, error)", s)}
}

// Effective is the configuration a library built from c runs with: every
// key that has a default filled in, in every section (the document
// kvr_validate_config returns). c must have passed Validate.
func (c Config) Effective() (Config, error) {
	rc, err := c.Router.Effective()
	if err != nil {
		return c, fieldError("router", err)
	}
	c.Router = rc
	c.Collectors = c.Collectors.Effective()
	return c, nil
}

// Defaults is the effective configuration of an empty document: every
// default of every section, for the given router mode ("default" or
// "kvc_aware"; "" is "default").
func Defaults(mode string) (Config, error) {
	c := Config{Router: router.Config{Mode: mode}}
	if err := c.Validate(); err != nil {
		return c, err
	}
	return c.Effective()
}
