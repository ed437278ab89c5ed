package kvcrouter

// The configuration as users write it: verl's `router:` block
// (actor_rollout_ref.rollout.router: {type, config}), and the Python
// balancer's constructor arguments around it. Parse recognises it by its
// `router_config` key and translates it here into Config, reporting every
// error at the key the user wrote. The Python package passes what the user
// gave through unchanged, so this file is the one place that knows the
// shape.

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"

	json "github.com/goccy/go-json"

	"github.com/kvc-router/kvc-router/core/internal/collector"
	"github.com/kvc-router/kvc-router/core/internal/router"
	"github.com/kvc-router/kvc-router/core/internal/strategy"
	"github.com/kvc-router/kvc-router/core/internal/strictjson"
)

// Balancer is the document the Python balancer (KVCAwareBalancer) passes
// to kvr_router_new and kvr_validate_config: its constructor arguments
// that configure routing. Error keys are relative to router_config (what
// the user wrote), except for this document's own keys.
type Balancer struct {
	// RouterConfig is the user's configuration in any shape Block
	// describes.
	RouterConfig json.RawMessage `json:"router_config"`
	// MaxCacheSize is verl's max_cache_size: the sticky LRU's size when
	// the configuration leaves sticky_max_size unset.
	MaxCacheSize *int `json:"max_cache_size"`
	// SyncBalancer says the caller cannot hold acquire calls (the
	// synchronous KVCAwareBalancer); admission.enabled: true is then an
	// error and its default, auto, means off.
	SyncBalancer bool `json:"sync_balancer"`
	// AsyncBalancer says the caller can hold acquire calls (the async
	// KVCAwareAdmissionBalancer, which verl's hook creates for kvc_aware);
	// admission.enabled's default, auto, then means on. A caller that says
	// neither gets auto as off: admission changes plain acquires too (a
	// full server is passed over), so it is on only where it was asked for.
	AsyncBalancer bool `json:"async_balancer"`
}

// AdmissionAuto is router.config.admission.enabled's default in the
// balancer's document: on where the balancer can hold acquire calls
// (Balancer.AsyncBalancer), off elsewhere (AdmissionDefault).
const AdmissionAuto = "auto"

// AdmissionDefault is what admission.enabled: auto means: on in kvc_aware
// mode where the balancer can hold acquire calls, unless the rollout is
// said to be multi-turn (turns: multi, which verl's hook sets for agent
// loops). There a held turn waits for a slot while its session's server
// holds its KV; on kvbench's agent_scale admission raised TTFT p99 above
// verl's balancer's (tuning seeds 101-102, where the step moved a point
// either way, and the held-out seeds, where it was longer by 1.5%), and on
// the RL agent setting the fleet never filled.
func AdmissionDefault(mode, turns string, canHold bool) bool {
	return canHold && mode == router.ModeKVCAware && turns != router.TurnsMulti
}

// Block is verl's router block, actor_rollout_ref.rollout.router.
// router_config may be this block; {"router": <block>}; a whole verl
// configuration (actor_rollout_ref.rollout.router is taken from it); a
// router type alone ("kvc_aware"); null (the default router); or the
// `config` mapping alone (which means type kvc_aware). A verl
// router_config_path YAML's `router_class` key is ignored.
type Block struct {
	// Type is the router: "default" routes exactly as verl's
	// GlobalRequestLoadBalancer; "kvc_aware" routes on prefix-cache hits
	// and load. When to change: set kvc_aware to get cache-aware routing.
	Type string `json:"type"`
	// Config holds the router's settings; unset (or null) takes the
	// type's packaged defaults (kvc_router/configs/<type>.yaml). When to
	// change: see its keys.
	Config BlockConfig `json:"config"`
}

