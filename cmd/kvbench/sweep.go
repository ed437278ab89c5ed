package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"

	json "github.com/goccy/go-json"

	"github.com/kvc-router/kvc-router/testbed/bench"
)

type sweepPoint struct {
	alpha, threshold float64
	tiers            string // "gpu/cpu" or ""
}

func (p sweepPoint) params() json.RawMessage {
	m := map[string]any{"alpha": p.alpha, "load_threshold": p.threshold}
	if p.tiers != "" {
		g, cpu, _ := strings.Cut(p.tiers, "/")
		gv, _ := strconv.ParseFloat(g, 64)
		cv, _ := strconv.ParseFloat(cpu, 64)
		m["layer_weights"] = map[string]float64{"gpu": gv, "cpu": cv, "ssd": cv / 2}
	}
	b, _ := json.Marshal(m)
	return b
}

// sweep runs kvc_aware over an alpha × load_threshold (× tier weights) grid
// for each seed, plus verl_default per seed as the reference, and prints
// the seed-averaged figures.
func sweep(c *config, stdout, stderr io.Writer) error {
	alphas, err := parseFloats(c.sweepAlpha)
	if err != nil {
		return err
	}
	thrs, err := parseFloats(c.sweepThreshold)
	if err != nil {
		return err
	}
	tiers := splitList(c.sweepTiers)
	if len(tiers) == 0 {
		tiers = []string{""}
	}
	var seeds []uint64
	for _, s := range splitList(c.sweepSeeds) {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return fmt.Errorf("bad seed %q", s)
		}
		seeds = append(seeds, v)
	}
	var points []sweepPoint
	for _, a := range alphas {
		for _, t := range thrs {
			for _, tw := range tiers {
				points = append(points, sweepPoint{a, t, tw})
			}
		}
	}
	type job struct {
		seed  uint64
		point int // -1 = verl_default
	}
	var jobs []job
	for _, s := range seeds {
		jobs = append(jobs, job{s, -1})
		for i := range points {
			jobs = append(jobs, job{s, i})
		}
	}
	mks := map[uint64]func() bench.Workload{}
	total := 0
	for _, s := range seeds {
		mk, n, err := workloadFactory(c, s)
		if err != nil {
			return err
		}
		mks[s] = mk
		total += n * (len(points) + 1)
	}
	var progress atomic.Int64
	stop := startProgress(stderr, &progress, total, c.quiet)
	sums := make([]bench.Summary, len(jobs))
	errs := make([]error, len(jobs))
	sem := make(chan struct{}, max(1, c.parallel))
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Add(1)
		go func(i int, j job) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			cc := *c
			cc.seed = j.seed
			popt := c.policyOptions(j.seed, nil)
			name := "verl_default"
			if j.point >= 0 {
				name = "kvc_aware"
				popt.Params = map[string]json.RawMessage{"kvc_aware": points[j.point].params()}
			}
			pol, err := bench.NewPolicy(name, popt)
			if err != nil {
				errs[i] = err
				return
			}
			res, err := bench.Run(mks[j.seed](), pol, cc.options(&progress))
			if err != nil {
				errs[i] = err
				return
			}
			sums[i] = bench.Summarise(res, 0)
		}(i, j)
	}
	wg.Wait()
	stop()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	// Average per point, and the per-seed ratio to verl_default.
	base := map[uint64]bench.Summary{}
	for i, j := range jobs {
		if j.point < 0 {
			base[j.seed] = sums[i]
		}
	}
	fmt.Fprintf(stdout, "sensitivity of %s: workload %s, %d engines, seeds %s (means over seeds; ratios vs verl_default of the same seed)\n",
		"kvc_aware", c.workload, c.engines, c.sweepSeeds)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "alpha\tload_thr\ttiers\thit\tttft_p50\tttft_p99\tmakespan\tmakespan/verl\tp99/verl\timbal\t")
	vb := meanOf(seeds, func(s uint64) bench.Summary { return base[s] })
	fmt.Fprintf(tw, "verl_default\t\t\t%.1f%%\t%.3f\t%.3f\t%.1f\t1.000\t1.000\t%.3f\t\n", 100*vb.HitRate, vb.TTFTP50, vb.TTFTP99, vb.Makespan, vb.Imbalance)
	for pi, p := range points {
		var per []bench.Summary
		var mr, pr float64
		for i, j := range jobs {
			if j.point == pi {
				per = append(per, sums[i])
				b := base[j.seed]
				if b.Makespan > 0 {
					mr += sums[i].Makespan / b.Makespan
				}
				if b.TTFTP99 > 0 {
					pr += sums[i].TTFTP99 / b.TTFTP99
				}
			}
		}
		m := avg(per)
		n := float64(len(per))
		tl := p.tiers
		if tl == "" {
			tl = "default"
		}
		fmt.Fprintf(tw, "%.2f\t%.2f\t%s\t%.1f%%\t%.3f\t%.3f\t%.1f\t%.3f\t%.3f\t%.3f\t\n", p.alpha, p.threshold, tl,
			100*m.HitRate, m.TTFTP50, m.TTFTP99, m.Makespan, mr/n, pr/n, m.Imbalance)
	}
	return tw.Flush()
}

func meanOf(seeds []uint64, f func(uint64) bench.Summary) bench.Summary {
	var xs []bench.Summary
	for _, s := range seeds {
		xs = append(xs, f(s))
	}
	return avg(xs)
}

func avg(xs []bench.Summary) bench.Summary {
	var m bench.Summary
	if len(xs) == 0 {
		return m
	}
	for _, x := range xs {
		m.HitRate += x.HitRate
		m.TTFTP50 += x.TTFTP50
		m.TTFTP99 += x.TTFTP99
		m.Makespan += x.Makespan
		m.Imbalance += x.Imbalance
	}
	n := float64(len(xs))
	m.HitRate /= n
	m.TTFTP50 /= n
	m.TTFTP99 /= n
	m.Makespan /= n
	m.Imbalance /= n
	return m
}
