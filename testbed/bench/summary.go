package bench

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
)

// Summary is one policy's headline figures (the kvbench JSON schema).
type Summary struct {
	HitRate    float64 `json:"hit_rate"`
	GPUHitRate float64 `json:"gpu_hit_rate"`
	CPUHitRate float64 `json:"cpu_hit_rate"`
	SSDHitRate float64 `json:"ssd_hit_rate"`
	TTFTMean   float64 `json:"ttft_mean_s"`
	TTFTP50    float64 `json:"ttft_p50_s"`
	TTFTP99    float64 `json:"ttft_p99_s"`
	E2EP50     float64 `json:"e2e_p50_s"`
	E2EP99     float64 `json:"e2e_p99_s"`
	Throughput float64 `json:"throughput_tok_s"`
	Makespan   float64 `json:"makespan_s"`
	// MakespanSteps is each phase's makespan (Makespan is their sum;
	// not in the JSON schema, whose policy fields are numbers).
	MakespanSteps []float64 `json:"-"`
	Imbalance     float64   `json:"imbalance"`
	DecisionP50   float64   `json:"decision_p50_us"`
	DecisionP99   float64   `json:"decision_p99_us"`
	Requests      int       `json:"requests"`
	Skipped       int       `json:"skipped"`
	Preemptions   int64     `json:"preemptions"`
	HitOverPooled float64   `json:"hit_over_pooled_lru"`
	// GainShare is the share of the makespan gain over verl_default this
	// policy captures, against the prefill-free bound (nil without it).
	GainShare *float64 `json:"makespan_gain_share,omitempty"`
	// BoundShare is the share of verl_default's gap to the makespan lower
	// bound (Bounds.MakespanLower) this policy closes.
	BoundShare     *float64 `json:"makespan_bound_share,omitempty"`
	WallSeconds    float64  `json:"wall_s"`
	EventsApplied  uint64   `json:"events_applied"`
	EventApplyErrs uint64   `json:"event_errors"`
	// LengthCorr and TaskCorr are the router's last measured within-prompt
	// and within-task length correlations (the kvc_aware gates
	// group_spread_min_corr and task_spread_min_corr read them); absent
	// when nothing was measured.
	LengthCorr *float64 `json:"length_corr,omitempty"`
	TaskCorr   *float64 `json:"task_corr,omitempty"`
}

// Bounds are the policy-independent figures a policy is judged against.
// Oracle bounds the hit rate from above. MakespanFree is the makespan
// target: what prefix caching could at most save over verl_default (a
// policy that also balances decode better can beat it, a share > 100%).
// Pooled is a reference only: LRU is not optimal and ignores in-flight
// pins, so a policy can beat it.
type Bounds struct {
	Oracle float64 `json:"oracle_hit_rate"`
	// Pooled is one LRU with every engine's GPU capacity pooled.
	Pooled float64 `json:"pooled_lru_hit_rate"`
	// MakespanFree is the summed per-step makespan of verl_default on
	// engines whose prefill is free; MakespanFreeSteps per step.
	MakespanFree      *float64  `json:"makespan_prefill_free_s,omitempty"`
	MakespanFreeSteps []float64 `json:"makespan_prefill_free_steps_s,omitempty"`
	// OracleTrace is the Mooncake trace's own 512-token-block oracle.
	OracleTrace *float64 `json:"oracle_hit_rate_trace_blocks,omitempty"`
	// MakespanLower is LowerBound's makespan: no routing can beat it on
	// the engine model (summed over phases; MakespanLowerSteps per phase).
	MakespanLower      float64   `json:"makespan_lower_bound_s"`
	MakespanLowerSteps []float64 `json:"makespan_lower_bound_steps_s,omitempty"`
	// PooledBlocks is the pooled LRU capacity in engine blocks.
	PooledBlocks int `json:"pooled_lru_blocks"`
}

// Quantile returns the q-quantile of sorted xs (nearest rank, 0 if empty).
func Quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(sorted) {
		i = len(sorted) - 1
	}
	return sorted[i]
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// Summarise reduces a Result; pooled (may be 0) scales HitOverPooled.
func Summarise(r *Result, pooled float64) Summary {
	s := Summary{
		HitRate:    ratio(r.CachedTokens, r.PromptTokens),
		GPUHitRate: ratio(r.GPUHitTokens, r.PromptTokens),
		CPUHitRate: ratio(r.CPUHitTokens, r.PromptTokens),
		SSDHitRate: ratio(r.SSDHitTokens, r.PromptTokens),
		TTFTMean:   mean(r.TTFT), TTFTP50: Quantile(r.TTFT, 0.5), TTFTP99: Quantile(r.TTFT, 0.99),
		E2EP50: Quantile(r.E2E, 0.5), E2EP99: Quantile(r.E2E, 0.99),
		DecisionP50: Quantile(r.DecisionUS, 0.5), DecisionP99: Quantile(r.DecisionUS, 0.99),
		Requests: r.Requests, Skipped: r.Skipped, Preemptions: r.Preemptions, WallSeconds: r.Wall.Seconds(),
		EventsApplied: r.Events.Events, EventApplyErrs: r.Events.ApplyErrors + r.Events.DecodeErrors,
	}
	if r.Span > 0 {
		s.Throughput = float64(r.OutputTokens) / r.Span
	}
	for _, m := range r.Makespans {
		s.Makespan += m
	}
	s.MakespanSteps = append([]float64(nil), r.Makespans...)
	if l := r.Lengths; l != nil {
		if l.LengthCorrKnown {
			s.LengthCorr = &l.LengthCorr
		}
		if l.TaskCorrKnown {
			s.TaskCorr = &l.TaskCorr
		}
	}
	if mb := mean(r.Busy); mb > 0 {
		mx := 0.0
		for _, b := range r.Busy {
			mx = math.Max(mx, b)
		}
		s.Imbalance = mx / mb
	}
	if pooled > 0 {
		s.HitOverPooled = s.HitRate / pooled
	}
	return s
}

