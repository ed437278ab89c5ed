package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	json "github.com/goccy/go-json"

	"github.com/kvc-router/kvc-router/core/kvcrouter"
	"github.com/kvc-router/kvc-router/testbed/bench"
)

// tuneGrid is each tunable policy's main knob, four points each (the same
// budget for every policy; each grid contains the policy's default).
// kvc_aware is tuned only through its strategy parameters (tooling-side
// configuration); its scoring code is not touched here.
var tuneGrid = map[string][]string{
	"kvc_aware":          {`{"alpha":0.3}`, `{"alpha":0.15}`, `{"alpha":0.5}`, `{"alpha":0.7}`},
	"sglang_cache_aware": {`{"balance_abs_threshold":64,"balance_rel_threshold":1.5}`, `{"balance_abs_threshold":32,"balance_rel_threshold":1.1}`, `{"balance_abs_threshold":8,"balance_rel_threshold":1.1}`, `{"balance_abs_threshold":2,"balance_rel_threshold":1.05}`},
	"llmd_weighted":      {`{"prefix_weight":3,"queue_weight":2,"kv_weight":2}`, `{"prefix_weight":2,"queue_weight":1,"kv_weight":1}`, `{"prefix_weight":1,"queue_weight":1,"kv_weight":1}`, `{"prefix_weight":4,"queue_weight":1,"kv_weight":1}`},
	"llmd_precise":       {`{"prefix_weight":2,"queue_weight":1,"kv_weight":1}`, `{"prefix_weight":3,"queue_weight":2,"kv_weight":2}`, `{"prefix_weight":1,"queue_weight":1,"kv_weight":1}`, `{"prefix_weight":4,"queue_weight":1,"kv_weight":1}`},
	"dynamo_cost":        {`{"overlap_score_credit":1}`, `{"overlap_score_credit":0.5}`, `{"overlap_score_credit":2}`, `{"overlap_score_credit":4}`},
	// Dynamo's predict-on-route variant: its overlap credit and its own
	// feature, router_predicted_ttl_secs (the arena's tuning picked 2 s and
	// 20 s on different workloads).
	"dynamo_cost+ttl": {`{"overlap_score_credit":1}`, `{"overlap_score_credit":4}`, `{"overlap_score_credit":1,"router_predicted_ttl_secs":20}`, `{"overlap_score_credit":4,"router_predicted_ttl_secs":20}`},
	// The agentic preset's points keep its per-request decode charge and
	// move the two weights it sets (the first point is the preset).
	"dynamo_cost+agentic": {`{"overlap_score_credit":2}`, `{"overlap_score_credit":4}`, `{"overlap_score_credit":1}`, `{"overlap_score_credit":2,"prefill_load_scale":1}`},
	// The router queue's threshold and order (the first point is the
	// variant's: 1.0, fcfs; the arena's grid has the same points around
	// its wspt row).
	"dynamo_cost+queue": {`{"router_queue_threshold":1}`, `{"router_queue_threshold":0.5}`, `{"router_queue_threshold":2}`, `{"router_queue_policy":"wspt"}`},
	"smg_cache_aware":   {`{"balance_abs_threshold":64,"balance_rel_threshold":1.5}`, `{"balance_abs_threshold":32,"balance_rel_threshold":1.1}`, `{"balance_abs_threshold":8,"balance_rel_threshold":1.1}`, `{"balance_abs_threshold":2,"balance_rel_threshold":1.05}`},
}

// gridFor is a policy's tuning grid: its own when it has one, else its
// base policy's. Every variant ("+ttl", "+session", ...) is tuned on its
// own seeds-only search, never handed its base policy's choice.
func gridFor(name string) []string {
	if g, ok := tuneGrid[name]; ok {
		return g
	}
	return tuneGrid[bench.BaseName(name)]
}

// runJob is one replay: a policy (with parameters) on one seed.
type runJob struct {
	seed   uint64
	policy string
	params map[string]json.RawMessage
	spread float64
	free   bool // prefill-free engines (the makespan bound)
}

