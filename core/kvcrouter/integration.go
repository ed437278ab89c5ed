package kvcrouter

import (
	"fmt"
	"math"
	"strings"

	"github.com/kvc-router/kvc-router/core/internal/metrics"
)

// KV-event modes (Integration.KVEvents).
const (
	KVEventsOff  = "off"
	KVEventsAuto = "auto"
)

// Defaults of the integration keys.
const (
	DefaultMetricsPeriodS         = 5.0
	DefaultMetricsMaxServerLabels = 64
	DefaultHandleTimeoutMS        = 5000
	maxHandleTimeoutMS            = 3600 * 1000
)

// KVEventsModes are the accepted kv_events values.
var KVEventsModes = []string{KVEventsOff, KVEventsAuto}

// MetricsFlavors names the Prometheus dialects a pushed metrics text may
// be in; a flavour's index is its code in kvr_update_metrics.
var MetricsFlavors = []string{metrics.VLLM.String(), metrics.SGLang.String()}

// Integration holds the keys that the Python package (kvc_router) and its
// verl hook act on. The library checks them and reports them with their
// defaults (kvr_validate_config) so that one schema holds every key a user
// writes; it does not act on them itself.
type Integration struct {
	// KVEvents "auto" makes kvc_router's verl hook give every vLLM
	// replica verl launches its own KV-event publisher (ports from
	// kv_events_base_port, topic kvc-router.replica-<rank>) and tell the
	// router where to subscribe (the vllm_zmq collector); "off" leaves the
	// servers as verl starts them. When to change: set "auto" under verl
	// with vLLM servers, so the prefix index follows what each server
	// really holds instead of what was routed to it.
	KVEvents string `json:"kv_events"`
	// KVEventsBasePort is the first port of the KV-event port blocks
	// (replica r, data-parallel size dp owns [base + 2·dp·r, base +
	// 2·dp·(r+1))); 0 = the KVC_ROUTER_KV_EVENTS_BASE_PORT environment
	// variable, else 30000. When to change: when those ports are taken on
	// the rollout nodes, or two jobs share a node.
	KVEventsBasePort int `json:"kv_events_base_port"`
	// EnableServerMetrics makes kvc_router's verl hook start vLLM with
	// disable_log_stats=false, so its /metrics gauges (running, waiting,
	// KV-cache usage) update; verl's default leaves them frozen at zero.
	// When to change: set true in kvc_aware mode unless you already set
	// actor_rollout_ref.rollout.disable_log_stats=false.
	EnableServerMetrics bool `json:"enable_server_metrics"`
	// MetricsFlavor is the dialect of the Prometheus texts callers push
	// (KVCAwareBalancer.update_metrics): vllm or sglang. When to change:
	// set sglang when you push SGLang servers' /metrics yourself.
	MetricsFlavor string `json:"metrics_flavor"`
	// Metrics configures the router's own metrics in Ray's Prometheus
	// export (kvc_router.metrics). When to change: see its keys.
	Metrics MetricsExport `json:"metrics"`
	// Collector holds the collector keys the Python balancer reads (it
	// asks server handles for their KV-event publishers). When to change:
	// see its keys.
	Collector HandleEndpoints `json:"collector"`
}

// MetricsExport is the router's Ray metrics export.
type MetricsExport struct {
	// Enabled: unset = on inside a Ray actor, off elsewhere; false turns
	// it off (the YAML `metrics: off` also does). When to change: false
	// when the Ray metrics agent is not scraped, to save the snapshot
	// thread.
	Enabled *bool `json:"enabled"`
	// PeriodS is the time between two snapshots of get_status(), in
	// seconds, in [0.05, 3600]. When to change: shorter for finer
	// dashboards, longer to cost less on a very large pool.
	PeriodS *float64 `json:"period_s"`
	// MaxServerLabels bounds the distinct `server` label values, in [1,
	// 10000]; later servers share the label `_other`. When to change:
	// raise it when the fleet has more servers than this and you want
	// each on its own series.
	MaxServerLabels *int `json:"max_server_labels"`
}

