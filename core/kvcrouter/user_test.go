package kvcrouter

import (
	"errors"
	"strings"
	"testing"

	json "github.com/goccy/go-json"
)

// effective parses a document and returns its effective form as JSON.
func effective(t *testing.T, doc string) map[string]any {
	t.Helper()
	c, err := Parse([]byte(doc))
	if err != nil {
		t.Fatalf("%s: %v", doc, err)
	}
	eff, err := c.Effective()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(eff)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return m
}

func same(t *testing.T, a, b map[string]any, what string) {
	t.Helper()
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if string(ja) != string(jb) {
		t.Fatalf("%s differ:\n%s\n%s", what, ja, jb)
	}
}

// TestBlockShapesMeanTheSame: every shape router_config may take is the
// same configuration as the library document it stands for.
func TestBlockShapesMeanTheSame(t *testing.T) {
	inner := `{"strategies": [{"_target_": "verl.workers.rollout.llm_router.config.strategy.KVCAwareStrategyConfig",
		"alpha": 0.7, "collector_names": ["vllm_polling"], "weight": 1.0}], "sticky_max_size": 500}`
	block := `{"type": "kvc_aware", "config": ` + inner + `}`
	want := effective(t, `{"router": {"mode": "kvc_aware", "sticky_max_size": 500,
		"strategies": [{"name": "kvc_aware", "weight": 1, "params": {"alpha": 0.7}}]},
		"collectors": {"collectors": [{"name": "vllm_metrics"}]}}`)
	for _, rc := range []string{
		block,
		`{"router": ` + block + `}`,
		inner, // the bare config means kvc_aware
		`{"actor_rollout_ref": {"rollout": {"name": "vllm", "router": ` + block + `}}, "trainer": {"n_gpus_per_node": 8}}`,
		`{"router_class": "kvc_router.KVCAwareBalancer", "router": ` + block + `}`,
	} {
		same(t, effective(t, `{"router_config": `+rc+`}`), want, rc)
	}
	// A type alone (or a router_config_path YAML naming only the class)
	// takes the packaged defaults; so does an unset config.
	def := effective(t, `{"router": {"mode": "kvc_aware"}, "collectors": {"collectors": [{"name": "vllm_metrics"}]}}`)
	for _, rc := range []string{`"kvc_aware"`, `{"type": "kvc_aware"}`, `{"router": {"type": "kvc_aware", "config": null}}`,
		`{"router_class": "kvc_router.KVCAwareBalancer"}`, `{"router": "kvc_aware"}`} {
		same(t, effective(t, `{"router_config": `+rc+`}`), def, rc)
	}
	for _, rc := range []string{`null`, `{"type": "default"}`, `{"config": {}}`, `{"router": {}}`} {
		same(t, effective(t, `{"router_config": `+rc+`}`), effective(t, `{}`), rc)
	}
	// An empty bare config is kvc_aware with no collector.
	same(t, effective(t, `{"router_config": {}}`), effective(t, `{"router": {"mode": "kvc_aware"}}`), "{}")
}

