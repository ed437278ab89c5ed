package collector

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/kvevents"
	"github.com/kvc-router/kvc-router/core/internal/memtrim"
	"github.com/kvc-router/kvc-router/core/internal/metrics"
	"github.com/kvc-router/kvc-router/core/internal/sink"
	"github.com/kvc-router/kvc-router/core/internal/strictjson"
)

// Collector is one live source of knowledge about the servers.
type Collector interface {
	Name() string
	Start()
	Close() error
	Status() any
}

// Sinks is what collectors write to: the KV-event and the load sink (the
// router implements both).
type Sinks interface {
	sink.Events
	sink.Load
}

// EndpointSetter is implemented by a collector that subscribes to
// publishers given per server (vllm_zmq): Manager.SetEndpoints reaches it.
// At most one such collector runs per manager.
type EndpointSetter interface {
	Collector
	SetEndpoints(server string, eps []Endpoint)
}

// Factory builds a collector from its configuration entry. The spec has
// passed Config validation; a Factory checks what is specific to it.
type Factory func(spec Spec, sinks Sinks, logger *slog.Logger) (Collector, error)

// Defaults fills the keys of a configuration entry that its collector
// reads, left zero, with the values the collector runs with: the
// effective configuration shows them.
type Defaults func(Spec) Spec

type kind struct {
	build    Factory
	defaults Defaults
}

var (
	registry = map[string]kind{}
	names    []string // registration order, for messages
)

// Register adds a collector under a name, as strategies are registered;
// defaults may be nil. It panics on duplicates, at init.
func Register(name string, f Factory, defaults Defaults) {
	if _, dup := registry[name]; dup {
		panic("collector: duplicate registration of " + name)
	}
	registry[name] = kind{build: f, defaults: defaults}
	names = append(names, name)
}

// Names lists the registered collector names in registration order.
func Names() []string { return slices.Clone(names) }

func init() {
	metricsFactory := func(flavor metrics.Flavor) Factory {
		return func(s Spec, sinks Sinks, logger *slog.Logger) (Collector, error) {
			return &metricsCollector{name: s.Name, Poller: NewPoller(sinks, PollerConfig{
				Flavor: flavor, Interval: ms(s.IntervalMS), Timeout: ms(s.TimeoutMS), MaxBytes: s.MaxBytes,
				BackoffMax: ms(s.BackoffMaxMS), URLs: s.URLs, Logger: logger,
			})}, nil
		}
	}
	metricsDefaults := func(s Spec) Spec {
		d := PollerConfig{Interval: ms(s.IntervalMS), Timeout: ms(s.TimeoutMS), MaxBytes: s.MaxBytes,
			BackoffMax: ms(s.BackoffMaxMS), Client: http.DefaultClient}.withDefaults()
		s.IntervalMS, s.TimeoutMS, s.MaxBytes, s.BackoffMaxMS = toMS(d.Interval), toMS(d.Timeout), d.MaxBytes, toMS(d.BackoffMax)
		return s
	}
	Register(NameVLLMMetrics, metricsFactory(metrics.VLLM), metricsDefaults)
	Register(NameVLLMPolling, metricsFactory(metrics.VLLM), metricsDefaults)
	Register(NameSGLangMetrics, metricsFactory(metrics.SGLang), metricsDefaults)
	zmqDefaults := func(s Spec) Spec {
		d := SubscriberConfig{ReplayTimeout: ms(s.ReplayTimeoutMS), IdleRedial: ms(s.IdleRedialMS), RetryInterval: ms(s.RetryMS),
			Limits: kvevents.Limits{MaxPayloadBytes: s.MaxPayloadBytes}}.withDefaults()
		s.ReplayTimeoutMS, s.IdleRedialMS, s.RetryMS = toMS(d.ReplayTimeout), toMS(d.IdleRedial), toMS(d.RetryInterval)
		s.MaxPayloadBytes = d.Limits.MaxPayloadBytes
		return s
	}
	Register(NameVLLMZMQ, func(s Spec, sinks Sinks, logger *slog.Logger) (Collector, error) {
		sc := SubscriberConfig{ReplayTimeout: ms(s.ReplayTimeoutMS), IdleRedial: ms(s.IdleRedialMS),
			RetryInterval: ms(s.RetryMS), Logger: logger}
		if s.MaxPayloadBytes > 0 {
			sc.Limits.MaxPayloadBytes = s.MaxPayloadBytes
		}
		ec := NewEventsCollector(sinks, sc)
		for server, eps := range s.Endpoints {
			ec.setConfigured(server, eps)
		}
		return ec, nil
	}, zmqDefaults)
}

