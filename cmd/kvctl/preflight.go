package main

// kvctl preflight: before a job starts, is the router configuration valid
// (the library's own check, the same errors) and can the router reach what
// it names: each server's /metrics, each KV-event publisher and replay
// socket. Every probe is bounded by --timeout; every failure says what to do.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	json "github.com/goccy/go-json"
	"gopkg.in/yaml.v3"

	"github.com/kvc-router/kvc-router/core/kvcrouter"
)

const preflightSynopsis = `preflight [--config FILE|-] [--server ID]... [--timeout D]

Checks a router configuration as the library does (verl's router: block, a
whole verl YAML, the bare config mapping, or the library's JSON; YAML or
JSON) and probes what it names: each server's /metrics and each KV-event
publisher (and replay socket) in collector.urls / collector.endpoints, plus
every --server (HOST:PORT, the router's server id; under verl the servers are
known only once the job runs, so name them here). Prints what is OK and, for
what is not, what to do; exits 1 if anything failed.`

// maxConfigBytes bounds the configuration read.
const maxConfigBytes = 16 << 20

// serverList is the repeatable --server flag (comma-separated also works).
type serverList []string

func (s *serverList) String() string { return strings.Join(*s, ",") }

func (s *serverList) Set(v string) error {
	for _, id := range strings.Split(v, ",") {
		if id = strings.TrimSpace(id); id != "" {
			*s = append(*s, id)
		}
	}
	return nil
}

// probeResult is one line of the report.
type probeResult struct {
	what, target, detail, todo string
	ok                         bool
}

func preflight(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlags("preflight", preflightSynopsis, stderr)
	config := fs.String("config", "", "router configuration file (YAML or JSON; - for stdin); none = the default router")
	timeout := fs.Duration("timeout", 3*time.Second, "bound of each probe")
	var servers serverList
	fs.Var(&servers, "server", "a server id (HOST:PORT) to probe; repeatable")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 || *timeout <= 0 {
		fs.Usage()
		return errUsage
	}
	cfg, problems := preflightConfig(*config, stdin, stdout)
	if cfg == nil {
		return fmt.Errorf("%d problem(s)", problems)
	}
	results := probeAll(ctx, cfg, servers, *timeout)
	if len(results) == 0 {
		fmt.Fprintln(stdout, "servers: none to probe. Name each rollout server with --server HOST:PORT (under verl they "+
			"are known once the job runs), or list them in collector.urls / collector.endpoints.")
	}
	last := ""
	for _, r := range results {
		if r.target != last {
			fmt.Fprintf(stdout, "server %s\n", r.target)
			last = r.target
		}
		state := "OK  "
		if !r.ok {
			state = "FAIL"
			problems++
		}
		fmt.Fprintf(stdout, "  %-7s %s %s\n", r.what, state, r.detail)
		if r.todo != "" {
			fmt.Fprintf(stdout, "          what to do: %s\n", r.todo)
		}
	}
	if problems > 0 {
		return fmt.Errorf("%d problem(s)", problems)
	}
	fmt.Fprintln(stdout, "preflight: OK")
	return nil
}

// preflightConfig reads and checks the configuration, printing the verdict;
// nil (and 1 problem) when it is not valid.
func preflightConfig(path string, stdin io.Reader, stdout io.Writer) (*kvcrouter.Config, int) {
	var doc any
	if path != "" {
		data, err := readConfig(path, stdin)
		if err == nil {
			doc, err = yamlToJSON(data)
		}
		if err != nil {
			fmt.Fprintf(stdout, "config: FAIL %v\n", err)
			return nil, 1
		}
	}
	// The document the Python balancer hands the library: the user's
	// configuration, in whatever shape, under router_config.
	body, err := json.Marshal(map[string]any{"router_config": doc})
	if err != nil {
		fmt.Fprintf(stdout, "config: FAIL %v\n", err)
		return nil, 1
	}
	cfg, err := kvcrouter.Parse(body)
	if err != nil {
		fmt.Fprintf(stdout, "config: FAIL %v\n", err)
		var fe *kvcrouter.FieldError
		if errors.As(err, &fe) {
			fmt.Fprintln(stdout, "        what to do: fix that key (docs/configuration.md lists every key with its default)")
		}
		return nil, 1
	}
	var names []string
	for _, s := range cfg.Collectors.Collectors {
		names = append(names, s.Name)
	}
	col := "none"
	if len(names) > 0 {
		col = strings.Join(names, ", ")
	}
	src := "the default router (no --config)"
	if path != "" {
		src = path
	}
	fmt.Fprintf(stdout, "config: OK %s: mode %s, collectors: %s\n", src, cfg.Router.Mode, col)
	if cfg.Integration.KVEvents == kvcrouter.KVEventsAuto {
		fmt.Fprintln(stdout, "        kv_events: auto: the verl hook gives each replica its KV-event ports when the job "+
			"starts; those publishers cannot be probed before")
	}
	return &cfg, 0
}

