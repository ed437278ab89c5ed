package kvcrouter

import (
	"errors"
	"strings"
	"testing"

	json "github.com/goccy/go-json"
)

// TestParseErrors: every error is a *FieldError whose key is the path from
// the document's root, for every section.
func TestParseErrors(t *testing.T) {
	cases := []struct {
		doc, key, reason string
	}{
		{`{"bogus": 1}`, "bogus", "unknown key"},
		{`[]`, "", "must be"},
		{`{"max_procs": -1}`, "max_procs", "must be in [0, 4096]"},
		{`{"max_procs": 5000}`, "max_procs", "must be in [0, 4096]"},
		{`{"log_level": "loud"}`, "log_level", `"loud" (allowed: debug, info, warn, error)`},
		{`{"push": {"max_event_bytes": -1}}`, "push.max_event_bytes", "must not be negative"},
		{`{"push": {"max_metrics_bytes": -1}}`, "push.max_metrics_bytes", "must not be negative"},
		{`{"router": {"mode": "fast"}}`, "router.mode", "allowed: default, kvc_aware"},
		{`{"router": {"turns": "many"}}`, "router.turns", `"many" (allowed: auto, single, multi)`},
		{`{"router": {"response_tokens": -1}}`, "router.response_tokens", "must be in [0, 16777216]"},
		{`{"router": {"response_tokens": 16777217}}`, "router.response_tokens", "must be in [0, 16777216]"},
		{`{"router": {"index": {"max_entries": -1}}}`, "router.index.max_entries", "must not be negative"},
		{`{"router": {"load": {"unhealthy_after": -2}}}`, "router.load.unhealthy_after", "must not be negative"},
		{`{"router": {"admission": {"engine_queue": -1}}}`, "router.admission.engine_queue", "must be in [0, 1048576]"},
		{`{"router": {"admission": {"engine_queue": 1.5}}}`, "router.admission.engine_queue", ""},
		{`{"router": {"mode": "kvc_aware", "strategies": [{"name": "kvc_aware", "weight": 1, "params": {"alpha": 2}}]}}`,
			"router.strategies[0].params.alpha", ""},
		{`{"router": {"strategies": [{"name": "nope", "weight": 1}]}}`, "router.strategies[0].name", "unknown strategy"},
		{`{"collectors": {"collectors": [{"name": "os.system"}]}}`, "collectors.collectors[0].name", `"os.system" (allowed: vllm_metrics`},
		{`{"collectors": {"collectors": [{"name": "vllm_metrics", "interval_ms": -1}]}}`, "collectors.collectors[0].interval_ms", "must not be negative"},
		{`{"collectors": {"collectors": [{"name": "vllm_metrics", "intervl_ms": 1}]}}`, "collectors.collectors[0].intervl_ms", "unknown key"},
		{`{"collectors": {"collectors": [{"name": "vllm_metrics", "urls": {"a": "ftp://a"}}]}}`, `collectors.collectors[0].urls["a"]`, "is not an http(s) URL"},
		{`{"collectors": {"collectors": [{"name": "vllm_zmq", "endpoints": {"a": [{"endpoint": "udp://x:1"}]}}]}}`,
			`collectors.collectors[0].endpoints["a"][0].endpoint`, "scheme must be tcp or ipc"},
	}
	for _, tc := range cases {
		t.Run(tc.doc, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc))
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v (%T) is not a *FieldError", err, err)
			}
			if !errors.Is(err, ErrConfig) {
				t.Fatal("error does not match ErrConfig")
			}
			if fe.Key != tc.key || !strings.Contains(fe.Reason, tc.reason) {
				t.Fatalf("got {%q, %q}, want key %q and reason containing %q", fe.Key, fe.Reason, tc.key, tc.reason)
			}
			if want := fe.Key + ": " + fe.Reason; fe.Key != "" && err.Error() != want {
				t.Fatalf("message %q, want %q", err.Error(), want)
			}
		})
	}
}