// runJobs replays every job, c.parallel at a time, and summarises each.
//
// A prefill-free job (the bound) also records its requests, and lower[i]
// is then the workload's makespan lower bound (bench.LowerBound, at the
// real engines' costs); 0 for every other job.
func runJobs(c *config, jobs []runJob, stderr io.Writer) (sums []bench.Summary, lower []float64, err error) {
	mks := map[uint64]func() bench.Workload{}
	total := 0
	for _, j := range jobs {
		if _, ok := mks[j.seed]; ok {
			continue
		}
		mk, _, err := workloadFactory(c, j.seed)
		if err != nil {
			return nil, nil, err
		}
		mks[j.seed] = mk
	}
	for _, j := range jobs {
		_, n, _ := workloadFactory(c, j.seed)
		total += n
	}
	var progress atomic.Int64
	stop := startProgress(stderr, &progress, total, c.quiet)
	defer stop()
	sums = make([]bench.Summary, len(jobs))
	lower = make([]float64, len(jobs))
	errs := make([]error, len(jobs))
	sem := make(chan struct{}, max(1, c.parallel))
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Add(1)
		go func(i int, j runJob) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			pol, err := bench.NewPolicy(j.policy, c.policyOptions(j.seed, j.params))
			if err != nil {
				errs[i] = err
				return
			}
			cc := *c
			cc.seed, cc.spread = j.seed, j.spread
			o := cc.options(&progress)
			if j.free {
				o.Engines.PrefillPerToken = 1e-12
				o.Record = true
			}
			res, err := bench.Run(mks[j.seed](), pol, o)
			if err != nil {
				errs[i] = fmt.Errorf("%s seed %d: %w", j.policy, j.seed, err)
				return
			}
			sums[i] = c.summarise(res)
			if j.free {
				lc, err := (bench.EngineSpec{BlockSize: c.blockSize, GPUBlocks: c.gpuBlocks, MaxNumSeqs: c.maxSeqs,
					MaxBatchedTokens: c.maxBatched, Model: c.engineModel}).SimConfig()
				if err != nil {
					errs[i] = err
					return
				}
				var steps []float64
				lower[i], steps = bench.LowerBound(res.Records, lc, c.engines)
				if c.fromStep > 0 {
					lower[i] = sumFrom(steps, c.fromStep)
				}
			}
		}(i, j)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, nil, err
		}
	}
	return sums, lower, nil
}

func parseSeeds(s string) ([]uint64, error) {
	var out []uint64
	for _, p := range splitList(s) {
		v, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("bad seed %q", p)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no seeds")
	}
	return out, nil
}

// objective is what tuning minimises: the mean of the makespan and TTFT
// p99 ratios to verl_default on the same seed ("mixed"), or the makespan
// ratio alone ("step").
func objective(kind string, s, base bench.Summary) float64 {
	if kind == "step" {
		if base.Makespan > 0 {
			return s.Makespan / base.Makespan
		}
		return 0
	}
	r := 0.0
	if base.Makespan > 0 {
		r += s.Makespan / base.Makespan
	}
	if base.TTFTP99 > 0 {
		r += s.TTFTP99 / base.TTFTP99
	}
	return r / 2
}

// stat is a mean, a sample standard deviation, the number of seeds and
// the half-width of the 95% confidence interval of the mean
// (t-distribution, N-1 degrees of freedom; 0 for one seed).
type stat struct {
	Mean float64 `json:"Mean"`
	SD   float64 `json:"SD"`
	N    int     `json:"N"`
	CI95 float64 `json:"CI95"`
}

// t975 is the 0.975 quantile of Student's t for 1..30 degrees of freedom.
var t975 = [...]float64{12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
	2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
	2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042}

// tQuantile975 is t_{0.975, df}; beyond 30 degrees of freedom the normal 1.96
// is within 2% of it.
func tQuantile975(df int) float64 {
	switch {
	case df <= 0:
		return math.NaN()
	case df <= len(t975):
		return t975[df-1]
	}
	return 1.96
}

func statOf(xs []float64) stat {
	if len(xs) == 0 {
		return stat{}
	}
	var m float64
	for _, x := range xs {
		m += x
	}
	m /= float64(len(xs))
	var v float64
	for _, x := range xs {
		v += (x - m) * (x - m)
	}
	if len(xs) > 1 {
		v /= float64(len(xs) - 1)
	}
	st := stat{Mean: m, SD: math.Sqrt(v), N: len(xs)}
	if len(xs) > 1 {
		st.CI95 = tQuantile975(len(xs)-1) * st.SD / math.Sqrt(float64(len(xs)))
	}
	return st
}

// seedResult is one reported seed's outcome of a row.
type seedResult struct {
	Seed     uint64  `json:"seed"`
	Makespan float64 `json:"makespan_s"`
	TTFTP99  float64 `json:"ttft_p99_s"`
	HitRate  float64 `json:"hit_rate"`
}

