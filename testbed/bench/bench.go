package bench

import (
	"fmt"
	"sync"
)

// Suite runs several policies over one workload and computes the bounds.
type Suite struct {
	// NewWorkload builds a fresh workload per run (workloads keep state).
	NewWorkload func() Workload
	Policies    []string
	PolicyOpts  PolicyOptions
	Opts        Options
	// Parallel bounds concurrent policy runs (default 1).
	Parallel int
	// MakespanBound adds one run of verl_default on engines whose prefill
	// is free (every prompt as if fully cached) and reports each policy's
	// share of the makespan gain over verl_default that it captures.
	MakespanBound bool
}

// prefillFree is the per-token prefill cost of the bound's engines: small
// enough to be nothing, not 0 (0 selects the sim default).
const prefillFree = 1e-12

// GainShare is the share of the achievable makespan gain over base that
// got captures: (base − got)/(base − bound); 0 when there is no gain to
// capture.
func GainShare(base, got, bound float64) float64 {
	if base-bound <= 0 {
		return 0
	}
	return (base - got) / (base - bound)
}

// Run executes the suite. The first policy's run records the block chains
// from which the bounds are computed (the bounds depend only on the
// workload: every engine shares one sampling seed, so generated tokens do
// not depend on routing).
func (s *Suite) Run() (*Report, map[string]*Result, error) {
	if len(s.Policies) == 0 {
		return nil, nil, fmt.Errorf("bench: no policies")
	}
	pols := make([]Policy, len(s.Policies))
	for i, n := range s.Policies {
		p, err := NewPolicy(n, s.PolicyOpts)
		if err != nil {
			return nil, nil, err
		}
		pols[i] = p
	}
	par := s.Parallel
	if par <= 0 {
		par = 1
	}
	var boundRes *Result
	var boundErr error
	results := make([]*Result, len(pols))
	errs := make([]error, len(pols))
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	if s.MakespanBound {
		bp, err := NewPolicy("verl_default", s.PolicyOpts)
		if err != nil {
			return nil, nil, err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			o := s.Opts
			o.Record, o.Progress = false, nil
			o.Engines.PrefillPerToken = prefillFree
			boundRes, boundErr = Run(s.NewWorkload(), bp, o)
		}()
	}
	for i := range pols {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			o := s.Opts
			o.Record = i == 0
			results[i], errs[i] = Run(s.NewWorkload(), pols[i], o)
		}(i)
	}
	wg.Wait()
	for _, err := range append(errs, boundErr) {
		if err != nil {
			return nil, nil, err
		}
	}
	bs := s.Opts.Engines.BlockSize
	if bs <= 0 {
		bs = 16
	}
	gpu := s.Opts.Engines.GPUBlocks
	if gpu <= 0 {
		gpu = 8192
	}
	pooledBlocks := gpu * s.Opts.Engines.Engines
	recs := results[0].Records
	rep := &Report{Policies: map[string]Summary{}, Order: s.Policies,
		Bounds: Bounds{Oracle: Oracle(recs, bs), Pooled: PooledLRU(recs, bs, pooledBlocks), PooledBlocks: pooledBlocks}}
	es := s.Opts.Engines
	lbCfg, err := es.SimConfig()
	if err != nil {
		return nil, nil, err
	}
	lbCfg.BlockSize, lbCfg.NumGPUBlocks = bs, gpu
	lb, lbSteps := LowerBound(recs, lbCfg, es.Engines)
	rep.Bounds.MakespanLower, rep.Bounds.MakespanLowerSteps = lb, lbSteps
	if boundRes != nil {
		b := Summarise(boundRes, 0)
		rep.Bounds.MakespanFree = &b.Makespan
		rep.Bounds.MakespanFreeSteps = boundRes.Makespans
	}
	wl := s.NewWorkload()
	rep.Workload = wl.Name()
	if m, ok := wl.(*Mooncake); ok {
		v := m.TraceOracle()
		rep.Bounds.OracleTrace = &v
	}
	out := map[string]*Result{}
	for i, r := range results {
		r.Records = nil
		rep.Policies[s.Policies[i]] = Summarise(r, rep.Bounds.Pooled)
		if rep.MakespanSteps == nil {
			rep.MakespanSteps = map[string][]float64{}
		}
		rep.MakespanSteps[s.Policies[i]] = append([]float64(nil), r.Makespans...)
		out[s.Policies[i]] = r
	}
	if base, ok := rep.Policies["verl_default"]; ok {
		for n, sm := range rep.Policies {
			if rep.Bounds.MakespanFree != nil {
				g := GainShare(base.Makespan, sm.Makespan, *rep.Bounds.MakespanFree)
				sm.GainShare = &g
			}
			if lb > 0 {
				g := GainShare(base.Makespan, sm.Makespan, lb)
				sm.BoundShare = &g
			}
			rep.Policies[n] = sm
		}
	}
	return rep, out, nil
}
