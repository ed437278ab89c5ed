// Package metrics turns one Prometheus text-format scrape of a serving
// engine's /metrics endpoint (vLLM or SGLang) into a load.Metrics.
//
// Parsing uses prometheus/common's expfmt text parser (classic format,
// legacy name validation; colons in names are legal), fed only the lines of
// the families the router reads; lines of declared families it does not
// read are skipped unchecked and other lines get a light syntax check (see
// filter.go), which makes a scrape over 10x cheaper. Bodies in OpenMetrics
// style are tolerated as far as the router needs: "# EOF" (with or without
// a final newline), "# UNIT" lines, and TYPE lines of OpenMetrics-only types
// (info, stateset, gaugehistogram, unknown), whose samples are read as
// untyped. Exemplars are not supported: scrape without an OpenMetrics Accept
// header. A gzip body is rejected as malformed (let net/http decompress).
//
// Conventions shared by both flavors:
//   - Every sample of a family the router reads must be possible (see
//     rule): request counts and token counters finite and >= 0, usage
//     fractions finite and in [0, 1], info gauges finite. One impossible
//     sample rejects the whole scrape with ErrImpossible (which wraps
//     ErrMalformed), naming the sample: the collectors then count a
//     malformed scrape and the server's last good metrics age out.
//     Aggregates must pass load.Metrics.Check too (a sum can overflow).
//   - "_created" families (prometheus_client's creation timestamps) are
//     ignored, as is every family not listed below.
//   - Several samples of one family for the same engine (e.g. differing only
//     in model_name) are summed for counters and gauges of request counts and
//     averaged for usage fractions.
package metrics

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvc-router/kvc-router/core/internal/load"
)

// Flavor selects the serving engine whose metric names are read.
type Flavor uint8

const (
	// VLLM reads vllm:* families; data-parallel engines are told apart by
	// the "engine" label.
	VLLM Flavor = iota
	// SGLang reads sglang:* families; data-parallel ranks are told apart by
	// the "dp_rank" label.
	SGLang
)

func (f Flavor) String() string {
	switch f {
	case VLLM:
		return "vllm"
	case SGLang:
		return "sglang"
	}
	return "flavor(" + strconv.Itoa(int(f)) + ")"
}

// DefaultLimit is the body size limit used when Parse gets limit <= 0.
// A realistic single-engine vLLM scrape is 40-100 KiB.
const DefaultLimit = 8 << 20

var (
	// ErrMalformed wraps every error about text that cannot be parsed.
	ErrMalformed = errors.New("metrics: malformed exposition text")
	// ErrTooLarge is returned when the body exceeds the size limit.
	ErrTooLarge = errors.New("metrics: body too large")
	// ErrNoMetrics is returned when the text parses but holds none of the
	// flavor's load families (running, waiting, KV usage): most likely the
	// wrong endpoint, the wrong flavor, or metrics disabled.
	ErrNoMetrics = errors.New("metrics: no serving-engine metrics found")
	// ErrImpossible wraps every error about a well-formed sample holding a
	// value no engine can report (a negative count, NaN, ±Inf, a usage
	// outside [0, 1]); it wraps ErrMalformed.
	ErrImpossible = fmt.Errorf("%w: impossible value", ErrMalformed)
)

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// Parse reads at most limit bytes (DefaultLimit when limit <= 0) of
// Prometheus text from r and extracts the flavor's load metrics. A longer
// body yields ErrTooLarge. At is set to the time parsing finished.
func Parse(r io.Reader, flavor Flavor, limit int64) (load.Metrics, error) {
	if limit <= 0 {
		limit = DefaultLimit
	}
	buf := bufPool.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= 1<<20 { // do not pin huge buffers
			buf.Reset()
			bufPool.Put(buf)
		}
	}()
	buf.Reset()
	n, err := buf.ReadFrom(io.LimitReader(r, limit+1))
	if err != nil {
		return load.Metrics{}, fmt.Errorf("metrics: reading body: %w", err)
	}
	if n > limit {
		return load.Metrics{}, fmt.Errorf("%w: more than %d bytes", ErrTooLarge, limit)
	}
	return parse(buf.Bytes(), flavor)
}