// heldoutRow is one policy's held-out result. Every tunable peer has two
// rows: its launcher defaults (Tuned false) and the grid point chosen on
// the tuning seeds (Tuned true). kvc_aware runs its frozen configuration
// (Frozen: the commit it was frozen at) when --kvc-frozen is given.
type heldoutRow struct {
	Policy string          `json:"policy"`
	Params json.RawMessage `json:"params,omitempty"`
	Tuned  bool            `json:"tuned"`
	Frozen string          `json:"frozen_commit,omitempty"`
	// DefaultIsTuned: the launcher default was also the tuning choice, so
	// the row stands for both (no second, identical row is run).
	DefaultIsTuned bool `json:"default_is_tuned,omitempty"`
	HitRate        stat `json:"hit_rate"`
	TTFTP50        stat `json:"ttft_p50_s"`
	TTFTP99        stat `json:"ttft_p99_s"`
	Makespan       stat `json:"makespan_s"`
	// PerSeed holds the reported seeds' values, so any two rows can be
	// compared paired by seed (the renderers' one statistical rule).
	PerSeed   []seedResult `json:"per_seed"`
	MakespanR stat         `json:"makespan_over_verl"`
	// GainShare is Σ(verl − policy) / Σ(verl − bound) over the seeds.
	GainShare float64 `json:"makespan_gain_share"`
	// BoundShare is Σ(verl − policy) / Σ(verl − lower bound) over the
	// seeds: the share of verl_default's gap to bench.LowerBound closed.
	BoundShare float64 `json:"makespan_bound_share"`
	Imbalance  stat    `json:"imbalance"`
}