// HandleEndpoints are the KV-event endpoint settings the Python balancer
// acts on.
type HandleEndpoints struct {
	// Topic is the ZMQ topic of configured and handle-reported endpoints
	// that name none; "" receives every topic. When to change: when the
	// servers publish under a topic and share a publisher.
	Topic string `json:"topic"`
	// UseHandleEndpoints asks each server handle's
	// get_kv_events_endpoints() for its publishers when collector.endpoints
	// does not list the server. When to change: false when handles offer
	// the method but their endpoints are not reachable from the router.
	UseHandleEndpoints *bool `json:"use_handle_endpoints"`
	// HandleTimeoutMS bounds that call, in [1, 3600000]. When to change:
	// raise it when servers answer slowly while starting.
	HandleTimeoutMS *int `json:"handle_timeout_ms"`
}

// validate checks the integration keys and fills their defaults. Keys in
// errors are relative to the section.
func (ig *Integration) validate() error {
	if ig.KVEvents == "" {
		ig.KVEvents = KVEventsOff
	}
	if !contains(KVEventsModes, ig.KVEvents) {
		return &FieldError{Key: "kv_events", Reason: fmt.Sprintf("%q (allowed: %s)", ig.KVEvents, quoted(KVEventsModes))}
	}
	if ig.KVEventsBasePort < 0 || ig.KVEventsBasePort > 65535 {
		return &FieldError{Key: "kv_events_base_port", Reason: fmt.Sprintf("must be an integer in [0, 65535], got %d", ig.KVEventsBasePort)}
	}
	if ig.MetricsFlavor == "" {
		ig.MetricsFlavor = MetricsFlavors[0]
	}
	if !contains(MetricsFlavors, ig.MetricsFlavor) {
		return &FieldError{Key: "metrics_flavor", Reason: fmt.Sprintf("%q (allowed: %s)", ig.MetricsFlavor, quoted(MetricsFlavors))}
	}
	m := &ig.Metrics
	m.PeriodS = orDefault(m.PeriodS, DefaultMetricsPeriodS)
	if p := *m.PeriodS; math.IsNaN(p) || p < 0.05 || p > 3600 {
		return &FieldError{Key: "metrics.period_s", Reason: fmt.Sprintf("must be a number in [0.05, 3600], got %v", p)}
	}
	m.MaxServerLabels = orDefault(m.MaxServerLabels, DefaultMetricsMaxServerLabels)
	if n := *m.MaxServerLabels; n < 1 || n > 10000 {
		return &FieldError{Key: "metrics.max_server_labels", Reason: fmt.Sprintf("must be an integer in [1, 10000], got %d", n)}
	}
	h := &ig.Collector
	h.UseHandleEndpoints = orDefault(h.UseHandleEndpoints, true)
	h.HandleTimeoutMS = orDefault(h.HandleTimeoutMS, DefaultHandleTimeoutMS)
	if n := *h.HandleTimeoutMS; n < 1 || n > maxHandleTimeoutMS {
		return &FieldError{Key: "collector.handle_timeout_ms", Reason: fmt.Sprintf("must be an integer in [1, %d], got %d", maxHandleTimeoutMS, n)}
	}
	if len(h.Topic) > 4096 {
		return &FieldError{Key: "collector.topic", Reason: fmt.Sprintf("%d bytes, more than the limit of 4096", len(h.Topic))}
	}
	return nil
}

// orDefault is p, or a pointer to def when p is unset.
func orDefault[T any](p *T, def T) *T {
	if p == nil {
		return &def
	}
	return p
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// quoted lists values as the Python package's messages do: 'a', 'b'.
func quoted(list []string) string {
	q := make([]string, len(list))
	for i, s := range list {
		q[i] = "'" + s + "'"
	}
	return strings.Join(q, ", ")
}