func toMS(d time.Duration) int { return int(d / time.Millisecond) }

// Effective returns the configuration with every collector's defaults
// filled in (Defaults of its registration), and an empty list rather than
// none.
func (c Config) Effective() Config {
	out := Config{Collectors: make([]Spec, 0, len(c.Collectors))}
	for _, s := range c.Collectors {
		if k, ok := registry[s.Name]; ok && k.defaults != nil {
			s = k.defaults(s)
		}
		out.Collectors = append(out.Collectors, s)
	}
	return out
}

// Collector names accepted in configuration.
const (
	NameVLLMMetrics   = "vllm_metrics"
	NameVLLMPolling   = "vllm_polling" // alias of vllm_metrics
	NameSGLangMetrics = "sglang_metrics"
	NameVLLMZMQ       = "vllm_zmq"
)

// ErrConfig wraps collector configuration errors.
var ErrConfig = errors.New("collector: invalid config")

// Spec configures one collector.
type Spec struct {
	// Name of a registered collector (vllm_metrics, vllm_polling,
	// sglang_metrics, vllm_zmq).
	// When to change: to add a source of server state.
	Name string `json:"name"`
	// IntervalMS between scrapes of one server (metrics pollers).
	// When to change: lower for fresher load with short requests (more scrape
	// traffic); higher on large fleets.
	IntervalMS int `json:"interval_ms,omitempty"`
	// TimeoutMS bounds one scrape.
	// When to change: raise it when servers answer /metrics slowly under load.
	TimeoutMS int `json:"timeout_ms,omitempty"`
	// MaxBytes bounds one metrics response body.
	// When to change: raise it when a server's /metrics is larger (many
	// adapters or engines).
	MaxBytes int64 `json:"max_bytes,omitempty"`
	// BackoffMaxMS caps the retry delay of a failing server.
	// When to change: lower it to notice a recovered server sooner.
	BackoffMaxMS int `json:"backoff_max_ms,omitempty"`
	// URLs overrides the metrics URL per server id (default
	// http://<server id>/metrics).
	// When to change: when a server's /metrics is not at http://<server
	// id>/metrics (another port or path).
	URLs map[string]string `json:"urls,omitempty"`
	// Endpoints lists each server's KV-event publishers (vllm_zmq).
	// When to change: when servers publish KV events and the router cannot
	// learn where.
	Endpoints map[string][]Endpoint `json:"endpoints,omitempty"`
	// ReplayTimeoutMS bounds one replay exchange with a publisher.
	// When to change: raise it when replaying a large cache state takes
	// longer.
	ReplayTimeoutMS int `json:"replay_timeout_ms,omitempty"`
	// IdleRedialMS re-dials a publisher silent this long.
	// When to change: raise it when servers may publish nothing for longer
	// than this (idle), to avoid needless redials.
	IdleRedialMS int `json:"idle_redial_ms,omitempty"`
	// RetryMS is the wait between failed dials.
	// When to change: lower it to reconnect sooner after a server restarts.
	RetryMS int `json:"retry_ms,omitempty"`
	// MaxPayloadBytes bounds one KV-event batch.
	// When to change: raise it when a server publishes larger event batches.
	MaxPayloadBytes int `json:"max_payload_bytes,omitempty"`
}

// Config is the collectors section of the balancer configuration.
type Config struct {
	// Collectors to run, each fed by the pool; none by default (the router
	// then knows only what callers push and what it routed).
	// When to change: to read live server state: metrics for load, KV events
	// for an exact prefix index.
	Collectors []Spec `json:"collectors"`
}

