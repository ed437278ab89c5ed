// Command kvbench replays a workload (a Mooncake trace, a GRPO rollout or a
// multi-turn agent rollout) against N simulated vLLM engines on a virtual
// clock and compares routing policies side by side: prefix-cache hit rate,
// TTFT, end-to-end latency, throughput, rollout-step makespan, load
// imbalance and router decision time, against the infinite-cache oracle,
// a pooled-LRU reference and the prefill-free makespan.
//
//	kvbench --workload mooncake|grpo|agent|agent_long [--trace FILE] --engines N \
//	        --policies a,b,c [--seed S] [--json FILE] [--csv FILE] [--plot FILE.png]
//	kvbench --heldout --workload W ...     tune on some seeds, report others
//	kvbench --sweep-spread 0,0.1,0.5 ...   policies under arrival spread
//
// Every policy runs through the same router interface (core/internal/router) with
// KV events carried by the live code path (kvevents.Encode +
// collector.ApplyPayload) and metrics pushed every --scrape-interval.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	json "github.com/goccy/go-json"
	"github.com/kvc-router/kvc-router/core/kvcrouter"

	"github.com/kvc-router/kvc-router/testbed/bench"
	"github.com/kvc-router/kvc-router/testbed/sim"
)

// shape is the RL shape the flags ask for.
func (c *config) shape() bench.Shape {
	return bench.Shape{LengthCorr: c.lengthCorr, Truncate: c.truncate, DatasetPrompts: c.datasetPrompts, EpochCorr: c.epochCorr}
}

// pareto parses --tool-pareto.
func (c *config) pareto() (*bench.BoundedPareto, error) {
	v, err := parseFloats(c.toolPareto)
	if err != nil || len(v) != 3 || v[0] <= 0 || v[1] <= v[0] || v[2] <= 0 {
		return nil, fmt.Errorf("--tool-pareto wants MIN,MAX,ALPHA with 0 < MIN < MAX and ALPHA > 0, got %q", c.toolPareto)
	}
	return &bench.BoundedPareto{Min: v[0], Max: v[1], Alpha: v[2]}, nil
}

// summarise is bench.Summarise with --report-from-step applied.
func (c *config) summarise(res *bench.Result) bench.Summary {
	s := bench.Summarise(res, 0)
	if c.fromStep > 0 {
		s.Makespan = sumFrom(s.MakespanSteps, c.fromStep)
	}
	return s
}

func sumFrom(xs []float64, from int) float64 {
	t := 0.0
	for i := from; i < len(xs); i++ {
		t += xs[i]
	}
	return t
}

type config struct {
	workload, trace, policies, jsonOut, csvOut, plotOut, kvcParams string
	engines, gpuBlocks, cpuBlocks, blockSize, maxSeqs, maxBatched  int
	seed                                                           uint64
	oracleLPT                                                      bool
	scrape, eventDelay, rateScale, jitter                          float64
	limit, parallel                                                int
	steps, grpoPrompts, grpoN, agentTasks, agentGroup              int
	promptMedian, responseMedian                                   float64
	// promptSigma, responseSigma, responseMax and systemTokens reshape a
	// GRPO workload's lengths (0, or -1 for systemTokens: its default).
	promptSigma, responseSigma                         float64
	responseMax, systemTokens                          int
	sweepAlpha, sweepThreshold, sweepSeeds, sweepTiers string
	spread                                             float64
	params                                             paramFlag
	makespanBound                                      bool
	sweepSpread, tuneSeeds, reportSeeds                string
	// tuneObjective is what held-out tuning minimises: "mixed" (makespan
	// and TTFT p99 ratios, equally) or "step" (makespan ratio alone).
	tuneObjective string
	heldout       bool
	quiet         bool
	// kvcFrozen is the frozen kvc_aware configuration file (docs/frozen-kvc-aware.json);
	// frozenCommit the commit it records.
	kvcFrozen, frozenCommit string
	// kvcAdmit: the freeze runs kvc_aware with router-side admission (verl's
	// hook does at its defaults since admission.enabled became auto);
	// without a freeze, kvc_aware is the routing alone.
	kvcAdmit bool
	// kvcMoveTokens is the freeze's router session_move_tokens (nil without
	// a freeze: today's default).
	kvcMoveTokens *float64
	// kvcTurns is kvc_aware's router "turns"; "" = what verl's hook sets
	// for the workload (bench.TurnsFor).
	kvcTurns string
	// kvcAdmission overlays kvc_aware's admission settings (JSON object of
	// kvcrouter.AdmissionSpec fields) on every +admit row; admissionEdit
	// applies it (nil without the flag).
	kvcAdmission  string
	admissionEdit func(*kvcrouter.RouterConfig)
	// The RL workload shape (issue 26): shaped is set when any of its
	// flags is given; nil-shape workloads keep independent draws.
	shaped                                  bool
	lengthCorr, truncate, epochCorr         float64
	datasetPrompts, fromStep, clientWorkers int
	arrivals, engineModel, toolPareto       string
	clientRate                              float64
}