func readConfig(path string, stdin io.Reader) ([]byte, error) {
	var r io.Reader = stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	data, err := io.ReadAll(io.LimitReader(r, maxConfigBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxConfigBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, maxConfigBytes)
	}
	return data, nil
}

// yamlToJSON decodes YAML (JSON is YAML) into JSON-ready values: mappings
// with string keys, finite numbers. An empty document is an empty mapping,
// as the Python package reads it.
func yamlToJSON(data []byte) (any, error) {
	var v any
	if err := yaml.Unmarshal(data, &v); err != nil {
		return nil, fmt.Errorf("not valid YAML or JSON: %v", err)
	}
	if v == nil {
		return map[string]any{}, nil
	}
	return plain(v, "router_config")
}

func plain(v any, at string) (any, error) {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			p, err := plain(e, at+"."+k)
			if err != nil {
				return nil, err
			}
			out[k] = p
		}
		return out, nil
	case map[any]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			ks, ok := k.(string)
			if !ok {
				return nil, fmt.Errorf("%s: key %v is not a string", at, k)
			}
			p, err := plain(e, at+"."+ks)
			if err != nil {
				return nil, err
			}
			out[ks] = p
		}
		return out, nil
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			p, err := plain(e, fmt.Sprintf("%s[%d]", at, i))
			if err != nil {
				return nil, err
			}
			out[i] = p
		}
		return out, nil
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil, fmt.Errorf("%s: must be a finite number, got %v", at, x)
		}
		return x, nil
	case time.Time:
		return x.Format(time.RFC3339Nano), nil
	default:
		return x, nil
	}
}