// TestDefaultsEverySection: the effective configuration of an empty
// document states a value for every default of every section.
func TestDefaultsEverySection(t *testing.T) {
	for _, mode := range []string{"default", "kvc_aware"} {
		c, err := Defaults(mode)
		if err != nil {
			t.Fatal(err)
		}
		var doc map[string]any
		b, _ := json.Marshal(c)
		_ = json.Unmarshal(b, &doc)
		for _, path := range []string{
			"router.mode", "router.sticky_max_size", "router.load_threshold", "router.sticky_overload", "router.block_size",
			"router.speculate", "router.max_prompt_tokens", "router.strategies",
			"router.index.max_entries", "router.index.spec_ttl_ms", "router.index.approx_ttl_ms",
			"router.load.stale_after_ms", "router.load.max_num_seqs", "router.load.unhealthy_after",
			"collectors.collectors", "max_procs", "log_level", "push.max_metrics_bytes", "push.max_event_bytes",
		} {
			if _, ok := lookup(doc, path); !ok {
				t.Errorf("%s: no %s in %s", mode, path, b)
			}
		}
		if c.LogLevel != "warn" || c.Push.MaxEventBytes != DefaultMaxEventBytes || c.Router.Index.MaxEntries != 4<<20 {
			t.Errorf("%s: %+v", mode, c)
		}
	}
}

// TestCollectorDefaults: each collector entry shows the settings its
// collector runs with; a set value is kept.
func TestCollectorDefaults(t *testing.T) {
	c, err := Parse([]byte(`{"collectors": {"collectors": [{"name": "vllm_metrics", "interval_ms": 250}, {"name": "vllm_zmq"}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	eff, err := c.Effective()
	if err != nil {
		t.Fatal(err)
	}
	m, z := eff.Collectors.Collectors[0], eff.Collectors.Collectors[1]
	if m.IntervalMS != 250 || m.TimeoutMS != 1000 || m.BackoffMaxMS != 5000 || m.MaxBytes <= 0 || m.ReplayTimeoutMS != 0 {
		t.Fatalf("metrics entry %+v", m)
	}
	if z.ReplayTimeoutMS != 2000 || z.IdleRedialMS != 3000 || z.RetryMS != 500 || z.MaxPayloadBytes <= 0 || z.IntervalMS != 0 {
		t.Fatalf("zmq entry %+v", z)
	}
}

// TestEffectiveFixedPoint: the effective configuration, parsed again,
// is its own effective configuration (nothing is lost or re-derived).
func TestEffectiveFixedPoint(t *testing.T) {
	for _, doc := range []string{
		`{}`,
		`{"router": {"mode": "kvc_aware", "sticky_overload": false, "index": {"max_entries": 1000}}}`,
		`{"router": {"mode": "kvc_aware"}, "collectors": {"collectors": [{"name": "sglang_metrics"}]}, "log_level": "debug"}`,
	} {
		c, err := Parse([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		eff, err := c.Effective()
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(eff)
		c2, err := Parse(b)
		if err != nil {
			t.Fatalf("%s: effective config rejected: %v\n%s", doc, err, b)
		}
		eff2, _ := c2.Effective()
		b2, _ := json.Marshal(eff2)
		if string(b) != string(b2) {
			t.Fatalf("%s: not a fixed point\n%s\n%s", doc, b, b2)
		}
	}
}

func lookup(doc map[string]any, path string) (any, bool) {
	var cur any = doc
	for _, k := range strings.Split(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[k]; !ok {
			return nil, false
		}
	}
	return cur, true
}

// TestSchema: the schema names every registered strategy and collector,
// and every allowed _target_ resolves to a registered strategy.
func TestSchema(t *testing.T) {
	s, err := ConfigSchema()
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Strategies) < 2 || string(s.Strategies["least_inflight"]) != "{}" {
		t.Fatalf("strategies %v", s.Strategies)
	}
	var kvc map[string]any
	if err := json.Unmarshal(s.Strategies["kvc_aware"], &kvc); err != nil || kvc["alpha"] != 0.3 {
		t.Fatalf("kvc_aware params %s", s.Strategies["kvc_aware"])
	}
	for target, name := range s.Targets {
		if _, ok := s.Strategies[name]; !ok {
			t.Errorf("target %s names unregistered strategy %s", target, name)
		}
	}
	if strings.Join(s.Collectors, ",") != "vllm_metrics,vllm_polling,sglang_metrics,vllm_zmq" {
		t.Fatalf("collectors %v", s.Collectors)
	}
}