// ParseConfig decodes the collectors section strictly and validates it.
// Every error wraps ErrConfig and a *strictjson.KeyError naming the key
// ("collectors[1].interval_ms").
func ParseConfig(data []byte) (Config, error) {
	var c Config
	if len(bytes.TrimSpace(data)) == 0 || string(bytes.TrimSpace(data)) == "null" {
		return c, nil
	}
	if err := strictjson.Decode(data, &c); err != nil {
		return c, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	return c, c.Validate()
}

// configErr is a validation error at key.
func configErr(key, format string, args ...any) error {
	return fmt.Errorf("%w: %w", ErrConfig, strictjson.Errorf(key, format, args...))
}

// Validate checks the values of a decoded configuration.
func (c Config) Validate() error {
	for i, s := range c.Collectors {
		if _, ok := registry[s.Name]; !ok {
			return configErr(fmt.Sprintf("collectors[%d].name", i), "%q (allowed: %s)", s.Name, strings.Join(names, ", "))
		}
		for _, v := range []struct {
			k string
			n int64
		}{{"interval_ms", int64(s.IntervalMS)}, {"timeout_ms", int64(s.TimeoutMS)}, {"max_bytes", s.MaxBytes},
			{"backoff_max_ms", int64(s.BackoffMaxMS)}, {"replay_timeout_ms", int64(s.ReplayTimeoutMS)},
			{"idle_redial_ms", int64(s.IdleRedialMS)}, {"retry_ms", int64(s.RetryMS)}, {"max_payload_bytes", int64(s.MaxPayloadBytes)}} {
			if v.n < 0 {
				return configErr(fmt.Sprintf("collectors[%d].%s", i, v.k), "must not be negative")
			}
			// Milliseconds become a time.Duration (nanoseconds): beyond
			// maxDurationMS the product overflowed and wrapped silently
			// (2^63-1 ms became the default).
			if strings.HasSuffix(v.k, "_ms") && v.n > maxDurationMS {
				return configErr(fmt.Sprintf("collectors[%d].%s", i, v.k), "must be at most %d ms (7 days), got %d", maxDurationMS, v.n)
			}
		}
		for server, eps := range s.Endpoints {
			if err := checkEndpoints(eps); err != nil {
				key, msg := fmt.Sprintf("collectors[%d].endpoints[%q]", i, server), err.Error()
				if strings.HasPrefix(msg, "[") { // "[j].field: reason"
					if k := strings.Index(msg, ": "); k > 0 {
						key, msg = key+msg[:k], msg[k+2:]
					}
				}
				return configErr(key, "%s", msg)
			}
		}
		for server, u := range s.URLs {
			pu, err := url.Parse(u)
			if err != nil || (pu.Scheme != "http" && pu.Scheme != "https") || pu.Host == "" {
				return configErr(fmt.Sprintf("collectors[%d].urls[%q]", i, server), "%q is not an http(s) URL", u)
			}
		}
	}
	return nil
}

// maxDurationMS bounds every *_ms setting (7 days, as the router's).
const maxDurationMS = 7 * 24 * 3600 * 1000

// MaxEndpointsPerServer bounds a server's KV-event publishers (one per
// data-parallel rank); each runs a subscriber goroutine and a socket.
const MaxEndpointsPerServer = 64

// maxTopicBytes bounds a subscription topic (vLLM's is ~40 bytes).
const maxTopicBytes = 4096

// checkEndpoint accepts tcp://host:port (port 1-65535; host may be a bind
// address such as *, replaced by the server's host) and ipc://path.
func checkEndpoint(ep string) error {
	u, err := url.Parse(ep)
	if err != nil {
		return err
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%q: no user, query or fragment allowed", ep)
	}
	switch u.Scheme {
	case "tcp":
		if u.Host == "" || u.Hostname() == "" || u.Port() == "" {
			return fmt.Errorf("%q needs host:port", ep)
		}
		if n, err := strconv.Atoi(u.Port()); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("%q: port must be in [1, 65535]", ep)
		}
		if u.Path != "" {
			return fmt.Errorf("%q: a tcp endpoint has no path", ep)
		}
	case "ipc":
		if u.Host+u.Path+u.Opaque == "" {
			return fmt.Errorf("%q needs a path", ep)
		}
	default:
		return fmt.Errorf("%q: scheme must be tcp or ipc", ep)
	}
	return nil
}

// checkEndpoints validates one server's publisher list: at most
// MaxEndpointsPerServer, each endpoint and replay address well-formed, a
// bounded topic, no endpoint listed twice. It names the entry at fault
// ("[3].replay: ...").
func checkEndpoints(eps []Endpoint) error {
	if len(eps) > MaxEndpointsPerServer {
		return fmt.Errorf("%d endpoints, more than the limit of %d per server", len(eps), MaxEndpointsPerServer)
	}
	seen := make(map[string]int, len(eps))
	for j, ep := range eps {
		if err := checkEndpoint(ep.Endpoint); err != nil {
			return fmt.Errorf("[%d].endpoint: %v", j, err)
		}
		if ep.Replay != "" {
			if err := checkEndpoint(ep.Replay); err != nil {
				return fmt.Errorf("[%d].replay: %v", j, err)
			}
		}
		if len(ep.Topic) > maxTopicBytes {
			return fmt.Errorf("[%d].topic: %d bytes, more than the limit of %d", j, len(ep.Topic), maxTopicBytes)
		}
		if k, dup := seen[ep.Endpoint]; dup {
			return fmt.Errorf("[%d].endpoint: %q is also endpoints[%d]", j, ep.Endpoint, k)
		}
		seen[ep.Endpoint] = j
	}
	return nil
}