// paramFlag collects repeated --params NAME=JSON.
type paramFlag map[string]json.RawMessage

func (p paramFlag) String() string { return fmt.Sprint(map[string]json.RawMessage(p)) }

func (p paramFlag) Set(v string) error {
	name, raw, ok := strings.Cut(v, "=")
	if !ok || name == "" || !json.Valid([]byte(raw)) {
		return fmt.Errorf("want NAME=JSON-object, got %q", v)
	}
	p[bench.BaseName(name)] = json.RawMessage(raw)
	return nil
}

// Workload defaults. Mooncake: the public conversation trace at 4× speed
// (13.6 req/s over 8 engines: near saturation for the engine model; at 5×
// queues grow without bound for every policy); grpo and agent: see
// bench.DefaultGRPO / DefaultAgent.
const (
	defaultRateScale = 4
	// defaultGPUBlocks: an 8B model on one 80 GB GPU keeps ≈ 480k tokens of
	// KV (128 KiB/token in ≈ 60 GB), i.e. 30,000 blocks of 16 tokens.
	defaultGPUBlocks = 30000
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	c := &config{params: paramFlag{}}
	fs := flag.NewFlagSet("kvbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.workload, "workload", "mooncake", "mooncake | grpo | grpo_sat | agent | agent_scale | agent_long | agent_long_few")
	fs.StringVar(&c.trace, "trace", defaultTraceFlag, "Mooncake jsonl trace; a relative path is resolved against the repository root (the default is the full public trace beside the repository; "+sliceTrace+" is a 1,000-row slice shipped with the repository)")
	fs.StringVar(&c.policies, "policies", strings.Join(bench.DefaultPolicies, ","), "comma-separated policies: "+strings.Join(bench.PolicyNames, ", "))
	fs.IntVar(&c.engines, "engines", 8, "number of simulated engines")
	fs.Uint64Var(&c.seed, "seed", 1, "workload, jitter and random-policy seed")
	fs.StringVar(&c.jsonOut, "json", "", "write the JSON report to FILE")
	fs.StringVar(&c.csvOut, "csv", "", "write a CSV row per policy to FILE")
	fs.StringVar(&c.plotOut, "plot", "", "write a PNG (hit rate, TTFT CDF, makespan) to FILE")
	fs.IntVar(&c.gpuBlocks, "gpu-blocks", defaultGPUBlocks, "GPU KV blocks per engine (30000 x 16 tokens ~ an 8B model on an 80 GB GPU)")
	fs.IntVar(&c.cpuBlocks, "cpu-blocks", 0, "CPU offload tier blocks per engine (0 = off)")
	fs.IntVar(&c.blockSize, "block-size", 16, "engine KV block size in tokens")
	fs.IntVar(&c.maxSeqs, "max-num-seqs", 256, "engine running-set cap")
	fs.IntVar(&c.maxBatched, "max-batched-tokens", 8192, "engine per-step token budget")
	fs.Float64Var(&c.scrape, "scrape-interval", 0.1, "metrics push period, virtual seconds")
	fs.Float64Var(&c.eventDelay, "event-delay", 0, "KV-event delivery delay, virtual seconds")
	fs.Float64Var(&c.rateScale, "rate-scale", defaultRateScale, "mooncake: arrival speed-up factor")
	fs.Float64Var(&c.jitter, "jitter", 3, "mooncake: spread arrivals uniformly inside timestamp bins of this many seconds (0 = off)")
	fs.IntVar(&c.limit, "limit", 0, "mooncake: replay only the first N requests (0 = all)")
	fs.IntVar(&c.steps, "steps", 0, "grpo/agent: rollout steps (default 3)")
	fs.IntVar(&c.grpoPrompts, "grpo-prompts", 0, "grpo: prompts per step B (default 64)")
	fs.IntVar(&c.grpoN, "grpo-n", 0, "grpo: samples per prompt n (default 16)")
	fs.IntVar(&c.agentTasks, "agent-tasks", 0, "agent: tasks per step (default 32)")
	fs.IntVar(&c.agentGroup, "agent-group", 0, "agent: trajectories per task (default 4)")
	fs.Float64Var(&c.promptMedian, "prompt-median", 0, "grpo/agent: median prompt (task) length in tokens")
	fs.Float64Var(&c.responseMedian, "response-median", 0, "grpo/agent: median response length in tokens")
	fs.Float64Var(&c.promptSigma, "prompt-sigma", 0, "grpo: log-normal sigma of prompt lengths (0 = the workload's)")
	fs.Float64Var(&c.responseSigma, "response-sigma", 0, "grpo: log-normal sigma of response lengths (0 = the workload's)")
	fs.IntVar(&c.responseMax, "response-max", 0, "grpo: longest response in tokens, the rollout's response_length, which verl's hook tells kvc_aware as response_tokens (0 = the workload's)")
	fs.IntVar(&c.systemTokens, "system-tokens", -1, "grpo: tokens of the system prompt every prompt shares (-1 = the workload's)")
	fs.StringVar(&c.kvcParams, "kvc-params", "", `kvc_aware strategy parameters as JSON, e.g. {"alpha":0.5,"load_threshold":0.9} (same as --params kvc_aware=JSON)`)
	fs.StringVar(&c.kvcTurns, "kvc-turns", "", "kvc_aware's router turns: auto | single | multi (default: what verl's hook sets for the workload: multi for agent workloads, single for grpo, auto otherwise; multi on grpo reproduces the 41412f1 tables)")
	fs.StringVar(&c.kvcFrozen, "kvc-frozen", "", "kvc_aware runs the frozen configuration in FILE (docs/frozen-kvc-aware.json; its \"strategy\" object) and is not tuned")
	fs.StringVar(&c.kvcAdmission, "kvc-admission", "", `kvc_aware's admission settings over the defaults for the +admit rows, as JSON, e.g. {"engine_queue":1} or {"headroom":0.75}`)
	fs.Var(c.params, "params", `NAME=JSON: override a policy's main parameters (repeatable), e.g. sglang_cache_aware={"balance_abs_threshold":8}, llmd_precise={"prefix_weight":3}, dynamo_cost={"overlap_score_credit":2}`)
	fs.Float64Var(&c.spread, "arrival-spread", 0, "spread each phase's initial arrivals uniformly over this many virtual seconds (0 = a burst)")
	fs.BoolVar(&c.makespanBound, "makespan-bound", true, "also run verl_default with free prefill and report each policy's share of the makespan gain")
	fs.StringVar(&c.sweepSpread, "sweep-spread", "", "arrival-spread values (comma list): run --policies at each over --sweep-seeds")
	fs.BoolVar(&c.heldout, "heldout", false, "held-out evaluation: tune each tunable policy's main knob on --tune-seeds, report --report-seeds")
	fs.StringVar(&c.tuneSeeds, "tune-seeds", "101,102", "held-out: seeds used only for tuning")
	fs.StringVar(&c.reportSeeds, "report-seeds", "1,2,3,4,5", "held-out: seeds reported (never tuned on)")
	fs.StringVar(&c.tuneObjective, "tune-objective", "mixed", `held-out: what tuning minimises over the tuning seeds: "mixed" (mean of the step-time and TTFT p99 ratios to verl_default) or "step" (the step-time ratio alone: each peer at its best step time)`)
	fs.IntVar(&c.parallel, "parallel", 2, "policies run concurrently")
	fs.StringVar(&c.sweepAlpha, "sweep-alpha", "", "sensitivity: kvc_aware alpha values (comma list); runs the grid instead of --policies")
	fs.StringVar(&c.sweepThreshold, "sweep-threshold", "0.9", "sensitivity: load_threshold values")
	fs.StringVar(&c.sweepTiers, "sweep-tiers", "", "sensitivity: layer_weights variants as gpu/cpu pairs, e.g. 0.7/0.2,1/0.8")
	fs.StringVar(&c.sweepSeeds, "sweep-seeds", "1", "sensitivity: seeds")
	fs.BoolVar(&c.quiet, "quiet", false, "no progress bar")
	fs.BoolVar(&c.oracleLPT, "oracle-longest-first", false, "reference only: submit each step's requests longest response first (length knowledge no router has)")
	fs.Float64Var(&c.lengthCorr, "length-corr", 0, "grpo/agent: within-group correlation rho of log response length (a per-prompt difficulty plus per-sample noise; marginal unchanged; stratified draws)")
	fs.Float64Var(&c.truncate, "truncate", 0, "grpo/agent (shaped): share of responses that reach the response maximum (max_tokens)")
	fs.IntVar(&c.datasetPrompts, "dataset-prompts", 0, "grpo/agent: a step's prompts come from a dataset of N prompts in shuffled epochs (0 = fresh prompts every step)")
	fs.Float64Var(&c.epochCorr, "epoch-corr", bench.DefaultEpochCorr, "grpo/agent: correlation of a prompt's difficulty between epochs")
	fs.StringVar(&c.arrivals, "arrivals", "burst", "burst (a step's requests all at its start) | verl (batch order, chunked per agent-loop worker, at --client-rate)")
	fs.Float64Var(&c.clientRate, "client-rate", bench.DefaultClientRate, "--arrivals verl: acquires per second through verl's client path")
	fs.IntVar(&c.clientWorkers, "client-workers", bench.DefaultClientWorkers, "--arrivals verl: agent-loop workers")
	fs.StringVar(&c.engineModel, "engine-model", "default", "engine step-time model: default | hbm (prefill attention, decode from KV bytes and memory bandwidth)")
	fs.StringVar(&c.toolPareto, "tool-pareto", "", "agent: tool latency as a bounded Pareto MIN,MAX,ALPHA in seconds (e.g. 1,60,0.8); empty = the workload's lognormal")
	fs.IntVar(&c.fromStep, "report-from-step", 0, "held-out: makespans count steps from this 0-based index on (1 = epoch >= 2 with --dataset-prompts equal to a step's prompts)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "length-corr", "truncate", "dataset-prompts", "epoch-corr":
			c.shaped = true
		}
	})
	if c.arrivals != "burst" && c.arrivals != "verl" {
		return nil, fmt.Errorf("--arrivals must be burst or verl, got %q", c.arrivals)
	}
	if c.clientRate <= 0 || c.clientWorkers < 1 || c.fromStep < 0 {
		return nil, errors.New("--client-rate and --client-workers must be positive, --report-from-step not negative")
	}
	if _, err := (sim.Config{}).WithModel(c.engineModel); err != nil {
		return nil, err
	}
	if c.shaped {
		if err := c.shape().Validate(0); err != nil {
			return nil, err
		}
	}
	if c.toolPareto != "" {
		if _, err := c.pareto(); err != nil {
			return nil, err
		}
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	switch c.workload {
	case "mooncake", "grpo", "grpo_sat", "agent", "agent_scale", "agent_long", "agent_long_few":
	default:
		return nil, fmt.Errorf("--workload must be mooncake, grpo, grpo_sat, agent, agent_scale, agent_long or agent_long_few, got %q", c.workload)
	}
	if c.engines < 1 || c.gpuBlocks < 1 || c.blockSize < 1 || c.maxSeqs < 1 || c.rateScale <= 0 || c.scrape <= 0 {
		return nil, errors.New("--engines, --gpu-blocks, --block-size, --max-num-seqs, --rate-scale and --scrape-interval must be positive")
	}
	if c.promptSigma < 0 || c.responseSigma < 0 || c.responseMax < 0 || c.systemTokens < -1 {
		return nil, errors.New("--prompt-sigma, --response-sigma and --response-max must not be negative, --system-tokens not below -1")
	}
	if c.responseMax > 0 && (c.responseMax < 16 || float64(c.responseMax) < c.responseMedian) {
		return nil, fmt.Errorf("--response-max %d: below 16 tokens or below --response-median", c.responseMax)
	}
	if c.spread < 0 || c.eventDelay < 0 {
		return nil, errors.New("--arrival-spread and --event-delay must not be negative")
	}
	switch c.kvcTurns {
	case "":
		c.kvcTurns = bench.TurnsFor(c.workload)
	case kvcrouter.TurnsAuto, kvcrouter.TurnsSingle, kvcrouter.TurnsMulti:
	default:
		return nil, fmt.Errorf("--kvc-turns %q (allowed: %s, %s, %s)", c.kvcTurns,
			kvcrouter.TurnsAuto, kvcrouter.TurnsSingle, kvcrouter.TurnsMulti)
	}
	if c.kvcFrozen != "" {
		if c.kvcParams != "" {
			return nil, fmt.Errorf("--kvc-frozen and --kvc-params are exclusive")
		}
		f, err := readFrozen(c.kvcFrozen)
		if err != nil {
			return nil, err
		}
		c.params["kvc_aware"], c.frozenCommit, c.kvcAdmit = f.strategy, f.commit, f.admission
		c.kvcMoveTokens = &f.sessionMoveTokens
	}
	if c.kvcAdmission != "" {
		edit, err := admissionOverlay(c.kvcAdmission)
		if err != nil {
			return nil, err
		}
		c.admissionEdit = edit
	}
	if c.kvcParams != "" {
		if !json.Valid([]byte(c.kvcParams)) {
			return nil, errors.New("--kvc-params is not valid JSON")
		}
		c.params["kvc_aware"] = json.RawMessage(c.kvcParams)
	}
	return c, nil
}