// BlockConfig is router.config. Besides the keys below it takes every key
// of the library's `router` section but `mode` and `strategies` (block_size,
// sticky_max_size, index, load, admission, ...), its top-level max_procs,
// log_level and push, and the keys of Integration but `collector`.
type BlockConfig struct {
	// Strategies are combined by weight. A block without config takes the
	// type's own (least_inflight, or kvc_aware with the vllm_metrics
	// collector); a config that leaves strategies unset scores with the
	// type's strategy and runs no collector, so collector settings such as
	// urls configure nothing until a strategy names vllm_metrics.
	// When to change: to tune kvc_aware's parameters or add collectors.
	Strategies []BlockStrategy `json:"strategies"`
	// Collector configures the live sources of server state. When to
	// change: see its keys.
	Collector BlockCollector `json:"collector"`
}

// BlockStrategy is one entry of router.config.strategies: a strategy named
// by `_target_` or `name`, its weight, the collectors it asks for, and the
// strategy's own parameters at this level (see Strategies).
type BlockStrategy struct {
	// Target names the strategy by a configuration class name (verl's
	// Hydra style); it is looked up in an allow-list, never imported.
	// When to change: never needed when `name` is given.
	Target string `json:"_target_"`
	// Name of a registered strategy (kvc_aware, least_inflight). When to
	// change: to choose the strategy without a `_target_`.
	Name string `json:"name"`
	// Weight of the strategy's score in the weighted sum, > 0 (default
	// 1). When to change: only when combining several strategies.
	Weight float64 `json:"weight"`
	// CollectorNames are collectors the strategy needs (vllm_metrics,
	// vllm_polling = vllm_metrics, sglang_metrics, vllm_zmq); they run in
	// kvc_aware mode only. When to change: add vllm_zmq when servers
	// publish KV events; [] to run none (pushed state only).
	CollectorNames []string `json:"collector_names"`
}

// BlockCollector is router.config.collector. Besides the keys below it
// takes every key of a library collector entry but `name` and `endpoints`
// (interval_ms, timeout_ms, urls, ...), given to every collector that runs,
// and the keys of Integration.Collector.
type BlockCollector struct {
	// Names are collectors to run besides those the strategies name
	// (kvc_aware mode only). When to change: to run a collector no
	// strategy asks for.
	Names []string `json:"names"`
	// Endpoints maps a server id to its KV-event publishers (vllm_zmq):
	// "host:port" (tcp:// is added), a tcp:// or ipc:// address, or
	// {endpoint, replay (or replay_endpoint), topic}; one or a list (one
	// per data-parallel rank). When to change: when servers publish KV
	// events and their handles cannot report where (kv_events: auto fills
	// it under verl).
	Endpoints map[string][]collector.Endpoint `json:"endpoints"`
	// UnhealthyAfter is router.load.unhealthy_after, when that is unset.
	// When to change: see router.load.unhealthy_after.
	UnhealthyAfter int `json:"unhealthy_after"`
}

// defaultWeight is a strategy entry's weight when it sets none.
const defaultWeight = 1.0

// Packaged defaults of router.config for a type given without one (the
// YAML files in python/kvc_router/configs write them out; a Python test
// compares them).
var packagedConfig = map[string]string{
	router.ModeDefault:  `{}`,
	router.ModeKVCAware: `{"strategies": [{"name": "kvc_aware", "collector_names": ["vllm_metrics"]}]}`,
}

// BlockConfigKeys are the keys router.config takes, by where they go: its own
// (strategies, collector), the library's router section, the library's
// top level, and Integration. Derived from the types, never listed.
func BlockConfigKeys() (own, routerKeys, top, integration []string) {
	own = jsonKeys(reflect.TypeOf(BlockConfig{}))
	routerKeys = without(jsonKeys(reflect.TypeOf(router.Config{})), "mode", "strategies")
	top = without(jsonKeys(reflect.TypeOf(Config{})), "router", "collectors", "integration")
	integration = without(jsonKeys(reflect.TypeOf(Integration{})), "collector")
	return own, routerKeys, top, integration
}

// CollectorKeys are the keys router.config.collector takes: its own, the
// library's collector entry's, and Integration.Collector's.
func CollectorKeys() (own, spec, integration []string) {
	own = jsonKeys(reflect.TypeOf(BlockCollector{}))
	spec = without(jsonKeys(reflect.TypeOf(collector.Spec{})), "name", "endpoints")
	integration = jsonKeys(reflect.TypeOf(HandleEndpoints{}))
	return own, spec, integration
}

