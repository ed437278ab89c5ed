package server

import (
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/kvc-router/kvc-router/testbed/sim"
)

// Histogram buckets as in vLLM's PrometheusStatLogger.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
		7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	e2eBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
		120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
)

type histogram struct {
	bounds []float64
	counts []uint64 // per bucket (not cumulative), len(bounds)+1
	sum    float64
	n      uint64
}

func newHistogram(bounds []float64) histogram {
	return histogram{bounds: bounds, counts: make([]uint64, len(bounds)+1)}
}

func (h *histogram) observe(v float64) {
	i := sort.SearchFloat64s(h.bounds, v) // first bound >= v (le semantics)
	h.counts[i]++
	h.sum += v
	h.n++
}

func (h histogram) clone() histogram {
	h.counts = append([]uint64(nil), h.counts...)
	return h
}

// engineMetrics are the request-level series one engine loop records.
// Latencies are in simulated seconds (equal to wall seconds at --speed 1).
type engineMetrics struct {
	created float64
	ttft    histogram
	e2e     histogram
	success uint64
	aborted uint64
}

func (m *engineMetrics) init(created float64) {
	m.created = created
	m.ttft = newHistogram(ttftBuckets)
	m.e2e = newHistogram(e2eBuckets)
}

func (m *engineMetrics) observe(c sim.Completion) {
	m.ttft.observe(c.FirstTokenTime - c.Arrival)
	m.e2e.observe(c.FinishTime - c.Arrival)
	m.success++
}

type engineSnapshot struct {
	rank  int
	stats sim.Stats
	m     engineMetrics
	cfg   sim.Config
}

func (c *core) snapshot() (engineSnapshot, error) {
	var snap engineSnapshot
	err := c.do(func(e *sim.Engine) {
		snap = engineSnapshot{rank: c.rank, stats: e.Stats(), m: c.metrics, cfg: e.Config()}
		snap.m.ttft = c.metrics.ttft.clone()
		snap.m.e2e = c.metrics.e2e.clone()
	})
	return snap, err
}

// PyFloat formats v like prometheus_client's floatToGoString: Python repr,
// with values of more than 6 integer digits in Go-style exponent form.
func PyFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	var s string
	exp := 0
	if v != 0 {
		exp = int(math.Floor(math.Log10(math.Abs(v))))
		// Log10 can be off by one near powers of ten; confirm via 'e' format.
		es := strconv.FormatFloat(v, 'e', -1, 64)
		if i := strings.IndexByte(es, 'e'); i >= 0 {
			exp, _ = strconv.Atoi(es[i+1:])
		}
	}
	if v == 0 || (exp >= -4 && exp < 16) {
		s = strconv.FormatFloat(v, 'f', -1, 64)
		if !strings.ContainsAny(s, ".") {
			s += ".0"
		}
	} else {
		s = strconv.FormatFloat(v, 'e', -1, 64)
	}
	if dot := strings.IndexByte(s, '.'); v > 0 && dot > 6 {
		mant := strings.TrimRight(s[:1]+"."+s[1:dot]+s[dot+1:], "0.")
		return mant + "e+0" + strconv.Itoa(dot-1)
	}
	return s
}

type metricWriter struct {
	sb    strings.Builder
	model string
}

func (w *metricWriter) family(name, help, typ string) {
	w.sb.WriteString("# HELP ")
	w.sb.WriteString(name)
	w.sb.WriteByte(' ')
	w.sb.WriteString(help)
	w.sb.WriteString("\n# TYPE ")
	w.sb.WriteString(name)
	w.sb.WriteByte(' ')
	w.sb.WriteString(typ)
	w.sb.WriteByte('\n')
}

// sample writes name{labels} value; labels are name/value pairs already in
// alphabetical order.
func (w *metricWriter) sample(name string, v float64, labels ...string) {
	w.sb.WriteString(name)
	w.sb.WriteByte('{')
	for i := 0; i+1 < len(labels); i += 2 {
		if i > 0 {
			w.sb.WriteByte(',')
		}
		w.sb.WriteString(labels[i])
		w.sb.WriteString(`="`)
		w.sb.WriteString(escapeLabel(labels[i+1]))
		w.sb.WriteByte('"')
	}
	w.sb.WriteString("} ")
	w.sb.WriteString(PyFloat(v))
	w.sb.WriteByte('\n')
}

func escapeLabel(s string) string {
	if !strings.ContainsAny(s, "\\\"\n") {
		return s
	}
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}

func (w *metricWriter) gauge(name, help string, snaps []engineSnapshot, f func(engineSnapshot) float64) {
	w.family(name, help, "gauge")
	for _, s := range snaps {
		w.sample(name, f(s), "engine", strconv.Itoa(s.rank), "model_name", w.model)
	}
}

func (w *metricWriter) counter(name, help string, snaps []engineSnapshot, f func(engineSnapshot) float64) {
	w.family(name+"_total", help, "counter")
	for _, s := range snaps {
		w.sample(name+"_total", f(s), "engine", strconv.Itoa(s.rank), "model_name", w.model)
	}
	w.family(name+"_created", help, "gauge")
	for _, s := range snaps {
		w.sample(name+"_created", s.m.created, "engine", strconv.Itoa(s.rank), "model_name", w.model)
	}
}