// heldout tunes each tunable policy in --policies on --tune-seeds (the grid
// point with the lowest objective), then reports every policy on
// --report-seeds, none of which was tuned on, as mean ± sample SD.
func heldout(c *config, stdout, stderr io.Writer) error {
	tune, err := parseSeeds(c.tuneSeeds)
	if err != nil {
		return fmt.Errorf("--tune-seeds: %w", err)
	}
	report, err := parseSeeds(c.reportSeeds)
	if err != nil {
		return fmt.Errorf("--report-seeds: %w", err)
	}
	for _, t := range tune {
		for _, r := range report {
			if t == r {
				return fmt.Errorf("seed %d is both a tuning and a reported seed", t)
			}
		}
	}
	names := splitList(c.policies)
	if len(names) == 0 {
		return fmt.Errorf("--policies is empty")
	}
	if c.tuneObjective != "mixed" && c.tuneObjective != "step" {
		return fmt.Errorf("--tune-objective %q: want mixed or step", c.tuneObjective)
	}
	// Tuning.
	var jobs []runJob
	for _, s := range tune {
		jobs = append(jobs, runJob{seed: s, policy: "verl_default", spread: c.spread})
	}
	type point struct {
		policy string
		raw    string
	}
	var points []point
	tuned := map[string]bool{}
	for _, n := range names {
		// Each variant is tuned on its own runs (its parameters are its
		// base policy's knobs); a frozen kvc_aware is not tuned at all.
		base := bench.BaseName(n)
		if tuned[n] || (base == "kvc_aware" && c.kvcFrozen != "") {
			continue
		}
		tuned[n] = true
		for _, raw := range gridFor(n) {
			points = append(points, point{n, raw})
			for _, s := range tune {
				jobs = append(jobs, runJob{seed: s, policy: n, spread: c.spread,
					params: map[string]json.RawMessage{base: json.RawMessage(raw)}})
			}
		}
	}
	sums, _, err := runJobs(c, jobs, stderr)
	if err != nil {
		return err
	}
	base := map[uint64]bench.Summary{}
	for i, j := range jobs {
		if j.policy == "verl_default" && j.params == nil {
			base[j.seed] = sums[i]
		}
	}
	chosen := map[string]string{}
	bestObj := map[string]float64{}
	for _, p := range points {
		var o float64
		for i, j := range jobs {
			if j.policy == p.policy && string(j.params[bench.BaseName(p.policy)]) == p.raw {
				o += objective(c.tuneObjective, sums[i], base[j.seed])
			}
		}
		o /= float64(len(tune))
		if b, ok := bestObj[p.policy]; !ok || o < b {
			bestObj[p.policy], chosen[p.policy] = o, p.raw
		}
	}
	// Reporting: every policy at its defaults (kvc_aware: frozen), and
	// every tuned one again with its chosen point.
	type variant struct {
		policy string
		raw    string // "" = launcher defaults
	}
	var variants []variant
	for _, n := range names {
		variants = append(variants, variant{n, ""})
		// Each grid's first point is the launcher default.
		if raw, ok := chosen[n]; ok && raw != gridFor(n)[0] {
			variants = append(variants, variant{n, raw})
		}
	}
	jobs = jobs[:0]
	var jv []int // jobs[i] runs variants[jv[i]] (-1: the bound)
	for _, s := range report {
		jobs = append(jobs, runJob{seed: s, policy: "verl_default", spread: c.spread, free: true})
		jv = append(jv, -1)
		for vi, v := range variants {
			j := runJob{seed: s, policy: v.policy, spread: c.spread}
			if bench.BaseName(v.policy) == "kvc_aware" && c.kvcFrozen != "" {
				j.params = map[string]json.RawMessage{"kvc_aware": c.params["kvc_aware"]}
			}
			// A variant runs with its own choice (its base policy's knobs).
			if v.raw != "" {
				j.params = map[string]json.RawMessage{bench.BaseName(v.policy): json.RawMessage(v.raw)}
			}
			jobs = append(jobs, j)
			jv = append(jv, vi)
		}
	}
	sums, lowers, err := runJobs(c, jobs, stderr)
	if err != nil {
		return err
	}
	bound := map[uint64]float64{}
	lower := map[uint64]float64{}
	verl := map[uint64]float64{}
	for i, j := range jobs {
		if j.free {
			bound[j.seed] = sums[i].Makespan
			lower[j.seed] = lowers[i]
		} else if j.policy == "verl_default" {
			verl[j.seed] = sums[i].Makespan
		}
	}
	var rows []heldoutRow
	for vi, v := range variants {
		n := v.policy
		var hit, p50, p99, mk, mr, imb []float64
		var gained, gap, lgap float64
		var per []seedResult
		for i, j := range jobs {
			if jv[i] != vi {
				continue
			}
			s := sums[i]
			per = append(per, seedResult{Seed: j.seed, Makespan: s.Makespan, TTFTP99: s.TTFTP99, HitRate: s.HitRate})
			hit, p50, p99, mk, imb = append(hit, s.HitRate), append(p50, s.TTFTP50), append(p99, s.TTFTP99), append(mk, s.Makespan), append(imb, s.Imbalance)
			mr = append(mr, s.Makespan/verl[j.seed])
			gained += verl[j.seed] - s.Makespan
			gap += verl[j.seed] - bound[j.seed]
			lgap += verl[j.seed] - lower[j.seed]
		}
		r := heldoutRow{Policy: n, HitRate: statOf(hit), TTFTP50: statOf(p50), TTFTP99: statOf(p99), Makespan: statOf(mk),
			MakespanR: statOf(mr), Imbalance: statOf(imb), PerSeed: per}
		if gap > 0 {
			r.GainShare = gained / gap
		}
		if lgap > 0 {
			r.BoundShare = gained / lgap
		}
		if v.raw != "" {
			r.Params, r.Tuned = json.RawMessage(v.raw), true
		} else if raw, ok := chosen[n]; ok && raw == gridFor(n)[0] {
			r.DefaultIsTuned = true
		}
		if bench.BaseName(n) == "kvc_aware" && c.kvcFrozen != "" {
			r.Params, r.Frozen = c.params["kvc_aware"], c.frozenCommit
		}
		rows = append(rows, r)
	}
	var bs, gaps, lbs, best []float64
	for _, s := range report {
		bs = append(bs, bound[s])
		lbs = append(lbs, lower[s])
		m := math.Inf(1)
		for i, j := range jobs {
			if j.seed == s && !j.free {
				m = math.Min(m, sums[i].Makespan)
			}
		}
		best = append(best, m/lower[s])
		gaps = append(gaps, (verl[s]-bound[s])/verl[s])
	}
	fmt.Fprintf(stdout, "held-out: workload %s, %d engines, arrival spread %.3gs; tuned on seeds %s, reported seeds %s (mean ± 95%% CI, t-distribution)\n\n",
		c.workload, c.engines, c.spread, c.tuneSeeds, c.reportSeeds)
	writeHeldoutTable(stdout, rows, statOf(bs), statOf(gaps), statOf(lbs), statOf(best))
	if c.jsonOut != "" {
		doc := map[string]any{"workload": c.workload, "tune_seeds": tune, "report_seeds": report, "arrival_spread_s": c.spread,
			"engines": c.engines, "max_num_seqs": c.maxSeqs, "makespan_prefill_free_s": statOf(bs), "achievable_gain_over_verl": statOf(gaps),
			"makespan_lower_bound_s": statOf(lbs), "best_over_lower_bound": statOf(best), "rows": rows,
			"kvc_frozen":   map[string]string{"path": c.kvcFrozen, "commit": c.frozenCommit},
			"engine_model": c.engineModel, "arrivals": c.arrivals, "report_from_step": c.fromStep,
			"tune_objective": c.tuneObjective}
		if c.arrivals == "verl" {
			doc["client_rate"], doc["client_workers"] = c.clientRate, c.clientWorkers
		}
		if c.shaped {
			doc["shape"] = c.shape()
		}
		if c.toolPareto != "" {
			doc["tool_pareto"] = c.toolPareto
		}
		if c.steps > 0 {
			doc["steps"] = c.steps
		}
		b, err := json.MarshalIndent(doc, "", "  ")
		if err != nil {
			return err
		}
		return os.WriteFile(c.jsonOut, append(b, '\n'), 0o644)
	}
	return nil
}