// TestBlockTranslation: every kind of key lands where the library reads
// it; null means unset; the balancer's max_cache_size fills an unset
// sticky_max_size only.
func TestBlockTranslation(t *testing.T) {
	got := effective(t, `{"max_cache_size": 7, "router_config": {"type": "kvc_aware", "config": {
		"strategies": [{"name": "kvc_aware", "alpha": 0.5, "kv_tokens": null, "collector_names": ["vllm_zmq", "vllm_metrics"]},
			{"_target_": "kvc_router.config.LeastInflightStrategyConfig", "weight": 0.5}],
		"block_size": 32, "model": "m", "speculate": false, "max_procs": 2, "index": {"max_entries": 1000},
		"load": {"max_num_seqs": 64}, "kv_events": false, "kv_events_base_port": 31000, "enable_server_metrics": true,
		"metrics": false, "metrics_flavor": "sglang",
		"collector": {"interval_ms": 250, "unhealthy_after": 5, "topic": "kv-event", "handle_timeout_ms": 100,
			"endpoints": {"a:1": ["a:5557", {"endpoint": "tcp://a:5558", "replay": "a:5559", "topic": "t"}], "b:2": "ipc:///x"}}}}}`)
	r := got["router"].(map[string]any)
	if r["sticky_max_size"] != 7.0 || r["block_size"] != 32.0 || r["model"] != "m" || r["speculate"] != false {
		t.Fatalf("router %v", r)
	}
	if r["load"].(map[string]any)["unhealthy_after"] != 5.0 || r["index"].(map[string]any)["max_entries"] != 1000.0 {
		t.Fatalf("router %v", r)
	}
	st := r["strategies"].([]any)
	if p := st[0].(map[string]any)["params"].(map[string]any); p["alpha"] != 0.5 || p["kv_tokens"] != 480000.0 {
		t.Fatalf("strategy params %v", p)
	}
	if s := st[1].(map[string]any); s["name"] != "least_inflight" || s["weight"] != 0.5 {
		t.Fatalf("strategy %v", s)
	}
	cs := got["collectors"].(map[string]any)["collectors"].([]any)
	zmq, met := cs[0].(map[string]any), cs[1].(map[string]any)
	if zmq["name"] != "vllm_zmq" || met["name"] != "vllm_metrics" || met["interval_ms"] != 250.0 || zmq["interval_ms"] != 250.0 {
		t.Fatalf("collectors %v", cs)
	}
	eps, _ := json.Marshal(zmq["endpoints"])
	const wantEps = `{"a:1":[{"endpoint":"tcp://a:5557","topic":"kv-event"},{"endpoint":"tcp://a:5558","replay":"tcp://a:5559","topic":"t"}],` +
		`"b:2":[{"endpoint":"ipc:///x","topic":"kv-event"}]}`
	if string(eps) != wantEps {
		t.Fatalf("endpoints %s", eps)
	}
	if got["max_procs"] != 2.0 {
		t.Fatalf("max_procs %v", got["max_procs"])
	}
	var wantIG map[string]any
	_ = json.Unmarshal([]byte(`{"kv_events":"off","kv_events_base_port":31000,"enable_server_metrics":true,"metrics_flavor":"sglang",
		"metrics":{"enabled":false,"period_s":5,"max_server_labels":64},
		"collector":{"topic":"kv-event","use_handle_endpoints":true,"handle_timeout_ms":100}}`), &wantIG)
	same(t, got["integration"].(map[string]any), wantIG, "integration")
	// A set sticky_max_size wins over max_cache_size; the default mode runs
	// no collector but checks the collector keys.
	r = effective(t, `{"max_cache_size": 7, "router_config": {"type": "default", "config": {"sticky_max_size": 9, "collector": {"interval_ms": 5}}}}`)["router"].(map[string]any)
	if r["sticky_max_size"] != 9.0 {
		t.Fatalf("sticky %v", r["sticky_max_size"])
	}
}