func (w *metricWriter) histogram(name, help string, snaps []engineSnapshot, f func(engineSnapshot) histogram) {
	w.family(name, help, "histogram")
	for _, s := range snaps {
		h := f(s)
		eng := strconv.Itoa(s.rank)
		var cum uint64
		for i, b := range h.bounds {
			cum += h.counts[i]
			w.sample(name+"_bucket", float64(cum), "engine", eng, "le", PyFloat(b), "model_name", w.model)
		}
		w.sample(name+"_bucket", float64(h.n), "engine", eng, "le", "+Inf", "model_name", w.model)
		w.sample(name+"_count", float64(h.n), "engine", eng, "model_name", w.model)
		w.sample(name+"_sum", h.sum, "engine", eng, "model_name", w.model)
	}
	w.family(name+"_created", help, "gauge")
	for _, s := range snaps {
		w.sample(name+"_created", s.m.created, "engine", strconv.Itoa(s.rank), "model_name", w.model)
	}
}

// renderMetrics writes vLLM's classic Prometheus text exposition.
func renderMetrics(model, hashAlgo string, snaps []engineSnapshot) string {
	w := &metricWriter{model: model}
	w.gauge("vllm:num_requests_running", "Number of requests in model execution batches.", snaps,
		func(s engineSnapshot) float64 { return float64(s.stats.Running) })
	w.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", snaps,
		func(s engineSnapshot) float64 { return float64(s.stats.Waiting) })
	w.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", snaps,
		func(s engineSnapshot) float64 { return s.stats.KVUsage })
	w.counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.", snaps,
		func(s engineSnapshot) float64 { return float64(s.stats.PrefixQueries) })
	w.counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", snaps,
		func(s engineSnapshot) float64 { return float64(s.stats.PrefixHits) })
	tiers := false
	for _, s := range snaps {
		if s.cfg.CPUBlocks > 0 || s.cfg.SSDBlocks > 0 {
			tiers = true
		}
	}
	if tiers {
		w.counter("vllm:external_prefix_cache_queries", "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.", snaps,
			func(s engineSnapshot) float64 { return float64(s.stats.ExternalQueries) })
		w.counter("vllm:external_prefix_cache_hits", "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.", snaps,
			func(s engineSnapshot) float64 { return float64(s.stats.ExternalHits) })
	}
	w.counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", snaps,
		func(s engineSnapshot) float64 { return float64(s.stats.Preemptions) })
	w.counter("vllm:prompt_tokens", "Number of prefill tokens processed.", snaps,
		func(s engineSnapshot) float64 { return float64(s.stats.PromptTokens) })
	name := "vllm:prompt_tokens_by_source"
	w.family(name+"_total", "Number of prompt tokens by source.", "counter")
	for _, s := range snaps {
		eng := strconv.Itoa(s.rank)
		local := s.stats.PromptTokens - s.stats.PrefixHits - s.stats.ExternalHits
		w.sample(name+"_total", float64(local), "engine", eng, "model_name", model, "source", "local_compute")
		w.sample(name+"_total", float64(s.stats.PrefixHits), "engine", eng, "model_name", model, "source", "local_cache_hit")
		w.sample(name+"_total", float64(s.stats.ExternalHits), "engine", eng, "model_name", model, "source", "external_kv_transfer")
	}
	w.counter("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).", snaps,
		func(s engineSnapshot) float64 { return float64(s.stats.PrefixHits + s.stats.ExternalHits) })
	w.counter("vllm:generation_tokens", "Number of generation tokens processed.", snaps,
		func(s engineSnapshot) float64 { return float64(s.stats.GenerationTokens) })
	name = "vllm:request_success"
	w.family(name+"_total", "Count of successfully processed requests.", "counter")
	for _, s := range snaps {
		eng := strconv.Itoa(s.rank)
		for _, r := range []struct {
			reason string
			n      uint64
		}{{"stop", 0}, {"length", s.m.success}, {"abort", s.m.aborted}, {"error", 0}} {
			w.sample(name+"_total", float64(r.n), "engine", eng, "finished_reason", r.reason, "model_name", model)
		}
	}
	w.family(name+"_created", "Count of successfully processed requests.", "gauge")
	for _, s := range snaps {
		eng := strconv.Itoa(s.rank)
		for _, reason := range []string{"stop", "length", "abort", "error"} {
			w.sample(name+"_created", s.m.created, "engine", eng, "finished_reason", reason, "model_name", model)
		}
	}
	w.histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", snaps,
		func(s engineSnapshot) histogram { return s.m.ttft })
	w.histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", snaps,
		func(s engineSnapshot) histogram { return s.m.e2e })
	w.family("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", "gauge")
	for _, s := range snaps {
		cpu := "None"
		if s.cfg.CPUBlocks > 0 {
			cpu = strconv.Itoa(s.cfg.CPUBlocks)
		}
		w.sample("vllm:cache_config_info", 1,
			"block_size", strconv.Itoa(s.cfg.BlockSize),
			"cache_dtype", "auto",
			"calculate_kv_scales", "False",
			"cpu_offload_gb", "0",
			"enable_prefix_caching", "True",
			"engine", strconv.Itoa(s.rank),
			"gpu_memory_utilization", "0.9",
			"is_attention_free", "False",
			"kv_cache_size_tokens", strconv.Itoa(s.cfg.BlockSize*s.cfg.NumGPUBlocks),
			"num_cpu_blocks", cpu,
			"num_gpu_blocks", strconv.Itoa(s.cfg.NumGPUBlocks),
			"num_gpu_blocks_override", "None",
			"prefix_caching_hash_algo", hashAlgo,
			"sliding_window", "None",
			"swap_space", "4",
		)
	}
	return w.sb.String()
}
