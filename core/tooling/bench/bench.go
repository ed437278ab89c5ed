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
	results := make([]*Result, len(pols))
	errs := make([]error, len(pols))
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
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
	for _, err := range errs {
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
		out[s.Policies[i]] = r
	}
	return rep, out, nil
}