// Report is the kvbench output document.
type Report struct {
	Workload string             `json:"workload"`
	Config   map[string]any     `json:"config"`
	Order    []string           `json:"-"`
	Policies map[string]Summary `json:"policies"`
	Bounds   Bounds             `json:"bounds"`
	// MakespanSteps is each policy's makespan per step (rollout phase).
	MakespanSteps map[string][]float64 `json:"makespan_steps_s,omitempty"`
}

// WriteTable prints an aligned table of every policy plus the bounds.
func (rep *Report) WriteTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\thit\t/pooled\tgpu\tcpu\tttft_mean\tttft_p50\tttft_p99\te2e_p50\te2e_p99\ttok/s\tmakespan\tgain\tbound%\timbal\tdec_p50us\tdec_p99us\tpreempt\twall_s\t")
	for _, n := range rep.Order {
		s := rep.Policies[n]
		gain := "-"
		if s.GainShare != nil {
			gain = fmt.Sprintf("%.0f%%", 100**s.GainShare)
		}
		bshare := "-"
		if s.BoundShare != nil {
			bshare = fmt.Sprintf("%.0f%%", 100**s.BoundShare)
		}
		fmt.Fprintf(tw, "%s\t%.1f%%\t%.2f\t%.1f%%\t%.1f%%\t%.3f\t%.3f\t%.3f\t%.2f\t%.2f\t%.0f\t%.1f\t%s\t%s\t%.3f\t%.1f\t%.1f\t%d\t%.1f\t\n",
			n, 100*s.HitRate, s.HitOverPooled, 100*s.GPUHitRate, 100*s.CPUHitRate, s.TTFTMean, s.TTFTP50, s.TTFTP99,
			s.E2EP50, s.E2EP99, s.Throughput, s.Makespan, gain, bshare, s.Imbalance, s.DecisionP50, s.DecisionP99, s.Preemptions, s.WallSeconds)
	}
	tw.Flush()
	fmt.Fprintf(w, "oracle hit rate (upper bound) %.1f%%; pooled LRU of %d blocks (a reference, not a bound) %.1f%%",
		100*rep.Bounds.Oracle, rep.Bounds.PooledBlocks, 100*rep.Bounds.Pooled)
	if rep.Bounds.OracleTrace != nil {
		fmt.Fprintf(w, "  oracle on 512-token trace blocks %.1f%%", 100**rep.Bounds.OracleTrace)
	}
	if rep.Bounds.MakespanFree != nil {
		fmt.Fprintf(w, "; prefill-free makespan (verl_default routing, every prompt as if cached) %.1f s; gain = share of verl_default's gap to it captured", *rep.Bounds.MakespanFree)
	}
	if rep.Bounds.MakespanLower > 0 {
		best := math.Inf(1)
		for _, n := range rep.Order {
			best = math.Min(best, rep.Policies[n].Makespan)
		}
		fmt.Fprintf(w, "\nmakespan lower bound (engine model: least work spread evenly, or the longest request chain alone) %.1f s; the best policy here is %.1f%% above it; bound%% = share of verl_default's gap to it closed",
			rep.Bounds.MakespanLower, 100*(best/rep.Bounds.MakespanLower-1))
	}
	fmt.Fprintln(w)
}

// WriteCSV writes one row per policy.
func (rep *Report) WriteCSV(w io.Writer) error {
	cols := []string{"workload", "policy", "hit_rate", "gpu_hit_rate", "cpu_hit_rate", "ttft_mean_s", "ttft_p50_s", "ttft_p99_s",
		"e2e_p50_s", "e2e_p99_s", "throughput_tok_s", "makespan_s", "imbalance", "decision_p50_us", "decision_p99_us",
		"preemptions", "requests", "oracle_hit_rate", "pooled_lru_hit_rate"}
	if _, err := fmt.Fprintln(w, strings.Join(cols, ",")); err != nil {
		return err
	}
	for _, n := range rep.Order {
		s := rep.Policies[n]
		if _, err := fmt.Fprintf(w, "%s,%s,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.6f,%.3f,%.4f,%.4f,%.3f,%.3f,%d,%d,%.6f,%.6f\n",
			rep.Workload, n, s.HitRate, s.GPUHitRate, s.CPUHitRate, s.TTFTMean, s.TTFTP50, s.TTFTP99, s.E2EP50, s.E2EP99,
			s.Throughput, s.Makespan, s.Imbalance, s.DecisionP50, s.DecisionP99, s.Preemptions, s.Requests,
			rep.Bounds.Oracle, rep.Bounds.Pooled); err != nil {
			return err
		}
	}
	return nil
}