func jsonKeys(t reflect.Type) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.IsExported() && name != "" && name != "-" {
			out = append(out, name)
		}
	}
	return out
}

func without(list []string, drop ...string) []string {
	return slices.DeleteFunc(slices.Clone(list), func(s string) bool { return slices.Contains(drop, s) })
}

// isBalancer says whether a document is the balancer's (has router_config).
func isBalancer(data []byte) bool {
	var m map[string]json.RawMessage
	if json.Unmarshal(data, &m) != nil {
		return false
	}
	_, ok := m["router_config"]
	return ok
}

// parseBalancer translates the balancer's document into Config.
func parseBalancer(data []byte) (Config, error) {
	var b Balancer
	if err := strictjson.Decode(data, &b); err != nil {
		return Config{}, fieldError("", err)
	}
	if b.MaxCacheSize != nil && *b.MaxCacheSize < 1 {
		return Config{}, &FieldError{Key: "max_cache_size", Reason: fmt.Sprintf("must be a positive integer, got %d", *b.MaxCacheSize)}
	}
	blockRaw, at, bare, err := locate(b.RouterConfig)
	if err != nil {
		return Config{}, err
	}
	mode, inner, innerAt := router.ModeKVCAware, blockRaw, at
	if !bare {
		if mode, inner, err = parseBlock(blockRaw, at); err != nil {
			return Config{}, err
		}
		innerAt = strictjson.Join(at, "config")
	}
	if b.SyncBalancer && b.AsyncBalancer {
		return Config{}, &FieldError{Key: "async_balancer", Reason: "a balancer is either synchronous (sync_balancer) or async (async_balancer), not both"}
	}
	t := translator{at: innerAt, typeKey: strictjson.Join(at, "type"), mode: mode, canHold: b.AsyncBalancer}
	c, err := t.translate(inner, b.MaxCacheSize)
	if err != nil {
		return c, err
	}
	if b.SyncBalancer && c.Router.Mode == router.ModeKVCAware && c.Router.Admission.Enabled {
		return c, &FieldError{Key: strictjson.Join(innerAt, "admission.enabled"), Reason: "router-side admission holds acquire " +
			"calls, which needs the async balancer: use kvc_router.KVCAwareAdmissionBalancer (in verl's router_config_path " +
			"YAML: router_class: kvc_router.KVCAwareAdmissionBalancer); kvc_router's verl integration (router.type " +
			"kvc_aware) picks it by itself"}
	}
	return c, nil
}