// ParseBytes is Parse over an in-memory body. body is not modified.
func ParseBytes(body []byte, flavor Flavor, limit int64) (load.Metrics, error) {
	if limit <= 0 {
		limit = DefaultLimit
	}
	if int64(len(body)) > limit {
		return load.Metrics{}, fmt.Errorf("%w: %d bytes exceed limit %d", ErrTooLarge, len(body), limit)
	}
	return parse(body, flavor)
}

func parse(body []byte, flavor Flavor) (load.Metrics, error) {
	var wanted *familySet
	switch flavor {
	case VLLM:
		wanted = vllmFamilies
	case SGLang:
		wanted = sglangFamilies
	default:
		return load.Metrics{}, fmt.Errorf("metrics: unknown flavor %d", flavor)
	}
	if len(body) >= 2 && body[0] == 0x1f && body[1] == 0x8b {
		return load.Metrics{}, fmt.Errorf("%w: body is gzip-compressed", ErrMalformed)
	}
	fb := filterPool.Get().(*filtered)
	defer filterPool.Put(fb)
	if err := fb.filter(body, wanted); err != nil {
		return load.Metrics{}, err
	}
	a := arenaPool.Get().(*fastArena)
	defer func() {
		// fams (from a) is only read below; m holds no references into it.
		keep := a.pooled()
		a.reset()
		if keep {
			arenaPool.Put(a)
		}
	}()
	fams, ok := a.readFamilies(fb.text)
	var err error
	if !ok {
		fams, err = expfmtFamilies(fb.text)
	}
	if err != nil {
		var pe expfmt.ParseError
		if errors.As(err, &pe) {
			return load.Metrics{}, fmt.Errorf("%w: line %d: %s", ErrMalformed, fb.origLine(pe.Line), pe.Msg)
		}
		return load.Metrics{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	var m load.Metrics
	if flavor == VLLM {
		err = fromVLLM(fams, &m)
	} else {
		err = fromSGLang(fams, &m)
	}
	if err != nil {
		return load.Metrics{}, err
	}
	if err := m.Check(); err != nil {
		return load.Metrics{}, fmt.Errorf("%w: %v", ErrImpossible, err)
	}
	m.At = time.Now()
	return m, nil
}

// expfmtFamilies is the reference parser (see fastFamilies).
func expfmtFamilies(text []byte) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	return p.TextToMetricFamilies(bytes.NewReader(text))
}

// value returns a sample's value and whether it is a scalar.
func value(m *dto.Metric) (float64, bool) {
	var v float64
	switch {
	case m.Gauge != nil:
		v = m.Gauge.GetValue()
	case m.Counter != nil:
		v = m.Counter.GetValue()
	case m.Untyped != nil:
		v = m.Untyped.GetValue()
	default:
		return 0, false // histogram/summary under a name we expected scalar
	}
	return v, true
}

// rule is what a family's samples may hold.
type rule uint8

const (
	// count: request counts, token counters, capacities: finite, >= 0.
	count rule = iota
	// fraction: usage fractions: finite, in [0, 1].
	fraction
	// info: info gauges (1 = in effect, 0 = not): finite.
	info
)

// check reports why v breaks r, or "".
func (r rule) check(v float64) string {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return "a metric the router reads must be finite"
	case r == count && v < 0:
		return "a count cannot be negative"
	case r == fraction && (v < 0 || v > 1):
		return "a usage fraction must be in [0, 1]"
	}
	return ""
}