// probeAll probes every server the configuration or --server names.
func probeAll(ctx context.Context, cfg *kvcrouter.Config, extra []string, timeout time.Duration) []probeResult {
	var metricsSpec, zmqSpec *kvcrouter.CollectorSpec
	for i := range cfg.Collectors.Collectors {
		s := &cfg.Collectors.Collectors[i]
		switch s.Name {
		case "vllm_zmq":
			zmqSpec = s
		default:
			metricsSpec = s
		}
	}
	ids := slices.Clone(extra)
	if metricsSpec != nil {
		for id := range metricsSpec.URLs {
			ids = append(ids, id)
		}
	}
	if zmqSpec != nil {
		for id := range zmqSpec.Endpoints {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	ids = slices.Compact(ids)
	var out []probeResult
	for _, id := range ids {
		out = append(out, probeMetrics(ctx, id, metricsSpec, timeout))
		if zmqSpec == nil {
			continue
		}
		for _, ep := range zmqSpec.Endpoints[id] {
			out = append(out, probeEvents(ctx, id, ep, timeout))
			if ep.Replay != "" {
				out = append(out, probeReplay(ctx, id, ep.Replay, timeout))
			}
		}
	}
	return out
}

func probeMetrics(ctx context.Context, id string, spec *kvcrouter.CollectorSpec, timeout time.Duration) probeResult {
	target, flavor, limit := kvcrouter.MetricsURL(id), kvcrouter.MetricsVLLM, int64(kvcrouter.DefaultMetricsLimit)
	if spec != nil {
		if u := spec.URLs[id]; u != "" {
			target = u
		}
		if spec.Name == "sglang_metrics" {
			flavor = kvcrouter.MetricsSGLang
		}
		if spec.MaxBytes > 0 {
			limit = spec.MaxBytes
		}
	}
	r := probeResult{what: "metrics", target: id}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, target, nil)
	if err != nil {
		r.detail, r.todo = fmt.Sprintf("%s: %v", target, err), "set collector.urls["+id+"] to the server's metrics URL"
		return r
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.detail = fmt.Sprintf("%s: %v", target, reason(err, timeout))
		r.todo = "start the server, or point collector.urls[" + id + "] at its /metrics (default http://<server id>/metrics)"
		return r
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		r.detail = fmt.Sprintf("%s answered %s", target, resp.Status)
		r.todo = "is this the engine's HTTP port? set collector.urls[" + id + "] to its /metrics URL"
		return r
	}
	m, err := kvcrouter.ParseMetrics(resp.Body, flavor, limit)
	if err != nil {
		r.detail = fmt.Sprintf("%s: %v", target, err)
		r.todo = "an SGLang server needs the sglang_metrics collector, a vLLM server vllm_metrics; a larger response " +
			"needs collector.max_bytes"
		return r
	}
	kv := "no KV-cache usage gauge"
	if m.HasKVUsage {
		kv = fmt.Sprintf("KV-cache usage %.1f%%", m.KVUsage*100)
	}
	r.ok = true
	r.detail = fmt.Sprintf("%s: running %g, waiting %g, %s", target, m.Running, m.Waiting, kv)
	if !m.HasKVUsage {
		r.todo = "without it load counts requests only; vLLM reports it unless started with --disable-log-stats " +
			"(under verl: router.config.enable_server_metrics: true)"
	}
	return r
}

func probeEvents(ctx context.Context, id string, ep kvcrouter.EventEndpoint, timeout time.Duration) probeResult {
	r := probeResult{what: "events", target: id}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := kvcrouter.DialLiveEvents(ctx, ep.Endpoint, ep.Topic, 0, timeout)
	if err != nil {
		r.detail = fmt.Sprintf("%s: %v", ep.Endpoint, reason(err, timeout))
		if refused(err) {
			r.todo = "nothing listens there: start vLLM with KV events on (--kv-events-config '{\"enable_kv_cache_events\": " +
				"true, \"publisher\": \"zmq\", \"endpoint\": \"tcp://*:PORT\"}'; under verl router.config.kv_events: auto) " +
				"or fix collector.endpoints[" + id + "]"
		} else {
			r.todo = "something answers there but not as a ZMQ publisher: is it the KV-event port (not the HTTP port)?"
		}
		return r
	}
	c.Close()
	r.ok = true
	topic := ""
	if ep.Topic != "" {
		topic = fmt.Sprintf(" (topic %q)", ep.Topic)
	}
	r.detail = fmt.Sprintf("%s: ZMQ publisher answered%s", ep.Endpoint, topic)
	return r
}

// probeReplay only connects: a replay request would make the publisher send
// its history.
func probeReplay(ctx context.Context, id, endpoint string, timeout time.Duration) probeResult {
	r := probeResult{what: "replay", target: id}
	addr, ok := strings.CutPrefix(endpoint, "tcp://")
	if !ok {
		r.ok, r.detail = true, endpoint+": not a tcp:// endpoint, not probed"
		return r
	}
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		r.detail = fmt.Sprintf("%s: %v", endpoint, reason(err, timeout))
		r.todo = "set the publisher's replay_endpoint in --kv-events-config to it, or drop `replay` from " +
			"collector.endpoints[" + id + "] (gaps are then rebuilt by a resync, not replayed)"
		return r
	}
	c.Close()
	r.ok, r.detail = true, endpoint+": reachable"
	return r
}

func refused(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }

// reason words an error, naming the bound when it was the timeout.
func reason(err error, timeout time.Duration) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // the URL is printed beside it
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return fmt.Sprintf("no answer within %v", timeout)
	}
	return err.Error()
}