// TestBlockErrors: each error names the key as the user wrote it, says
// why, and lists what is allowed.
func TestBlockErrors(t *testing.T) {
	const S = `{"router": {"type": "kvc_aware", "config": {"strategies": [%s]}}}`
	strat := func(s string) string { return strings.Replace(S, "%s", s, 1) }
	cases := []struct{ rc, key, reason string }{
		{strat(`{"_target_": "os.system"}`), "router.config.strategies[0]._target_", `"os.system" is not an allowed strategy (allowed: 'kvc_router`},
		{strat(`{"name": "kvc_aware", "alpha": 1.5}`), "router.config.strategies[0].alpha", "in [0, 1]"},
		{strat(`{"_target_": "kvc_router.KVCAwareStrategyConfig", "alpha": "0.7"}`), "router.config.strategies[0].alpha", "must be a number"},
		{strat(`{"name": "kvc_aware", "weight": -1}`), "router.config.strategies[0].weight", "must be > 0"},
		{strat(`{"name": "kvc_aware", "collector_names": ["vllm_pollin"]}`), "router.config.strategies[0].collector_names[0]",
			"allowed: 'vllm_metrics', 'vllm_polling', 'sglang_metrics', 'vllm_zmq'"},
		{strat(`{"name": "kvc_aware", "colector_names": []}`), "router.config.strategies[0].colector_names", "unknown key"},
		{strat(`{"name": "least_inflight", "_target_": "kvc_router.config.KVCAwareStrategyConfig"}`), "router.config.strategies[0].name", "contradicts"},
		{strat(`{"alpha": 0.5}`), "router.config.strategies[0]", "needs '_target_'"},
		{strat(`{"name": "round_robin"}`), "router.config.strategies[0].name", "unknown strategy"},
		{strat(`{"_target_": "kvc_router.KVCAwareStrategyConfig", "layer_weights": {"nvme": 1}}`), "router.config.strategies[0].layer_weights.nvme", "allowed: gpu, cpu, ssd"},
		{`{"type": "default", "config": {"strategies": [{"name": "kvc_aware"}]}}`, "config.strategies[0].name", "needs mode kvc_aware"},
		{`{"type": "round_robin"}`, "type", `"round_robin" (allowed` + ": 'default', 'kvc_aware')"},
		{`{"router": {"type": 3}}`, "router.type", "must be a string"},
		{`{"router": {"type": "default", "extra": 1}}`, "router.extra", "unknown key (allowed keys here: 'config', 'type')"},
		{`{"router": [], "x": 1}`, "x", "unknown key"},
		{`{"router": []}`, "router", "must be a mapping, got list"},
		{`[]`, "router_config", "must be a mapping (the router block), got list"},
		{`{"type": "kvc_aware", "config": 3}`, "config", "must be a mapping, got number"},
		{`{"cache_size": 1}`, "cache_size", "unknown key (allowed keys here: 'admission', 'block_size'"},
		{`{"mode": "kvc_aware"}`, "mode", "unknown key"},
		{`{"sticky_max_size": -5}`, "sticky_max_size", "must be positive"},
		{`{"sticky_max_size": 10.5}`, "sticky_max_size", "must be an integer"},
		{`{"strategies": "kvc_aware"}`, "strategies", "must be a list of strategies, got string"},
		{`{"collector": {"interval_ms": -1}}`, "collector.interval_ms", "must not be negative"},
		{`{"collector": {"intervl_ms": 1}}`, "collector.intervl_ms", "unknown key"},
		{`{"collector": {"urls": {"a": "ftp://a"}}}`, `collector.urls["a"]`, "is not an http(s) URL"},
		{`{"collector": {"endpoints": {"s": "http://x:1"}}}`, `collector.endpoints["s"][0]`, "allowed schemes: tcp://, ipc://"},
		{`{"collector": {"endpoints": {"s": [{"endpoint": "x:0"}]}, "names": ["vllm_zmq"]}}`, `collector.endpoints["s"][0].endpoint`, "port must be in"},
		{`{"collector": {"endpoints": {"s": [{"replay": "x:1"}]}}}`, `collector.endpoints["s"][0].endpoint`, "missing"},
		{`{"collector": {"unhealthy_after": -1}}`, "collector.unhealthy_after", "must not be negative"},
		{`{"collector": {"handle_timeout_ms": 0.5}}`, "collector.handle_timeout_ms", "must be an integer"},
		{`{"collector": {"names": ["tgi"]}}`, "collector.names[0]", "allowed: 'vllm_metrics'"},
		{`{"max_prompt_tokens": -1}`, "max_prompt_tokens", "must be positive"},
		{`{"index": {"max_entries": -1}}`, "index.max_entries", "must not be negative"},
		{`{"log_level": "loud"}`, "log_level", "allowed: debug"},
		{`{"max_procs": 5000}`, "max_procs", "must be in [0, 4096]"},
		{`{"metrics_flavor": "tgi"}`, "metrics_flavor", `"tgi" (allowed: 'vllm', 'sglang')`},
		{`{"kv_events": "sometimes"}`, "kv_events", "allowed: 'off', 'auto'"},
		{`{"kv_events": true}`, "kv_events", "must be a string"},
		{`{"kv_events_base_port": 70000}`, "kv_events_base_port", "in [0, 65535]"},
		{`{"metrics": {"period_s": 0.001}}`, "metrics.period_s", "in [0.05, 3600]"},
		{`{"metrics": {"period_s": 0}}`, "metrics.period_s", "in [0.05, 3600]"},
		{`{"collector": {"handle_timeout_ms": 0}}`, "collector.handle_timeout_ms", "in [1, 3600000]"},
		{`{"metrics": {"max_server_labels": 0.5}}`, "metrics.max_server_labels", "must be an integer"},
		{`{"metrics": {"bogus": 1}}`, "metrics.bogus", "unknown key"},
		{`{"actor_rollout_ref": {"rollout": {"name": "vllm"}}, "data": {}}`, "actor_rollout_ref.rollout.router", "whole verl configuration"},
		{`{"actor_rollout_ref": {"rollout": {"router": {"type": "fast"}}}}`, "actor_rollout_ref.rollout.router.type", "allowed: 'default', 'kvc_aware'"},
		{`{"actor_rollout_ref": {"rollout": {"router": {"type": "kvc_aware", "config": {"alpha": 1}}}}}`,
			"actor_rollout_ref.rollout.router.config.alpha", "unknown key"},
	}
	for _, tc := range cases {
		t.Run(tc.rc, func(t *testing.T) {
			_, err := Parse([]byte(`{"router_config": ` + tc.rc + `}`))
			var fe *FieldError
			if !errors.As(err, &fe) || !errors.Is(err, ErrConfig) {
				t.Fatalf("error %v (%T) is not a config *FieldError", err, err)
			}
			if fe.Key != tc.key || !strings.Contains(fe.Reason, tc.reason) {
				t.Fatalf("got {%q, %q}, want key %q and reason containing %q", fe.Key, fe.Reason, tc.key, tc.reason)
			}
		})
	}
}