// impossible is the ErrImpossible error for sample m of fam.
func impossible(fam *dto.MetricFamily, m *dto.Metric, v float64, why string) error {
	var b bytes.Buffer
	b.WriteString(fam.GetName())
	if len(m.Label) > 0 {
		b.WriteByte('{')
		for i, l := range m.Label {
			if i > 0 {
				b.WriteByte(',')
			}
			if b.Len() > 200 { // hostile label sets stay out of the message
				b.WriteString("...")
				break
			}
			fmt.Fprintf(&b, "%s=%q", l.GetName(), l.GetValue())
		}
		b.WriteByte('}')
	}
	return fmt.Errorf("%w: %s = %v: %s", ErrImpossible, b.String(), v, why)
}

// sampleChecker collects the first impossible sample of a scrape.
type sampleChecker struct{ err error }

func (c *sampleChecker) check(fam *dto.MetricFamily, m *dto.Metric, v float64, r rule) bool {
	why := r.check(v)
	if why == "" {
		return true
	}
	if c.err == nil {
		c.err = impossible(fam, m, v, why)
	}
	return false
}

func label(m *dto.Metric, name string) (string, bool) {
	for _, l := range m.Label {
		if l.GetName() == name {
			return l.GetValue(), true
		}
	}
	return "", false
}

// perKey is one engine's (or DP rank's) aggregate of one family.
type perKey struct {
	key     string
	replica [2]int  // (tp_rank, pp_rank) of the kept samples (SGLang)
	sum     float64 // of finite samples
	n       int     // finite samples
}

// collect aggregates the finite samples of fam per value of keyLabel
// (absent label = ""). With replicas set (SGLang), only samples of the
// lowest (tp_rank, pp_rank) seen for a key are kept, so tensor/pipeline
// replicas reporting the same scheduler state are counted once.
// keys receives every key that had a sample. Every scalar sample is checked
// against r first (replicas that are skipped included); the first
// impossible one is recorded in c.
func (c *sampleChecker) collect(fam *dto.MetricFamily, r rule, keyLabel string, replicas bool, keys *[]string) []perKey {
	if fam == nil {
		return nil
	}
	var out []perKey
	var index map[string]int // built once there are many keys (hostile input)
	for _, m := range fam.Metric {
		key, _ := label(m, keyLabel)
		addKey(keys, key)
		var rep [2]int
		if replicas {
			rep = [2]int{rankOf(m, "tp_rank"), rankOf(m, "pp_rank")}
		}
		v, ok := value(m)
		ok = ok && c.check(fam, m, v, r)
		idx := -1
		if index != nil {
			if i, found := index[key]; found {
				idx = i
			}
		} else {
			for i := range out {
				if out[i].key == key {
					idx = i
					break
				}
			}
		}
		if idx < 0 {
			out = append(out, perKey{key: key, replica: rep})
			idx = len(out) - 1
			if index != nil {
				index[key] = idx
			} else if len(out) > 16 {
				index = make(map[string]int, 2*len(out))
				for i := range out {
					index[out[i].key] = i
				}
			}
		}
		pk := &out[idx]
		if replicas && less(rep, pk.replica) {
			pk.replica, pk.sum, pk.n = rep, 0, 0
		}
		if replicas && rep != pk.replica {
			continue
		}
		if ok {
			pk.sum += v
			pk.n++
		}
	}
	return out
}

func less(a, b [2]int) bool { return a[0] < b[0] || (a[0] == b[0] && a[1] < b[1]) }

// rankOf reads an integer rank label; absent means 0, unparsable sorts last.
func rankOf(m *dto.Metric, name string) int {
	s, ok := label(m, name)
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return math.MaxInt32
	}
	return n
}

// addKey records k in keys once. Lookups are linear: keys holds the
// distinct engine/rank values of the load gauges, capped by maxKeys.
func addKey(keys *[]string, k string) {
	if keys == nil || len(*keys) >= maxKeys {
		return
	}
	for _, x := range *keys {
		if x == k {
			return
		}
	}
	*keys = append(*keys, k)
}

// maxKeys caps the distinct engines counted (a real server has a few; the
// cap bounds work on hostile input).
const maxKeys = 1024