// policyOptions is every run's policy options: the seed and parameters
// given, and kvc_aware's router settings from the flags and the freeze.
func (c *config) policyOptions(seed uint64, params map[string]json.RawMessage) bench.PolicyOptions {
	return bench.PolicyOptions{Seed: seed, BlockSize: c.blockSize, Params: params, Turns: c.kvcTurns,
		ResponseTokens: c.responseTokens(), KVCRouter: c.admissionEdit, Admission: c.kvcAdmit, SessionMoveTokens: c.kvcMoveTokens}
}

// repoRoot walks up from the working directory to the directory holding go.mod.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory; pass --trace")
		}
		dir = parent
	}
}

// defaultTraceFlag is the public Mooncake conversation trace where the
// project's shared data sits beside the repository; sliceTrace is its
// first 1,000 rows, shipped in the repository.
const (
	defaultTraceFlag = "../shared/data/mooncake/conversation_trace.jsonl"
	sliceTrace       = "cmd/kvbench/testdata/conversation_trace_1000.jsonl"
)

// resolveTrace resolves a relative trace path against the repository root
// and fails clearly when the file is missing.
func resolveTrace(p string) (string, error) {
	if !filepath.IsAbs(p) {
		root, err := repoRoot()
		if err != nil {
			return "", err
		}
		p = filepath.Join(root, p)
	}
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("mooncake trace %s not found (%v): pass --trace FILE (the public Mooncake conversation_trace.jsonl) or --trace %s", p, err, sliceTrace)
	}
	return p, nil
}

