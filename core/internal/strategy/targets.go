package strategy

import "maps"

// targets maps the `_target_` strings a configuration may name a strategy
// by (verl's Hydra-style config classes and kvc_router's own) to registered
// strategy names. It is an allow-list: a `_target_` is never imported, only
// looked up here. The Python package reads it from the library
// (kvr_config_schema), so this is its one definition.
var targets = map[string]string{
	// Upstream verl's llm_router config classes and their re-exports.
	"verl.workers.rollout.llm_router.config.strategy.KVCAwareStrategyConfig": "kvc_aware",
	"verl.workers.rollout.llm_router.config.KVCAwareStrategyConfig":          "kvc_aware",
	"verl.workers.rollout.llm_router.KVCAwareStrategyConfig":                 "kvc_aware",
	// The Python package's.
	"kvc_router.config.KVCAwareStrategyConfig":      "kvc_aware",
	"kvc_router.KVCAwareStrategyConfig":             "kvc_aware",
	"kvc_router.config.LeastInflightStrategyConfig": "least_inflight",
	"kvc_router.LeastInflightStrategyConfig":        "least_inflight",
}

// Targets returns the `_target_` allow-list: target string -> strategy name.
func Targets() map[string]string { return maps.Clone(targets) }