// sum adds the per-key sums.
func sum(pks []perKey) float64 {
	var s float64
	for _, pk := range pks {
		s += pk.sum
	}
	return s
}

// usage averages per-key means of a fraction gauge, weighted by weight(key)
// when every contributing key has a positive weight, else a plain mean.
func usage(pks []perKey, weight func(string) float64) (float64, bool) {
	var num, den, plain float64
	var n int
	weighted := weight != nil
	for _, pk := range pks {
		if pk.n == 0 {
			continue
		}
		mean := pk.sum / float64(pk.n)
		plain += mean
		n++
		if weighted {
			w := weight(pk.key)
			if w <= 0 {
				weighted = false
				continue
			}
			num += mean * w
			den += w
		}
	}
	if n == 0 {
		return 0, false
	}
	if weighted && den > 0 {
		return num / den, true
	}
	return plain / float64(n), true
}

// first returns the first non-nil family among names.
func first(fams map[string]*dto.MetricFamily, names ...string) *dto.MetricFamily {
	for _, n := range names {
		if f := fams[n]; f != nil && len(f.Metric) > 0 {
			return f
		}
	}
	return nil
}

// engineConfig is what vllm:cache_config_info says about one engine.
type engineConfig struct {
	key                              string
	blockSize, numBlocks, tokensSize int
}