// TestBalancerDocument: the balancer's own keys.
func TestBalancerDocument(t *testing.T) {
	adm := `{"type": "kvc_aware", "config": {"admission": {"enabled": true}}}`
	for _, tc := range []struct{ doc, key, reason string }{
		{`{"router_config": null, "max_cache_size": 0}`, "max_cache_size", "must be a positive integer"},
		{`{"router_config": null, "max_cache_size": "10"}`, "max_cache_size", "must be an integer"},
		{`{"router_config": null, "servers": {}}`, "servers", "unknown key"},
		{`{"router_config": ` + adm + `, "sync_balancer": true}`, "config.admission.enabled", "kvc_router.KVCAwareAdmissionBalancer"},
	} {
		_, err := Parse([]byte(tc.doc))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Key != tc.key || !strings.Contains(fe.Reason, tc.reason) {
			t.Errorf("%s: got %v, want key %q and reason containing %q", tc.doc, err, tc.key, tc.reason)
		}
	}
	if _, err := Parse([]byte(`{"router_config": ` + adm + `}`)); err != nil {
		t.Fatalf("the async balancer may hold: %v", err)
	}
}

// TestAdmissionAuto: admission.enabled's default in the balancer's document
// is auto, on only in kvc_aware mode and only where the balancer says it
// can hold acquire calls; an explicit true or false wins everywhere it is
// allowed.
func TestAdmissionAuto(t *testing.T) {
	kvc := func(adm string) string {
		if adm == "" {
			return `{"type": "kvc_aware"}`
		}
		return `{"type": "kvc_aware", "config": {"admission": ` + adm + `}}`
	}
	for _, tc := range []struct {
		name, rc, host string
		want           bool
	}{
		{"unset, async", kvc(""), `"async_balancer": true`, true},
		{"unset, sync", kvc(""), `"sync_balancer": true`, false},
		{"unset, host silent", kvc(""), `"max_cache_size": 5`, false},
		{"auto, async", kvc(`{"enabled": "auto"}`), `"async_balancer": true`, true},
		{"auto, sync", kvc(`{"enabled": "auto"}`), `"sync_balancer": true`, false},
		{"null, async", kvc(`{"enabled": null, "max_inflight": 3}`), `"async_balancer": true`, true},
		{"other keys only, async", kvc(`{"max_inflight": 3}`), `"async_balancer": true`, true},
		{"false, async", kvc(`{"enabled": false}`), `"async_balancer": true`, false},
		{"true, host silent", kvc(`{"enabled": true}`), `"max_cache_size": 5`, true},
		{"default router, async", `{"type": "default"}`, `"async_balancer": true`, false},
		{"bare config mapping, async", `{"alpha_unused": null}`, `"async_balancer": true`, true},
		{"single-turn, async", `{"type": "kvc_aware", "config": {"turns": "single"}}`, `"async_balancer": true`, true},
		{"multi-turn, async", `{"type": "kvc_aware", "config": {"turns": "multi"}}`, `"async_balancer": true`, false},
		{"multi-turn, auto said, async", `{"type": "kvc_aware", "config": {"turns": "multi", "admission": {"enabled": "auto"}}}`, `"async_balancer": true`, false},
		{"multi-turn, true, async", `{"type": "kvc_aware", "config": {"turns": "multi", "admission": {"enabled": true}}}`, `"async_balancer": true`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte(`{"router_config": ` + tc.rc + `, ` + tc.host + `}`))
			if err != nil {
				t.Fatal(err)
			}
			if c.Router.Admission.Enabled != tc.want {
				t.Fatalf("admission.enabled = %v, want %v", c.Router.Admission.Enabled, tc.want)
			}
			if tc.want && c.Router.Admission.MaxQueue == 0 {
				t.Fatalf("admission defaults not filled: %+v", c.Router.Admission)
			}
		})
	}
	for _, tc := range []struct{ doc, key, reason string }{
		{`{"router_config": ` + kvc(`{"enabled": "on"}`) + `, "async_balancer": true}`, "config.admission.enabled", `must be true, false or "auto"`},
		{`{"router_config": ` + kvc(`{"enabled": 1}`) + `}`, "config.admission.enabled", `must be true, false or "auto"`},
		{`{"router_config": ` + kvc(`[1]`) + `}`, "config.admission", "must be a mapping"},
		{`{"router_config": null, "sync_balancer": true, "async_balancer": true}`, "async_balancer", "not both"},
	} {
		_, err := Parse([]byte(tc.doc))
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Key != tc.key || !strings.Contains(fe.Reason, tc.reason) {
			t.Errorf("%s: got %v, want key %q and reason containing %q", tc.doc, err, tc.key, tc.reason)
		}
	}
}

// TestBlockKeysCoverTheLibrary: router.config takes every key of the
// library's router section and top level (bar the sections it has its own
// form of), so nothing the library accepts is out of the user's reach.
func TestBlockKeysCoverTheLibrary(t *testing.T) {
	own, routerKeys, top, integ := BlockConfigKeys()
	all := strings.Join(append(append(append(own, routerKeys...), top...), integ...), ",")
	for _, k := range []string{"strategies", "collector", "sticky_max_size", "block_size", "admission", "session_moves", "turns",
		"response_tokens", "max_procs", "log_level", "push", "kv_events", "metrics"} {
		if !strings.Contains(","+all+",", ","+k+",") {
			t.Errorf("router.config does not take %s (%s)", k, all)
		}
	}
	for _, k := range []string{"mode", "router", "collectors", "integration"} {
		if strings.Contains(","+all+",", ","+k+",") {
			t.Errorf("router.config takes %s", k)
		}
	}
}