// pm formats mean ± 95% CI half-width.
func pm(s stat, scale float64, f string) string {
	return fmt.Sprintf(f+" ± "+f, s.Mean*scale, s.CI95*scale)
}

// writeHeldoutTable prints a Markdown table (it pastes into docs/kvbench.md).
func writeHeldoutTable(w io.Writer, rows []heldoutRow, bound, gap, lower, best stat) {
	fmt.Fprintln(w, "| policy | knob (chosen on tuning seeds) | hit rate % | TTFT p50 s | TTFT p99 s | makespan s | makespan / verl | gain share % | bound share % | imbalance |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range rows {
		knob := "launcher defaults"
		switch {
		case r.Frozen != "":
			knob = "frozen at " + r.Frozen
		case r.Tuned:
			knob = "tuned: `" + string(r.Params) + "`"
		case r.DefaultIsTuned:
			knob = "launcher defaults (also the tuning choice)"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %.0f | %.0f | %s |\n", r.Policy, knob, pm(r.HitRate, 100, "%.1f"),
			pm(r.TTFTP50, 1, "%.3f"), pm(r.TTFTP99, 1, "%.3f"), pm(r.Makespan, 1, "%.1f"), pm(r.MakespanR, 1, "%.3f"),
			100*r.GainShare, 100*r.BoundShare, pm(r.Imbalance, 1, "%.2f"))
	}
	fmt.Fprintf(w, "\nmakespan lower bound (engine model: least work spread evenly, or the longest request chain alone): %s s; the best policy's makespan is %s × the bound (how loose it is at most); bound share = share of verl_default's gap to it closed\n",
		pm(lower, 1, "%.1f"), pm(best, 1, "%.3f"))
	fmt.Fprintf(w, "\nprefill-free makespan (verl_default routing, every prompt as if cached): %s s; achievable gain over verl_default: %s %% of its makespan\n",
		pm(bound, 1, "%.1f"), pm(gap, 100, "%.1f"))
}

// sweepSpread runs --policies at each arrival spread over --sweep-seeds and
// prints seed means per (spread, policy).
func sweepSpread(c *config, stdout, stderr io.Writer) error {
	spreads, err := parseFloats(c.sweepSpread)
	if err != nil {
		return err
	}
	for _, s := range spreads {
		if s < 0 {
			return fmt.Errorf("--sweep-spread: negative spread %v", s)
		}
	}
	seeds, err := parseSeeds(c.sweepSeeds)
	if err != nil {
		return fmt.Errorf("--sweep-seeds: %w", err)
	}
	names := splitList(c.policies)
	var jobs []runJob
	for _, sp := range spreads {
		for _, s := range seeds {
			for _, n := range names {
				jobs = append(jobs, runJob{seed: s, policy: n, spread: sp, params: c.params})
			}
		}
	}
	sums, _, err := runJobs(c, jobs, stderr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "arrival-spread sweep: workload %s, %d engines, seeds %s (mean ± 95%% CI, t-distribution)\n\n", c.workload, c.engines, c.sweepSeeds)
	fmt.Fprintln(stdout, "| spread s | policy | hit rate % | TTFT p50 s | TTFT p99 s | makespan s |")
	fmt.Fprintln(stdout, "|---|---|---|---|---|---|")
	for _, sp := range spreads {
		for _, n := range names {
			var hit, p50, p99, mk []float64
			for i, j := range jobs {
				if j.spread == sp && j.policy == n {
					hit, p50, p99, mk = append(hit, sums[i].HitRate), append(p50, sums[i].TTFTP50), append(p99, sums[i].TTFTP99), append(mk, sums[i].Makespan)
				}
			}
			fmt.Fprintf(stdout, "| %g | %s | %s | %s | %s | %s |\n", sp, n, pm(statOf(hit), 100, "%.1f"), pm(statOf(p50), 1, "%.3f"),
				pm(statOf(p99), 1, "%.3f"), pm(statOf(mk), 1, "%.1f"))
		}
	}
	return nil
}

