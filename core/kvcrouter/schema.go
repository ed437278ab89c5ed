package kvcrouter

import (
	"fmt"

	json "github.com/goccy/go-json"

	"github.com/kvc-router/kvc-router/core/internal/collector"
	"github.com/kvc-router/kvc-router/core/internal/router"
	"github.com/kvc-router/kvc-router/core/internal/strategy"
)

// Schema lists what a configuration may name: router modes, strategies
// with their parameters at their defaults, the `_target_` allow-list, and
// collectors. Bindings read it instead of keeping their own copies.
type Schema struct {
	RouterModes []string `json:"router_modes"`
	// Strategies maps each registered strategy to its parameters, at
	// their defaults.
	Strategies map[string]json.RawMessage `json:"strategies"`
	// Targets maps each allowed `_target_` string to a strategy name.
	Targets    map[string]string `json:"targets"`
	Collectors []string          `json:"collectors"`
	LogLevels  []string          `json:"log_levels"`
	// MetricsFlavors are the pushed metrics dialects; a flavour's index
	// is its code in kvr_update_metrics.
	MetricsFlavors []string `json:"metrics_flavors"`
	// KVEventsModes are the kv_events values.
	KVEventsModes []string `json:"kv_events_modes"`
}

// ConfigSchema builds the Schema from the registries.
func ConfigSchema() (Schema, error) {
	s := Schema{
		RouterModes: []string{router.ModeDefault, router.ModeKVCAware},
		Strategies:  map[string]json.RawMessage{},
		Targets:     strategy.Targets(),
		Collectors:  collector.Names(),
		LogLevels:   append([]string(nil), LogLevels...),

		MetricsFlavors: append([]string(nil), MetricsFlavors...),
		KVEventsModes:  append([]string(nil), KVEventsModes...),
	}
	for _, name := range strategy.Names() {
		st, err := strategy.Build(name, nil)
		if err != nil {
			return s, fmt.Errorf("strategy %s at its defaults: %w", name, err)
		}
		params, err := json.Marshal(st)
		if err != nil {
			return s, err
		}
		s.Strategies[name] = params
	}
	return s, nil
}