// Manager owns a router's collectors and the push paths.
type Manager struct {
	r          Sinks
	collectors []Collector
	events     EndpointSetter
	push       EventStats
	pushMetErr uint64
	mu         sync.Mutex
}

// Start builds and starts every configured collector.
func Start(r Sinks, cfg Config, logger *slog.Logger) (*Manager, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.Default()
	}
	m := &Manager{r: r}
	for _, s := range cfg.Collectors {
		c, err := registry[s.Name].build(s, r, logger)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrConfig, err)
		}
		if es, ok := c.(EndpointSetter); ok {
			if m.events != nil {
				return nil, fmt.Errorf("%w: %s configured twice", ErrConfig, s.Name)
			}
			m.events = es
		}
		m.collectors = append(m.collectors, c)
	}
	for _, c := range m.collectors {
		c.Start()
	}
	return m, nil
}

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// SetEndpoints (re)configures a server's KV-event publishers. Without a
// vllm_zmq collector it is an error.
func (m *Manager) SetEndpoints(server string, eps []Endpoint) error {
	if m.events == nil {
		return fmt.Errorf("%w: no vllm_zmq collector configured", ErrConfig)
	}
	if err := checkEndpoints(eps); err != nil {
		sep := ": "
		if strings.HasPrefix(err.Error(), "[") {
			sep = ""
		}
		return fmt.Errorf("%w: endpoints%s%v", ErrConfig, sep, err)
	}
	// Subscriptions follow pool members only: endpoints for any other id
	// would be kept (and grow) without ever being used.
	if !slices.Contains(m.r.Servers(), server) {
		return fmt.Errorf("%w: %q", ErrUnknownServer, server)
	}
	m.events.SetEndpoints(server, eps)
	return nil
}

// PushEvents decodes and applies one raw KV-event payload for a server.
func (m *Manager) PushEvents(server string, payload []byte) error {
	return ApplyPayload(m.r, server, payload, &m.push)
}

// PushMetrics parses Prometheus text for a server and stores it.
func (m *Manager) PushMetrics(server string, text []byte, flavor metrics.Flavor) error {
	err := PushMetrics(m.r, server, text, flavor)
	if err != nil {
		m.mu.Lock()
		m.pushMetErr++
		m.mu.Unlock()
	}
	return err
}

// Status is every collector's state plus the push-path counters.
type Status struct {
	Collectors    map[string]any `json:"collectors"`
	PushEvents    EventCounts    `json:"push_events"`
	PushMetricErr uint64         `json:"push_metric_errors"`
	// Memory counts large inputs and the memory returns they armed.
	Memory memtrim.Stats `json:"memory"`
	// Panics counts panics recovered in collector goroutines (process-wide;
	// each collector's status names the server).
	Panics uint64 `json:"panics"`
}

// Status reports the collectors.
func (m *Manager) Status() Status {
	st := Status{Collectors: map[string]any{}, PushEvents: m.push.Snapshot(), Memory: memtrim.Snapshot(), Panics: Panics()}
	for _, c := range m.collectors {
		st.Collectors[c.Name()] = c.Status()
	}
	m.mu.Lock()
	st.PushMetricErr = m.pushMetErr
	m.mu.Unlock()
	return st
}