// grpoDefaults is the GRPO workload's configuration before flags.
func grpoDefaults(workload string) bench.GRPOConfig {
	if workload == "grpo_sat" {
		return bench.DefaultGRPOSat()
	}
	return bench.DefaultGRPO()
}

// agentDefaults is the agent workload's configuration before flags.
func agentDefaults(workload string) bench.AgentConfig {
	switch workload {
	case "agent_long":
		return bench.DefaultAgentLong()
	case "agent_scale":
		return bench.DefaultAgentScale()
	case "agent_long_few":
		return bench.DefaultAgentLongFew()
	}
	return bench.DefaultAgent()
}

// responseTokens is what verl's hook tells kvc_aware as response_tokens
// (rollout.response_length) for the run's workload: its longest response
// (--response-max when given); 0 for a chat trace, which is no verl
// rollout.
func (c *config) responseTokens() int {
	workload := c.workload
	switch {
	case strings.HasPrefix(workload, "grpo"):
		if c.responseMax > 0 {
			return c.responseMax
		}
		return grpoDefaults(workload).Response.Max
	case strings.HasPrefix(workload, "agent"):
		return agentDefaults(workload).Response.Max
	}
	return 0
}

// workloadFactory returns a constructor of fresh workload instances and
// the expected number of requests (for the progress bar; 0 = unknown).
func workloadFactory(c *config, seed uint64) (func() bench.Workload, int, error) {
	switch c.workload {
	case "mooncake":
		path, err := resolveTrace(c.trace)
		if err != nil {
			return nil, 0, err
		}
		m, err := bench.LoadMooncake(path, bench.MooncakeConfig{RateScale: c.rateScale, Limit: c.limit, BinSeconds: c.jitter, Seed: seed})
		if err != nil {
			return nil, 0, err
		}
		return func() bench.Workload { return m }, len(m.Rows), nil
	case "grpo", "grpo_sat":
		g := grpoDefaults(c.workload)
		g.Seed = seed
		if c.steps > 0 {
			g.Steps = c.steps
		}
		if c.grpoPrompts > 0 {
			g.Prompts = c.grpoPrompts
		}
		if c.grpoN > 0 {
			g.N = c.grpoN
		}
		if c.promptMedian > 0 {
			g.Prompt.Median = c.promptMedian
		}
		if c.responseMedian > 0 {
			g.Response.Median = c.responseMedian
		}
		if c.promptSigma > 0 {
			g.Prompt.Sigma = c.promptSigma
		}
		if c.responseSigma > 0 {
			g.Response.Sigma = c.responseSigma
		}
		if c.responseMax > 0 {
			g.Response.Max = c.responseMax
		}
		if c.systemTokens >= 0 {
			g.SystemTokens = c.systemTokens
		}
		if c.shaped {
			sh := c.shape()
			if err := sh.Validate(g.Prompts); err != nil {
				return nil, 0, err
			}
			g.Shape = &sh
		}
		return func() bench.Workload { return bench.NewGRPO(g) }, g.Steps * g.Prompts * g.N, nil
	default:
		a := agentDefaults(c.workload)
		a.Seed = seed
		if c.steps > 0 {
			a.Steps = c.steps
		}
		if c.agentTasks > 0 {
			a.Tasks = c.agentTasks
		}
		if c.agentGroup > 0 {
			a.Group = c.agentGroup
		}
		if c.promptMedian > 0 {
			a.Task.Median = c.promptMedian
		}
		if c.responseMedian > 0 {
			a.Response.Median = c.responseMedian
		}
		if c.shaped {
			sh := c.shape()
			if err := sh.Validate(a.Tasks); err != nil {
				return nil, 0, err
			}
			a.Shape = &sh
		}
		if c.toolPareto != "" {
			p, err := c.pareto()
			if err != nil {
				return nil, 0, err
			}
			a.ToolPareto = p
		}
		return func() bench.Workload { return bench.NewAgent(a) }, a.Steps * a.Tasks * a.Group * (a.MinTurns + a.MaxTurns) / 2, nil
	}
}