// kind names a JSON value's type as the messages do.
func kind(raw json.RawMessage) string {
	b := bytes.TrimSpace(raw)
	if len(b) == 0 {
		return "nothing"
	}
	switch b[0] {
	case '{':
		return "mapping"
	case '[':
		return "list"
	case '"':
		return "string"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

func object(raw json.RawMessage, key, what string) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if kind(raw) != "mapping" || json.Unmarshal(raw, &m) != nil {
		return nil, &FieldError{Key: key, Reason: fmt.Sprintf("must be %s, got %s", what, kind(raw))}
	}
	return m, nil
}

func sortedKeys(m map[string]json.RawMessage) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func unknownKey(at, k string, allowed []string) *FieldError {
	allowed = slices.Clone(allowed)
	sort.Strings(allowed)
	return &FieldError{Key: strictjson.Join(at, k), Reason: "unknown key (allowed keys here: " + quoted(allowed) + ")"}
}

// locate finds the router block in router_config: its raw value, its key
// path, and whether it is a bare `config` mapping.
func locate(raw json.RawMessage) (json.RawMessage, string, bool, error) {
	if isNull(raw) {
		return nil, "", false, nil
	}
	if kind(raw) == "string" {
		return raw, "", false, nil
	}
	m, err := object(raw, rootKey(""), "a mapping (the router block)")
	if err != nil {
		return nil, "", false, err
	}
	if arr, ok := m["actor_rollout_ref"]; ok {
		// A whole verl configuration: take its router block.
		const path = "actor_rollout_ref.rollout.router"
		node, at := arr, "actor_rollout_ref"
		for _, k := range []string{"rollout", "router"} {
			mm, err := object(node, at, "a mapping")
			if err != nil {
				return nil, "", false, err
			}
			if node = mm[k]; node == nil {
				return nil, "", false, &FieldError{Key: path, Reason: "missing: this is a whole verl configuration without a " +
					"router block; add actor_rollout_ref.rollout.router: {type: kvc_aware} (on the command line " +
					"+actor_rollout_ref.rollout.router.type=kvc_aware), or pass the router block alone"}
			}
			at = strictjson.Join(at, k)
		}
		return node, path, false, nil
	}
	if _, ok := m["router_class"]; ok { // a verl router_config_path YAML
		delete(m, "router_class")
		if len(m) == 0 {
			return json.RawMessage(`"kvc_aware"`), "", false, nil
		}
		raw, _ = json.Marshal(m)
	}
	if block, ok := m["router"]; ok {
		for _, k := range sortedKeys(m) {
			if k != "router" {
				return nil, "", false, unknownKey("", k, []string{"router"})
			}
		}
		return block, "router", false, nil
	}
	_, hasType := m["type"]
	_, hasConfig := m["config"]
	if hasType || (hasConfig && len(m) == 1) {
		return raw, "", false, nil
	}
	return raw, "", true, nil
}

// rootKey names the key path at for a message: router_config itself
// when at is its root.
func rootKey(at string) string {
	if at == "" {
		return "router_config"
	}
	return at
}

// parseBlock reads {type, config} at key path at: the mode and the raw
// config (the type's packaged one when unset).
func parseBlock(raw json.RawMessage, at string) (string, json.RawMessage, error) {
	mode := router.ModeDefault
	var inner json.RawMessage
	switch {
	case isNull(raw):
	case kind(raw) == "string":
		if err := json.Unmarshal(raw, &mode); err != nil {
			return "", nil, &FieldError{Key: strictjson.Join(at, "type"), Reason: err.Error()}
		}
	default:
		m, err := object(raw, rootKey(at), "a mapping")
		if err != nil {
			return "", nil, err
		}
		for _, k := range sortedKeys(m) {
			if k != "type" && k != "config" {
				return "", nil, unknownKey(at, k, []string{"config", "type"})
			}
		}
		if t := m["type"]; !isNull(t) {
			if kind(t) != "string" || json.Unmarshal(t, &mode) != nil {
				return "", nil, &FieldError{Key: strictjson.Join(at, "type"),
					Reason: fmt.Sprintf("must be a string (allowed: %s), got %s", quoted(modes()), kind(t))}
			}
		}
		inner = m["config"]
	}
	if !contains(modes(), mode) {
		return "", nil, &FieldError{Key: strictjson.Join(at, "type"), Reason: fmt.Sprintf("%q (allowed: %s)", mode, quoted(modes()))}
	}
	if isNull(inner) {
		inner = json.RawMessage(packagedConfig[mode])
	}
	return mode, inner, nil
}

func modes() []string { return []string{router.ModeDefault, router.ModeKVCAware} }

// translator builds Config from router.config at key path at.
type translator struct {
	at, typeKey, mode string
	// targetKey[i] is "name" or "_target_": the key strategy i was named by.
	targetKey []string
	// unhealthyAlias: router.load.unhealthy_after came from the collector.
	unhealthyAlias bool
	// canHold: the balancer can hold acquire calls, so admission.enabled's
	// default (auto) means on (Balancer.AsyncBalancer).
	canHold bool
}

// admission resolves router.config.admission.enabled, whose default in the
// balancer's document is "auto" (AdmissionAuto), into the library's
// boolean (AdmissionDefault). v is the user's admission mapping (nil when
// unset), turns router.config.turns; the result is the mapping to hand the
// library.
func (t *translator) admission(v json.RawMessage, turns string) (json.RawMessage, error) {
	m := map[string]json.RawMessage{}
	if v != nil {
		var err error
		if m, err = object(v, t.key("admission"), "a mapping"); err != nil {
			return nil, err
		}
	}
	on := AdmissionDefault(t.mode, turns, t.canHold)
	switch e, set := m["enabled"]; {
	case !set || isNull(e):
	case bytes.Equal(bytes.TrimSpace(e), []byte(`"`+AdmissionAuto+`"`)):
	case kind(e) == "boolean":
		return v, nil
	default:
		return nil, &FieldError{Key: t.key("admission.enabled"), Reason: fmt.Sprintf("must be true, false or %q, got %s", AdmissionAuto, strings.TrimSpace(string(e)))}
	}
	m["enabled"], _ = json.Marshal(on)
	return json.Marshal(m)
}

func (t *translator) key(k string) string { return strictjson.Join(t.at, k) }

func (t *translator) translate(doc json.RawMessage, maxCacheSize *int) (Config, error) {
	var c Config
	m, err := object(doc, rootKey(t.at), "a mapping")
	if err != nil {
		return c, err
	}
	own, routerKeys, topKeys, integKeys := BlockConfigKeys()
	rdoc := map[string]any{"mode": t.mode}
	top := map[string]json.RawMessage{}
	integ := map[string]any{}
	var names []string
	var col map[string]json.RawMessage
	var admRaw json.RawMessage
	for _, k := range sortedKeys(m) {
		v := m[k]
		if isNull(v) {
			continue // unset
		}
		switch {
		case k == "strategies":
			specs, wanted, err := t.strategies(v)
			if err != nil {
				return c, err
			}
			rdoc["strategies"] = specs
			names = append(names, wanted...)
		case k == "collector":
			if col, err = object(v, t.key(k), "a mapping"); err != nil {
				return c, err
			}
		case k == "admission":
			admRaw = v // resolved below, once turns is known
		case slices.Contains(routerKeys, k):
			rdoc[k] = v
		case slices.Contains(topKeys, k):
			top[k] = v
		case k == "kv_events" && bytes.Equal(bytes.TrimSpace(v), []byte("false")):
			integ[k] = KVEventsOff // YAML's `off` is false
		case k == "metrics" && bytes.Equal(bytes.TrimSpace(v), []byte("false")):
			integ[k] = map[string]any{"enabled": false}
		case slices.Contains(integKeys, k):
			integ[k] = v
		default:
			return c, unknownKey(t.at, k, slices.Concat(own, routerKeys, topKeys, integKeys))
		}
	}
	var turns string
	if raw, ok := rdoc["turns"].(json.RawMessage); ok {
		_ = json.Unmarshal(raw, &turns) // a bad value is the router's to report
	}
	if rdoc["admission"], err = t.admission(admRaw, turns); err != nil {
		return c, err
	}
	specs, err := t.collector(col, rdoc, integ, &names)
	if err != nil {
		return c, err
	}
	if _, set := rdoc["sticky_max_size"]; !set && maxCacheSize != nil {
		rdoc["sticky_max_size"] = *maxCacheSize
	}
	// The library document, section by section, so each error is named
	// at the user's key.
	var r raw
	topDoc, _ := json.Marshal(top)
	if err := strictjson.Decode(topDoc, &r); err != nil {
		return c, t.rebase(fieldError("", err))
	}
	c.MaxProcs, c.LogLevel, c.Push = r.MaxProcs, r.LogLevel, r.Push
	if err := c.validateTop(); err != nil {
		return c, t.rebase(err)
	}
	routerDoc, err := json.Marshal(rdoc)
	if err != nil {
		return c, &FieldError{Key: t.at, Reason: err.Error()}
	}
	if c.Router, err = router.ParseConfig(routerDoc); err == nil {
		_, err = c.Router.Effective()
	}
	if err != nil {
		return c, t.routerErr(fieldError("", err))
	}
	if len(specs) > 0 {
		doc, _ := json.Marshal(map[string]any{"collectors": specs})
		if c.Collectors, err = collector.ParseConfig(doc); err != nil {
			return c, t.collectorErr(fieldError("", err))
		}
	}
	integDoc, _ := json.Marshal(integ)
	if err := strictjson.Decode(integDoc, &c.Integration); err != nil {
		return c, t.rebase(fieldError("", err))
	}
	if err := c.Integration.validate(); err != nil {
		return c, t.rebase(err)
	}
	if err := c.Validate(); err != nil {
		return c, t.rebase(err)
	}
	return c, nil
}

// rebase roots a FieldError at router.config.
func (t *translator) rebase(err error) error {
	var fe *FieldError
	if errors.As(err, &fe) {
		return &FieldError{Key: t.key(fe.Key), Reason: fe.Reason}
	}
	return &FieldError{Key: t.at, Reason: err.Error()}
}

// routerErr names a router-section error at the user's key.
func (t *translator) routerErr(fe *FieldError) error {
	k := fe.Key
	switch {
	case k == "mode":
		return &FieldError{Key: t.typeKey, Reason: fe.Reason}
	case k == "load.unhealthy_after" && t.unhealthyAlias:
		k = "collector.unhealthy_after"
	case strings.HasPrefix(k, "strategies["):
		i, rest, _ := strings.Cut(k[len("strategies["):], "]")
		n, _ := strconv.Atoi(i)
		switch {
		case strings.HasPrefix(rest, ".params"):
			rest = rest[len(".params"):]
		case rest == ".name" && n < len(t.targetKey):
			rest = "." + t.targetKey[n]
		}
		k = "strategies[" + i + "]" + rest
	}
	return &FieldError{Key: t.key(k), Reason: fe.Reason}
}

// collectorErr names a collector-entry error ("collectors[k].x") at
// router.config.collector.x.
func (t *translator) collectorErr(fe *FieldError) error {
	k := fe.Key
	if strings.HasPrefix(k, "collectors[") {
		_, k, _ = strings.Cut(k, "]")
	}
	return &FieldError{Key: t.key("collector" + k), Reason: fe.Reason}
}

// strategies translates router.config.strategies into library specs and
// the collectors they ask for.
func (t *translator) strategies(raw json.RawMessage) ([]map[string]any, []string, error) {
	key := t.key("strategies")
	var list []json.RawMessage
	if kind(raw) != "list" || json.Unmarshal(raw, &list) != nil {
		return nil, nil, &FieldError{Key: key, Reason: "must be a list of strategies, got " + kind(raw)}
	}
	targets := strategy.Targets()
	allowed := make([]string, 0, len(targets))
	for k := range targets {
		allowed = append(allowed, k)
	}
	sort.Strings(allowed)
	var specs []map[string]any
	var wanted []string
	for i, item := range list {
		at := fmt.Sprintf("%s[%d]", key, i)
		m, err := object(item, at, "a mapping")
		if err != nil {
			return nil, nil, err
		}
		var name, target string
		if v, ok := m["_target_"]; ok {
			if json.Unmarshal(v, &target) != nil || targets[target] == "" {
				return nil, nil, &FieldError{Key: at + "._target_", Reason: fmt.Sprintf("%s is not an allowed strategy (allowed: %s)",
					strings.TrimSpace(string(v)), quoted(allowed))}
			}
			name = targets[target]
		}
		byName := false
		if v, ok := m["name"]; ok && !isNull(v) {
			var n string
			if json.Unmarshal(v, &n) != nil {
				return nil, nil, &FieldError{Key: at + ".name", Reason: "must be a string, got " + kind(v)}
			}
			if name != "" && n != name {
				return nil, nil, &FieldError{Key: at + ".name", Reason: fmt.Sprintf("%q contradicts _target_ (%q)", n, name)}
			}
			name, byName = n, true
		}
		if name == "" {
			return nil, nil, &FieldError{Key: at, Reason: fmt.Sprintf("a strategy needs '_target_' (allowed: %s) or 'name'", quoted(allowed))}
		}
		if byName {
			t.targetKey = append(t.targetKey, "name")
		} else {
			t.targetKey = append(t.targetKey, "_target_")
		}
		spec := map[string]any{"name": name, "weight": defaultWeight}
		if w := m["weight"]; !isNull(w) {
			spec["weight"] = w
		}
		params := map[string]json.RawMessage{}
		for _, k := range sortedKeys(m) {
			if k != "_target_" && k != "name" && k != "weight" && k != "collector_names" && !isNull(m[k]) {
				params[k] = m[k]
			}
		}
		if len(params) > 0 {
			spec["params"] = params
		}
		specs = append(specs, spec)
		names, err := collectorNames(m["collector_names"], at+".collector_names")
		if err != nil {
			return nil, nil, err
		}
		wanted = append(wanted, names...)
	}
	return specs, wanted, nil
}

// collectorNames reads a collector name or a list of them.
func collectorNames(raw json.RawMessage, key string) ([]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	if kind(raw) == "string" {
		raw = append(append(json.RawMessage{'['}, raw...), ']')
	}
	var list []json.RawMessage
	if kind(raw) != "list" || json.Unmarshal(raw, &list) != nil {
		return nil, &FieldError{Key: key, Reason: "must be a list of collector names, got " + kind(raw)}
	}
	out := make([]string, len(list))
	for i, v := range list {
		if json.Unmarshal(v, &out[i]) != nil || !contains(collector.Names(), out[i]) {
			return nil, &FieldError{Key: fmt.Sprintf("%s[%d]", key, i),
				Reason: fmt.Sprintf("%s (allowed: %s)", strings.TrimSpace(string(v)), quoted(collector.Names()))}
		}
	}
	return out, nil
}

// collector splits router.config.collector into the library's collector
// entries (one per collector to run), router.load.unhealthy_after and the
// integration keys.
func (t *translator) collector(m map[string]json.RawMessage, rdoc, integ map[string]any, names *[]string) ([]map[string]any, error) {
	own, specKeys, integKeys := CollectorKeys()
	shared := map[string]json.RawMessage{}
	integCol := map[string]json.RawMessage{}
	var endpoints map[string][]collector.Endpoint
	at := t.key("collector")
	for _, k := range sortedKeys(m) {
		v := m[k]
		if isNull(v) {
			continue
		}
		switch {
		case k == "names":
			n, err := collectorNames(v, strictjson.Join(at, k))
			if err != nil {
				return nil, err
			}
			*names = append(n, *names...)
		case k == "unhealthy_after":
			load, _ := rdoc["load"].(json.RawMessage)
			lm := map[string]json.RawMessage{}
			if load != nil && json.Unmarshal(load, &lm) != nil {
				continue // the router section reports the bad load
			}
			if _, set := lm["unhealthy_after"]; !set {
				lm["unhealthy_after"] = v
				rdoc["load"] = lm
				t.unhealthyAlias = true
			}
		case k == "endpoints":
			// Read below, once the topic is known.
		case slices.Contains(specKeys, k):
			shared[k] = v
		case slices.Contains(integKeys, k):
			integCol[k] = v
		default:
			return nil, unknownKey(at, k, slices.Concat(own, specKeys, integKeys))
		}
	}
	if len(integCol) > 0 {
		integ["collector"] = integCol
	}
	var topic string
	if v, ok := integCol["topic"]; ok && json.Unmarshal(v, &topic) != nil {
		return nil, &FieldError{Key: strictjson.Join(at, "topic"), Reason: "must be a string, got " + kind(v)}
	}
	if v := m["endpoints"]; !isNull(v) {
		var err error
		if endpoints, err = parseEndpoints(v, strictjson.Join(at, "endpoints"), topic); err != nil {
			return nil, err
		}
	}
	// Collector keys are checked even when no collector runs.
	if len(shared) > 0 {
		probe := map[string]any{"name": collector.NameVLLMMetrics}
		for k, v := range shared {
			probe[k] = v
		}
		doc, _ := json.Marshal(map[string]any{"collectors": []any{probe}})
		if _, err := collector.ParseConfig(doc); err != nil {
			return nil, t.collectorErr(fieldError("", err))
		}
	}
	if t.mode != router.ModeKVCAware {
		return nil, nil // the default mode reads no live state
	}
	var specs []map[string]any
	seen := map[string]bool{}
	for _, n := range *names {
		if n == collector.NameVLLMPolling {
			n = collector.NameVLLMMetrics
		}
		if seen[n] {
			continue
		}
		seen[n] = true
		spec := map[string]any{"name": n}
		for k, v := range shared {
			spec[k] = v
		}
		if n == collector.NameVLLMZMQ && len(endpoints) > 0 {
			spec["endpoints"] = endpoints
		}
		specs = append(specs, spec)
	}
	return specs, nil
}

// parseEndpoints reads collector.endpoints: server id -> one publisher or
// a list; a publisher is an address or {endpoint, replay|replay_endpoint,
// topic}. "host:port" becomes tcp://host:port.
func parseEndpoints(raw json.RawMessage, key, topic string) (map[string][]collector.Endpoint, error) {
	m, err := object(raw, key, "a mapping of server id -> endpoints")
	if err != nil {
		return nil, err
	}
	out := make(map[string][]collector.Endpoint, len(m))
	for _, sid := range sortedKeys(m) {
		v := m[sid]
		var list []json.RawMessage
		if kind(v) == "list" {
			_ = json.Unmarshal(v, &list)
		} else {
			list = []json.RawMessage{v}
		}
		eps := make([]collector.Endpoint, 0, len(list))
		for j, e := range list {
			at := fmt.Sprintf("%s[%s][%d]", key, strconv.Quote(sid), j)
			ep, err := parseEndpoint(e, at, topic)
			if err != nil {
				return nil, err
			}
			eps = append(eps, ep)
		}
		out[sid] = eps
	}
	return out, nil
}

func parseEndpoint(raw json.RawMessage, at, topic string) (collector.Endpoint, error) {
	ep := collector.Endpoint{Topic: topic}
	if kind(raw) == "string" {
		var s string
		_ = json.Unmarshal(raw, &s)
		addr, err := address(s, at)
		ep.Endpoint = addr
		return ep, err
	}
	m, err := object(raw, at, "an endpoint string or mapping")
	if err != nil {
		return ep, err
	}
	for _, k := range sortedKeys(m) {
		if !contains([]string{"endpoint", "replay", "replay_endpoint", "topic"}, k) {
			return ep, unknownKey(at, k, []string{"endpoint", "replay", "replay_endpoint", "topic"})
		}
	}
	str := func(k string) (string, error) {
		var s string
		if v := m[k]; !isNull(v) && json.Unmarshal(v, &s) != nil {
			return "", &FieldError{Key: strictjson.Join(at, k), Reason: "must be a string, got " + kind(v)}
		}
		return s, nil
	}
	if _, ok := m["endpoint"]; !ok {
		return ep, &FieldError{Key: strictjson.Join(at, "endpoint"), Reason: "missing"}
	}
	s, err := str("endpoint")
	if err == nil {
		ep.Endpoint, err = address(s, strictjson.Join(at, "endpoint"))
	}
	if err != nil {
		return ep, err
	}
	replayKey := "replay"
	if _, ok := m["replay"]; !ok {
		replayKey = "replay_endpoint"
	}
	if s, err = str(replayKey); err == nil && s != "" {
		ep.Replay, err = address(s, strictjson.Join(at, replayKey))
	}
	if err != nil {
		return ep, err
	}
	if _, ok := m["topic"]; ok && !isNull(m["topic"]) {
		ep.Topic, err = str("topic")
	}
	return ep, err
}

// address accepts tcp:// and ipc:// addresses and host:port (as tcp).
func address(s, at string) (string, error) {
	if s == "" {
		return "", &FieldError{Key: at, Reason: "must be a non-empty string"}
	}
	if !strings.Contains(s, "://") {
		s = "tcp://" + s
	}
	if !strings.HasPrefix(s, "tcp://") && !strings.HasPrefix(s, "ipc://") {
		return "", &FieldError{Key: at, Reason: fmt.Sprintf("%q (allowed schemes: tcp://, ipc://)", s)}
	}
	return s, nil
}