// Close stops every collector.
func (m *Manager) Close() error {
	var errs []error
	for _, c := range m.collectors {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

type metricsCollector struct {
	name string
	*Poller
}

func (c *metricsCollector) Name() string { return c.name }
func (c *metricsCollector) Status() any  { return c.Poller.Status() }

// EventsCollector runs one Subscriber per configured publisher of every
// pool member, following the pool as servers come and go.
type EventsCollector struct {
	r   sink.Events
	cfg SubscriberConfig
	mu  sync.Mutex
	eps map[string][]Endpoint
	// configured holds the endpoints the configuration names (bounded by
	// it); members the servers seen in the pool. A server that leaves the
	// pool falls back to its configured endpoints: endpoints set at run
	// time for churned ids are forgotten, not kept forever.
	configured map[string][]Endpoint
	members    map[string]bool
	subs       map[string][]*Subscriber
	stop       chan struct{}
	done       chan struct{}
	closed     bool
}

// NewEventsCollector prepares a vllm_zmq collector.
func NewEventsCollector(r sink.Events, cfg SubscriberConfig) *EventsCollector {
	return &EventsCollector{r: r, cfg: cfg.withDefaults(), eps: map[string][]Endpoint{}, subs: map[string][]*Subscriber{},
		configured: map[string][]Endpoint{}, members: map[string]bool{}}
}

// Name implements Collector.
func (e *EventsCollector) Name() string { return NameVLLMZMQ }

// setConfigured records a server's publishers from the configuration.
func (e *EventsCollector) setConfigured(server string, eps []Endpoint) {
	norm := normaliseEndpoints(server, eps)
	e.mu.Lock()
	e.configured[server] = norm
	e.eps[server] = norm
	e.mu.Unlock()
}

// SetEndpoints records a server's publishers; subscriptions follow at the
// next sync. Bind-style hosts (tcp://*:5557) are replaced by the server's host.
func (e *EventsCollector) SetEndpoints(server string, eps []Endpoint) {
	norm := normaliseEndpoints(server, eps)
	e.mu.Lock()
	e.eps[server] = norm
	e.mu.Unlock()
	e.sync()
}

func normaliseEndpoints(server string, eps []Endpoint) []Endpoint {
	host := ""
	if u, err := url.Parse("http://" + server); err == nil {
		host = u.Hostname()
	}
	norm := make([]Endpoint, len(eps))
	for i, ep := range eps {
		ep.Endpoint = normaliseEndpoint(ep.Endpoint, host)
		ep.Replay = normaliseEndpoint(ep.Replay, host)
		norm[i] = ep
	}
	return norm
}

// Start implements Collector.
func (e *EventsCollector) Start() {
	e.stop = make(chan struct{})
	e.done = make(chan struct{})
	go func() {
		defer close(e.done)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			if perr := guard(e.sync); perr != nil {
				e.cfg.Logger.Error("kv events: subscription sync panicked; continuing", "panic", perr.Value, "stack", perr.Stack)
			}
			select {
			case <-e.stop:
				return
			case <-t.C:
			}
		}
	}()
}

// sync starts subscriptions for pool members with endpoints and stops
// those of removed servers or changed endpoints.
func (e *EventsCollector) sync() {
	pool := map[string]bool{}
	for _, s := range e.r.Servers() {
		pool[s] = true
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stop == nil || e.closed {
		return // not started, or closed
	}
	for server := range pool {
		e.members[server] = true
	}
	for server := range e.members {
		if pool[server] {
			continue
		}
		// Removed from the pool: forget what was set at run time.
		delete(e.members, server)
		if c, ok := e.configured[server]; ok {
			e.eps[server] = c
		} else {
			delete(e.eps, server)
		}
	}
	for server, subs := range e.subs {
		want := e.eps[server]
		if pool[server] && sameEndpoints(subs, want) {
			continue
		}
		for _, s := range subs {
			_ = s.Close()
		}
		delete(e.subs, server)
		if !pool[server] {
			continue
		}
	}
	for server, eps := range e.eps {
		if !pool[server] || len(e.subs[server]) > 0 || len(eps) == 0 {
			continue
		}
		var subs []*Subscriber
		for _, ep := range eps {
			s := NewSubscriber(e.r, server, ep, e.cfg)
			s.Start()
			subs = append(subs, s)
		}
		e.subs[server] = subs
	}
}

func sameEndpoints(subs []*Subscriber, eps []Endpoint) bool {
	if len(subs) != len(eps) {
		return false
	}
	for i := range subs {
		if subs[i].ep != eps[i] {
			return false
		}
	}
	return true
}

// Close implements Collector.
func (e *EventsCollector) Close() error {
	e.mu.Lock()
	already := e.closed
	e.closed = true
	e.mu.Unlock()
	if already {
		return nil
	}
	if e.stop != nil {
		close(e.stop)
		<-e.done
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for server, subs := range e.subs {
		for _, s := range subs {
			_ = s.Close()
		}
		delete(e.subs, server)
	}
	return nil
}

// Status implements Collector: one entry per publisher, sorted.
func (e *EventsCollector) Status() any {
	e.mu.Lock()
	var subs []*Subscriber
	for _, ss := range e.subs {
		subs = append(subs, ss...)
	}
	e.mu.Unlock()
	out := make([]PublisherStatus, 0, len(subs))
	for _, s := range subs {
		out = append(out, s.Status())
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Server != out[j].Server {
			return out[i].Server < out[j].Server
		}
		return out[i].Endpoint < out[j].Endpoint
	})
	return out
}