func (c *config) options(progress *atomic.Int64) bench.Options {
	o := bench.Options{
		Engines: bench.EngineSpec{Engines: c.engines, GPUBlocks: c.gpuBlocks, CPUBlocks: c.cpuBlocks, BlockSize: c.blockSize,
			MaxNumSeqs: c.maxSeqs, MaxBatchedTokens: c.maxBatched, Seed: c.seed, Model: c.engineModel},
		ScrapeInterval: c.scrape, EventDelay: c.eventDelay, ArrivalSpread: c.spread, Progress: progress,
		OracleLongestFirst: c.oracleLPT,
	}
	if c.arrivals == "verl" {
		o.ClientRate, o.ClientWorkers = c.clientRate, c.clientWorkers
	}
	return o
}

func run(args []string, stdout, stderr io.Writer) int {
	c, err := parseFlags(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "kvbench:", err)
		return 2
	}
	if c.heldout {
		if err := heldout(c, stdout, stderr); err != nil {
			fmt.Fprintln(stderr, "kvbench:", err)
			return 1
		}
		return 0
	}
	if c.sweepSpread != "" {
		if err := sweepSpread(c, stdout, stderr); err != nil {
			fmt.Fprintln(stderr, "kvbench:", err)
			return 1
		}
		return 0
	}
	if c.sweepAlpha != "" {
		if err := sweep(c, stdout, stderr); err != nil {
			fmt.Fprintln(stderr, "kvbench:", err)
			return 1
		}
		return 0
	}
	if err := single(c, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "kvbench:", err)
		return 1
	}
	return 0
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func single(c *config, stdout, stderr io.Writer) error {
	mk, expected, err := workloadFactory(c, c.seed)
	if err != nil {
		return err
	}
	names := splitList(c.policies)
	if len(names) == 0 {
		return errors.New("--policies is empty")
	}
	var progress atomic.Int64
	popt := c.policyOptions(c.seed, c.params)
	s := &bench.Suite{NewWorkload: mk, Policies: names, PolicyOpts: popt, Opts: c.options(&progress), Parallel: c.parallel,
		MakespanBound: c.makespanBound}
	stop := startProgress(stderr, &progress, expected*len(names), c.quiet)
	start := time.Now()
	rep, results, err := s.Run()
	stop()
	if err != nil {
		return err
	}
	rep.Config = map[string]any{
		"engines": c.engines, "gpu_blocks": c.gpuBlocks, "cpu_blocks": c.cpuBlocks, "block_size": c.blockSize,
		"max_num_seqs": c.maxSeqs, "max_batched_tokens": c.maxBatched, "scrape_interval_s": c.scrape,
		"event_delay_s": c.eventDelay, "arrival_spread_s": c.spread, "seed": c.seed, "wall_s": time.Since(start).Seconds(),
		"engine_model": c.engineModel, "arrivals": c.arrivals, "kvc_turns": c.kvcTurns, "kvc_response_tokens": c.responseTokens(),
	}
	if c.kvcAdmission != "" {
		rep.Config["kvc_admission"] = json.RawMessage(c.kvcAdmission)
	}
	if c.arrivals == "verl" {
		rep.Config["client_rate"], rep.Config["client_workers"] = c.clientRate, c.clientWorkers
	}
	if c.shaped {
		rep.Config["shape"] = c.shape()
	}
	if c.toolPareto != "" {
		rep.Config["tool_pareto"] = c.toolPareto
	}
	if len(c.params) > 0 {
		rep.Config["params"] = c.params
	}
	if c.workload == "mooncake" {
		rep.Config["rate_scale"] = c.rateScale
		rep.Config["limit"] = c.limit
	}
	fmt.Fprintf(stdout, "workload %s, %d engines x %d GPU blocks (block %d), cpu blocks %d, scrape %.3gs (llm-d %.3gs), arrival spread %.3gs, event delay %.3gs, seed %d\n",
		rep.Workload, c.engines, c.gpuBlocks, c.blockSize, c.cpuBlocks, c.scrape, bench.LLMDScrapeInterval, c.spread, c.eventDelay, c.seed)
	rep.WriteTable(stdout)
	if c.jsonOut != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(c.jsonOut, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	if c.csvOut != "" {
		f, err := os.Create(c.csvOut)
		if err != nil {
			return err
		}
		if err := rep.WriteCSV(f); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	if c.plotOut != "" {
		if err := writePlot(c.plotOut, rep, results); err != nil {
			return fmt.Errorf("plot: %w", err)
		}
	}
	return nil
}

// startProgress draws a progress bar on stderr once a run has lasted 2 s.
func startProgress(w io.Writer, done *atomic.Int64, total int, quiet bool) func() {
	if quiet {
		return func() {}
	}
	stop := make(chan struct{})
	finished := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(finished)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		drawn := false
		for {
			select {
			case <-stop:
				if drawn {
					fmt.Fprintln(w)
				}
				return
			case <-t.C:
				el := time.Since(start)
				if el < 2*time.Second {
					continue
				}
				drawn = true
				n := done.Load()
				frac := 0.0
				if total > 0 {
					frac = float64(n) / float64(total)
					if frac > 1 {
						frac = 1
					}
				}
				const width = 30
				k := int(frac * width)
				fmt.Fprintf(w, "\r[%s%s] %3.0f%% %d/%d requests %5.1fs ", strings.Repeat("=", k), strings.Repeat(" ", width-k),
					100*frac, n, total, el.Seconds())
			}
		}
	}()
	return func() {
		close(stop)
		<-finished
	}
}

func parseFloats(s string) ([]float64, error) {
	var out []float64
	for _, p := range splitList(s) {
		v, err := strconv.ParseFloat(p, 64)
		if err != nil {
			return nil, fmt.Errorf("bad number %q", p)
		}
		out = append(out, v)
	}
	return out, nil
}

// admissionOverlay decodes --kvc-admission strictly (unknown fields, bad
// values and enabling or disabling admission are errors) into an edit of
// the +admit rows' router configuration.
func admissionOverlay(raw string) (func(*kvcrouter.RouterConfig), error) {
	var probe map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &probe); err != nil {
		return nil, fmt.Errorf("--kvc-admission: not a JSON object: %w", err)
	}
	if _, ok := probe["enabled"]; ok {
		return nil, errors.New("--kvc-admission: \"enabled\" is the policy name's (+admit)")
	}
	check := kvcrouter.RouterConfig{Mode: kvcrouter.ModeKVCAware}
	check.Admission.Enabled = true
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&check.Admission); err != nil {
		return nil, fmt.Errorf("--kvc-admission: %w", err)
	}
	if err := check.Normalise(); err != nil {
		return nil, fmt.Errorf("--kvc-admission: %w", err)
	}
	return func(c *kvcrouter.RouterConfig) {
		if c.Admission.Enabled {
			_ = json.Unmarshal([]byte(raw), &c.Admission)
		}
	}, nil
}
