package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"

	"github.com/kvc-router/kvc-router/core/kvcrouter"
)

// scenario is what kvctl explain --dry-run reads: a configuration, the
// state of each server and one request. Nothing is routed: the scenario
// is replayed on a private router without collectors, and the request's
// decision is explained stage by stage as kvctl explain explains a
// recorded one.
type scenario struct {
	// Config is a library or balancer configuration (kvcrouter.Parse);
	// absent, kvc_aware at its defaults.
	Config json.RawMessage `json:"config"`
	// Servers is the pool, in the order servers were added (ties go to
	// the first).
	Servers []scenarioServer `json:"servers"`
	// Sessions binds request ids to servers, as earlier turns would have.
	Sessions map[string]string `json:"sessions"`
	// Request is the request to explain.
	Request scenarioRequest `json:"request"`
}

type scenarioServer struct {
	ID string `json:"id"`
	// Metrics is the server's /metrics text (optional).
	Metrics string `json:"metrics"`
	// Flavor is the metrics dialect: vllm (default) or sglang.
	Flavor string `json:"flavor"`
	// Cached are token prompts whose full blocks the server holds in GPU
	// KV cache (as if its KV events had said so).
	Cached [][]int32 `json:"cached"`
	// Inflight requests are counted on the server (no session bound).
	Inflight int `json:"inflight"`
}

type scenarioRequest struct {
	ID     string  `json:"id"`
	Tokens []int32 `json:"tokens"`
	Lora   string  `json:"lora"`
}

// dryRun builds the scenario's router and explains its request's decision.
func dryRun(data []byte) (*kvcrouter.Explain, error) {
	var sc scenario
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sc); err != nil {
		return nil, fmt.Errorf("scenario: %v", err)
	}
	cfgDoc := []byte(`{"router": {"mode": "kvc_aware"}}`)
	if len(sc.Config) > 0 && string(sc.Config) != "null" {
		cfgDoc = sc.Config
	}
	cfg, err := kvcrouter.Parse(cfgDoc)
	if err != nil {
		return nil, fmt.Errorf("scenario: config: %w", err)
	}
	if len(sc.Servers) == 0 {
		return nil, errors.New("scenario: servers: at least one server is needed")
	}
	r, err := kvcrouter.NewRouter(cfg.Router)
	if err != nil {
		return nil, fmt.Errorf("scenario: config: %w", err)
	}
	ids := make([]string, len(sc.Servers))
	pos := make(map[string]int, len(sc.Servers))
	for i, s := range sc.Servers {
		if j, dup := pos[s.ID]; dup {
			return nil, fmt.Errorf("scenario: servers[%d]: %q is also servers[%d]", i, s.ID, j)
		}
		ids[i], pos[s.ID] = s.ID, i
	}
	if err := r.AddServers(ids); err != nil {
		return nil, fmt.Errorf("scenario: servers: %w", err)
	}
	var engineHash uint64
	for i, s := range sc.Servers {
		at := fmt.Sprintf("scenario: servers[%d] (%s)", i, s.ID)
		bs := cfg.Router.BlockSize
		if s.Metrics != "" {
			flavor := kvcrouter.MetricsVLLM
			switch s.Flavor {
			case "", kvcrouter.MetricsVLLM.String():
			case kvcrouter.MetricsSGLang.String():
				flavor = kvcrouter.MetricsSGLang
			default:
				return nil, fmt.Errorf("%s: flavor %q (allowed: %s, %s)", at, s.Flavor, kvcrouter.MetricsVLLM, kvcrouter.MetricsSGLang)
			}
			m, err := kvcrouter.ParseMetrics(bytes.NewReader([]byte(s.Metrics)), flavor, kvcrouter.DefaultMetricsLimit)
			if err != nil {
				return nil, fmt.Errorf("%s: metrics: %w", at, err)
			}
			r.UpdateMetrics(s.ID, m)
			if m.BlockSize > 0 {
				bs = m.BlockSize
			}
		}
		w, _ := r.EventWriter(s.ID)
		for k, toks := range s.Cached {
			n := len(toks) / bs
			hashes := make([]uint64, n)
			for j := range hashes {
				engineHash++
				hashes[j] = engineHash
			}
			if err := w.Stored(kvcrouter.TierGPU, false, 0, hashes, toks[:n*bs], bs, ""); err != nil {
				return nil, fmt.Errorf("%s: cached[%d]: %w", at, k, err)
			}
		}
		for k := 0; k < s.Inflight; k++ {
			// A pinned probe: counted in flight there, bound nowhere.
			if _, err := r.Acquire(kvcrouter.Request{Probe: true, Pin: i}); err != nil {
				return nil, fmt.Errorf("%s: inflight: %w", at, err)
			}
		}
	}
	ids = ids[:0]
	for id := range sc.Sessions {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		server := sc.Sessions[id]
		i, ok := pos[server]
		if !ok {
			return nil, fmt.Errorf("scenario: sessions[%q]: %q is not a server of the scenario", id, server)
		}
		// A pin binds a new session to pool[i]; the turn is then over.
		if _, err := r.Acquire(kvcrouter.Request{ID: id, Pin: i}); err != nil {
			return nil, fmt.Errorf("scenario: sessions[%q]: %w", id, err)
		}
		r.Release(server)
	}
	seq := r.Status().Counters.Acquires
	req := sc.Request
	// The decision's own error (no server, prompt too long) is part of the
	// explanation, not a failure of the dry run.
	_, _ = r.Acquire(kvcrouter.Request{ID: req.ID, Tokens: req.Tokens, Lora: req.Lora, Pin: -1})
	e := r.Status().LastDecision
	if e == nil || e.Seq <= seq {
		return nil, errors.New("scenario: request: refused before the pipeline ran (is the prompt longer than max_prompt_tokens?)")
	}
	return e, nil
}

// explainDryRun prints a scenario's decision.
func explainDryRun(data []byte, stdout io.Writer) error {
	e, err := dryRun(data)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, "dry run: the scenario on a private router; nothing was routed")
	return printExplain(stdout, e)
}