// unnamedParams lists, sorted, the kvc_aware parameters that strategy (a
// JSON object that decodes as kvc_aware's) does not name.
func unnamedParams(strategy json.RawMessage) []string {
	var all, named map[string]json.RawMessage
	b, err := json.Marshal(kvcrouter.DefaultKVCAware())
	if err != nil || json.Unmarshal(b, &all) != nil || json.Unmarshal(strategy, &named) != nil {
		return []string{"(unreadable)"}
	}
	var out []string
	for k := range all {
		if _, ok := named[k]; !ok {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// frozenFile is docs/frozen-kvc-aware.json (testbed/scripts/freeze_kvc_aware.py):
// kvc_aware's whole configuration as the library reported it at a commit.
type frozenFile struct {
	Commit   string          `json:"commit"`
	Status   string          `json:"status"`
	Strategy json.RawMessage `json:"strategy"`
	// LibraryDefaults.Router: the router settings verl's hook runs at that
	// freeze. Admission.Enabled: whether its balancer runs router-side
	// admission (true since admission.enabled's default became auto;
	// freezes before it recorded false). SessionMoveTokens: absent in
	// freezes from before session_move_tokens, which moved sessions by
	// bound counts alone (0).
	LibraryDefaults struct {
		Router struct {
			Admission struct {
				Enabled bool `json:"enabled"`
			} `json:"admission"`
			SessionMoveTokens *float64 `json:"session_move_tokens"`
		} `json:"router"`
	} `json:"library_defaults"`
}

// frozen is a freeze as kvbench runs it.
type frozen struct {
	// strategy is the kvc_aware parameters; commit the commit they were
	// frozen at (with its status when not "frozen").
	strategy json.RawMessage
	commit   string
	// admission: kvc_aware runs router-side admission (the freeze's
	// library defaults, as verl's hook runs them).
	admission bool
	// sessionMoveTokens is the router's session_move_tokens at the freeze.
	sessionMoveTokens float64
}

// readFrozen reads a freeze file; its strategy parameters must decode
// strictly as kvc_aware's and name every parameter.
func readFrozen(path string) (frozen, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return frozen{}, fmt.Errorf("--kvc-frozen: %w", err)
	}
	var f frozenFile
	if err := json.Unmarshal(b, &f); err != nil {
		return frozen{}, fmt.Errorf("--kvc-frozen %s: %w", path, err)
	}
	if f.Commit == "" || len(f.Strategy) == 0 {
		return frozen{}, fmt.Errorf("--kvc-frozen %s: needs \"commit\" and \"strategy\"", path)
	}
	if _, err := bench.NewPolicy("kvc_aware", bench.PolicyOptions{Params: map[string]json.RawMessage{"kvc_aware": f.Strategy}}); err != nil {
		return frozen{}, fmt.Errorf("--kvc-frozen %s: %w", path, err)
	}
	if missing := unnamedParams(f.Strategy); len(missing) > 0 {
		// Left out, they would take today's defaults, and a rerun of an
		// old freeze would silently run a later behaviour.
		return frozen{}, fmt.Errorf("--kvc-frozen %s: \"strategy\" does not name %s: a freeze names every kvc_aware "+
			"parameter (set each added after it to its value at that commit, its off value)", path, strings.Join(missing, ", "))
	}
	out := frozen{strategy: f.Strategy, commit: f.Commit, admission: f.LibraryDefaults.Router.Admission.Enabled}
	if f.Status != "" && f.Status != "frozen" {
		out.commit += " (" + f.Status + ")"
	}
	if v := f.LibraryDefaults.Router.SessionMoveTokens; v != nil {
		out.sessionMoveTokens = *v
	}
	return out, nil
}