// intLabel parses an integer label rendered by Python str() ("None" -> 0).
func intLabel(m *dto.Metric, name string) int {
	s, ok := label(m, name)
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// fromVLLM fills m from vLLM V1 families (legacy V0/<=0.9 names as fallback).
//
// Aggregation over the `engine` label (one value per data-parallel engine
// core behind this API server): running, waiting and all prefix counters are
// summed; KV usage is the mean over engines weighted by num_gpu_blocks from
// vllm:cache_config_info when every engine's is known (else by
// kv_cache_size_tokens when every engine's is known, else unweighted);
// BlockSize is the first engine's block_size; NumGPUBlocks is the sum over
// engines. Engines counts distinct engine values of the load gauges (samples
// without the label count as one engine). cache_config_info without an
// engine label (<= 0.10) applies to the whole server.
func fromVLLM(fams map[string]*dto.MetricFamily, m *load.Metrics) error {
	running := fams["vllm:num_requests_running"]
	waiting := fams["vllm:num_requests_waiting"]
	kv := first(fams, "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
	if running == nil && waiting == nil && kv == nil {
		return fmt.Errorf("%w: no vllm:num_requests_running, vllm:num_requests_waiting or vllm:kv_cache_usage_perc", ErrNoMetrics)
	}
	var engines []string
	var c sampleChecker
	m.Running = sum(c.collect(running, count, "engine", false, &engines))
	m.Waiting = sum(c.collect(waiting, count, "engine", false, &engines))
	kvs := c.collect(kv, fraction, "engine", false, &engines)

	// Prefix counters: current names, else the <= 0.9 names (a pair is
	// never mixed across generations; their units differ in 0.8).
	q, h := "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
	if fams[q] == nil && fams[h] == nil {
		q, h = "vllm:gpu_prefix_cache_queries_total", "vllm:gpu_prefix_cache_hits_total"
	}
	m.PrefixQueries = sum(c.collect(fams[q], count, "engine", false, nil))
	m.PrefixHits = sum(c.collect(fams[h], count, "engine", false, nil))
	m.ExternalPrefixQueries = sum(c.collect(fams["vllm:external_prefix_cache_queries_total"], count, "engine", false, nil))
	m.ExternalPrefixHits = sum(c.collect(fams["vllm:external_prefix_cache_hits_total"], count, "engine", false, nil))

	var cfgs []engineConfig
	if f := fams["vllm:cache_config_info"]; f != nil {
		for _, s := range f.Metric {
			key, _ := label(s, "engine")
			if v, ok := value(s); ok && (!c.check(f, s, v, info) || v == 0) {
				continue // an info gauge set to 0 is not in effect
			}
			dup := false
			for _, c := range cfgs {
				dup = dup || c.key == key
			}
			if dup {
				continue
			}
			cfgs = append(cfgs, engineConfig{key: key, blockSize: intLabel(s, "block_size"),
				numBlocks: intLabel(s, "num_gpu_blocks"), tokensSize: intLabel(s, "kv_cache_size_tokens")})
		}
	}
	for _, c := range cfgs {
		if m.BlockSize == 0 {
			m.BlockSize = c.blockSize
		}
		m.NumGPUBlocks += c.numBlocks
		m.KVCacheSizeTokens += c.tokensSize
	}
	weightBy := func(pick func(engineConfig) int) func(string) float64 {
		return func(k string) float64 {
			for _, c := range cfgs {
				if c.key == k {
					return float64(pick(c))
				}
			}
			return 0
		}
	}
	weight := weightBy(func(c engineConfig) int { return c.numBlocks })
	if !allWeighted(kvs, weight) {
		weight = weightBy(func(c engineConfig) int { return c.tokensSize })
	}
	kvu, ok := usage(kvs, weight)
	m.KVUsage, m.HasKVUsage = kvu, ok
	m.Engines = len(engines)
	return c.err
}

// allWeighted reports whether every key with data has a positive weight.
func allWeighted(pks []perKey, weight func(string) float64) bool {
	for _, pk := range pks {
		if pk.n > 0 && weight(pk.key) <= 0 {
			return false
		}
	}
	return true
}

// fromSGLang fills m from SGLang families (requires --enable-metrics).
//
// Newer SGLang labels samples with dp_rank, tp_rank and pp_rank. Every TP
// (and PP) rank of one DP rank reports the same scheduler state, so per
// dp_rank only the samples of the lowest (tp_rank, pp_rank) present are
// counted, normally tp_rank="0"; absent rank labels count as 0. Across DP
// ranks running/queued requests and the token counters are summed and
// token_usage is averaged weighted by sglang:max_total_num_tokens when every
// rank's is known (else unweighted). sglang:prompt_tokens_total and
// sglang:cached_tokens_total become PrefixQueries and PrefixHits (radix and
// HiCache hits share that pair). Engines counts distinct dp_rank values.
// SGLang exposes no block size or block count (it is token-granular);
// BlockSize and NumGPUBlocks stay 0.
func fromSGLang(fams map[string]*dto.MetricFamily, m *load.Metrics) error {
	running := fams["sglang:num_running_reqs"]
	queued := fams["sglang:num_queue_reqs"]
	usageFam := fams["sglang:token_usage"]
	if running == nil && queued == nil && usageFam == nil {
		return fmt.Errorf("%w: no sglang:num_running_reqs, sglang:num_queue_reqs or sglang:token_usage", ErrNoMetrics)
	}
	var ranks []string
	var c sampleChecker
	m.Running = sum(c.collect(running, count, "dp_rank", true, &ranks))
	m.Waiting = sum(c.collect(queued, count, "dp_rank", true, &ranks))
	us := c.collect(usageFam, fraction, "dp_rank", true, &ranks)
	caps := c.collect(fams["sglang:max_total_num_tokens"], count, "dp_rank", true, nil)
	weight := func(k string) float64 {
		for _, c := range caps {
			if c.key == k && c.n > 0 {
				return c.sum / float64(c.n)
			}
		}
		return 0
	}
	m.KVUsage, m.HasKVUsage = usage(us, weight)
	for _, c := range caps {
		if c.n > 0 {
			m.KVCacheSizeTokens += int(c.sum / float64(c.n))
		}
	}
	m.PrefixQueries = sum(c.collect(fams["sglang:prompt_tokens_total"], count, "dp_rank", true, nil))
	m.PrefixHits = sum(c.collect(fams["sglang:cached_tokens_total"], count, "dp_rank", true, nil))
	m.Engines = len(ranks)
	return c.err
}
