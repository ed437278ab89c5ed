package bench

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
)

// Shape is the length structure of real RL rollouts (issue 26; the
// project reference routing-anchors.md §17): responses to one prompt have
// similar lengths (Seer), a prompt returns every epoch with a length close
// to last time's (RhymeRL), and a share of responses run into max_tokens.
// The grpo and agent workloads take it; the arena's Python workloads
// (testbed/kvc_harness/workloads.py) implement the same model, checked
// against testdata/rlshape_golden.json.
//
// The model. Each prompt k has a difficulty d_k ~ N(0,1). Sample j of
// prompt k has the latent x_kj = √ρ·d_k + √(1−ρ)·e_kj (e_kj ~ N(0,1)), so
// x is N(0,1) whatever ρ and the within-group correlation of x is ρ. A
// step's latents are ranked and the i-th smallest gets the response
// distribution's quantile at (i + 0.5)/n: every seed and every ρ deal the
// same multiset of lengths (the stratified draw), and correlation only
// changes which sample gets which length: at ρ > 0 the long ones cluster
// in a few prompts' groups, which is what makes a group a straggler.
// Quantiles above 1 − Truncate are max_tokens (responses cut off there).
//
// Recurring prompts: with DatasetPrompts N > 0 a step takes its B prompts
// from a dataset of N iterated in shuffled epochs (verl's dataloader,
// drop_last), so a prompt returns every N/B steps; its difficulty follows
// d_{k,e+1} = r·d_{k,e} + √(1−r²)·ξ with r = EpochCorr. N = 0 keeps fresh
// prompts every step.
type Shape struct {
	// LengthCorr is ρ, the within-group correlation of log length.
	LengthCorr float64 `json:"length_corr"`
	// Truncate is the share of responses that reach max_tokens.
	Truncate float64 `json:"truncate,omitempty"`
	// DatasetPrompts is the dataset size N (0 = fresh prompts).
	DatasetPrompts int `json:"dataset_prompts,omitempty"`
	// EpochCorr is r, the correlation of a prompt's difficulty between
	// consecutive epochs.
	EpochCorr float64 `json:"epoch_corr"`
}

// DefaultEpochCorr is --epoch-corr's default.
const DefaultEpochCorr = 0.8

// Validate reports an impossible shape; batch is prompts (tasks) a step.
func (s Shape) Validate(batch int) error {
	var errs []error
	if s.LengthCorr < 0 || s.LengthCorr > 1 || math.IsNaN(s.LengthCorr) {
		errs = append(errs, fmt.Errorf("length correlation %v outside [0, 1]", s.LengthCorr))
	}
	if s.EpochCorr < 0 || s.EpochCorr > 1 || math.IsNaN(s.EpochCorr) {
		errs = append(errs, fmt.Errorf("epoch correlation %v outside [0, 1]", s.EpochCorr))
	}
	if s.Truncate < 0 || s.Truncate >= 1 || math.IsNaN(s.Truncate) {
		errs = append(errs, fmt.Errorf("truncation share %v outside [0, 1)", s.Truncate))
	}
	if s.DatasetPrompts < 0 {
		errs = append(errs, fmt.Errorf("dataset prompts %d < 0", s.DatasetPrompts))
	} else if s.DatasetPrompts > 0 && s.DatasetPrompts < batch {
		errs = append(errs, fmt.Errorf("dataset of %d prompts is smaller than a step's %d", s.DatasetPrompts, batch))
	}
	return errors.Join(errs...)
}

// NormQuantile is the standard normal's inverse CDF.
func NormQuantile(q float64) float64 { return math.Sqrt2 * math.Erfinv(2*q-1) }

// NormCDF is the standard normal CDF.
func NormCDF(x float64) float64 { return 0.5 * math.Erfc(-x/math.Sqrt2) }

// Quantile is the length at quantile q in (0, 1) with a truncation share:
// q > 1 − trunc gives Max (when Max is set).
func (d LogNormal) Quantile(q, trunc float64) int {
	if d.Max > 0 && trunc > 0 && q > 1-trunc {
		return d.Max
	}
	n := int(math.Round(d.Median * math.Exp(d.Sigma*NormQuantile(q))))
	if d.Min > 0 && n < d.Min {
		n = d.Min
	}
	if n < 1 {
		n = 1
	}
	if d.Max > 0 && n > d.Max {
		n = d.Max
	}
	return n
}

// RankQuantiles gives the element of rank i (by latent, ascending; ties by
// index) the value quantile((i + 0.5) / n): a stratified draw whose
// multiset depends only on n, assigned by the latents' order.
func RankQuantiles(latent []float64, quantile func(float64) int) []int {
	n := len(latent)
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return latent[idx[a]] < latent[idx[b]] })
	out := make([]int, n)
	for rank, i := range idx {
		out[i] = quantile((float64(rank) + 0.5) / float64(n))
	}
	return out
}

// Correlated returns √ρ·d + √(1−ρ)·e with e ~ N(0,1) from rng.
func Correlated(rng *rand.Rand, d, rho float64) float64 {
	return math.Sqrt(rho)*d + math.Sqrt(1-rho)*rng.NormFloat64()
}

// dataset iterates prompts (or tasks) as verl's dataloader does, and
// keeps each one's difficulty per epoch.
type dataset struct {
	seed  uint64
	n     int // 0 = fresh prompts
	batch int
	corr  float64
	perms map[int][]int
}

func newDataset(seed uint64, s Shape, batch int) *dataset {
	return &dataset{seed: seed, n: s.DatasetPrompts, batch: batch, corr: s.EpochCorr, perms: map[int][]int{}}
}

// step returns step p's prompt ids and epoch.
func (ds *dataset) step(p int) (ids []int, epoch int) {
	ids = make([]int, ds.batch)
	if ds.n == 0 {
		for b := range ids {
			ids[b] = p*ds.batch + b
		}
		return ids, 0
	}
	spe := ds.n / ds.batch // drop_last: a partial batch at an epoch's end is skipped
	epoch = p / spe
	perm, ok := ds.perms[epoch]
	if !ok {
		perm = rand.New(rand.NewPCG(ds.seed, 0x65706f6368<<8|uint64(epoch))).Perm(ds.n)
		ds.perms[epoch] = perm
	}
	copy(ids, perm[(p%spe)*ds.batch:])
	return ids, epoch
}

// difficulty is prompt k's difficulty in epoch e: an AR(1) chain over
// epochs from N(0,1), so it is N(0,1) in every epoch.
func (ds *dataset) difficulty(k, e int) float64 {
	rng := rand.New(rand.NewPCG(ds.seed^0x646966666963, uint64(k)))
	d := rng.NormFloat64()
	r := ds.corr
	for i := 1; i <= e; i++ {
		d = r*d + math.Sqrt(1-r*r)*rng.NormFloat64()
	}
	return d
}

// promptRNG seeds prompt k's text: the same prompt every epoch.
func promptRNG(seed uint64, k int) *rand.Rand {
	return rand.New(rand.NewPCG(seed^0x70726f6d7074, uint64(k)))
}

// BoundedPareto is a heavy-tailed duration on [Min, Max] seconds with tail
// index Alpha (sandboxed tools: most calls take a second or two, a few
// most of a minute).
type BoundedPareto struct {
	Min   float64 `json:"min_s"`
	Max   float64 `json:"max_s"`
	Alpha float64 `json:"alpha"`
}

// DefaultToolLatency: 1–60 s, tail index 0.8 (median 2.3 s, p90 12 s,
// p99 45 s).
var DefaultToolLatency = BoundedPareto{Min: 1, Max: 60, Alpha: 0.8}

// Quantile is the duration at quantile q.
func (b BoundedPareto) Quantile(q float64) float64 {
	k := 1 - math.Pow(b.Min/b.Max, b.Alpha)
	return b.Min * math.Pow(1-q*k, -1/b.Alpha)
}

// Stratified returns the n quantiles at (i + 0.5)/n, shuffled by rng.
func stratified(rng *rand.Rand, n int, quantile func(float64) float64) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = quantile((float64(i) + 0.5) / float64(n))
	}
	rng.Shuffle(n, func(a, b int) { out[a], out[b] = out[b], out[a] })
	return out
}

// shapedStart is GRPO.Start with the RL length structure: the B prompts of
// step p from the dataset, each prompt's n samples consecutive (verl
// repeats a batch with interleave=True), lengths by RankQuantiles.
func (g *GRPO) shapedStart(p int, start float64) []*Item {
	sh := g.cfg.Shape
	ids, epoch := g.ds.step(p)
	rng := rand.New(rand.NewPCG(g.cfg.Seed, 0x6c656e<<16|uint64(p)))
	lat := make([]float64, 0, len(ids)*g.cfg.N)
	for _, k := range ids {
		d := g.ds.difficulty(k, epoch)
		for s := 0; s < g.cfg.N; s++ {
			lat = append(lat, Correlated(rng, d, sh.LengthCorr))
		}
	}
	lens := RankQuantiles(lat, func(q float64) int { return g.cfg.Response.Quantile(q, sh.Truncate) })
	out := make([]*Item, 0, len(lat))
	for b, k := range ids {
		prng := promptRNG(g.cfg.Seed, k)
		body := randTokens(prng, g.cfg.Prompt.Draw(prng), g.cfg.Vocab)
		prompt := append(append(make([]int32, 0, len(g.system)+len(body)), g.system...), body...)
		for s := 0; s < g.cfg.N; s++ {
			id := fmt.Sprintf("st%d-p%d-s%d", p, b, s)
			out = append(out, &Item{Key: id, ID: id, At: start, Phase: p, MaxTokens: lens[len(out)],
				Seed: uint64(p)<<32 | uint64(b)<<12 | uint64(s), prompt: prompt, seq: len(out), Group: k, Epoch: epoch})
		}
	}
	return out
}

// shapedStart is Agent.Start with task difficulty: a task's difficulty d
// enters both its trajectories' turn-count latents and every turn's length
// latent (each √ρ·d + √(1−ρ)·noise), so hard tasks run more and longer
// turns. Turn counts, turn lengths, tool outputs and tool latencies are
// each a stratified draw over the step (the same multiset every seed; the
// number of turns, hence of turn lengths, is fixed by the turn-count
// multiset). Nothing equalises trajectories: their total work differs.
func (a *Agent) shapedStart(p int, start float64) []*Item {
	sh := a.cfg.Shape
	ids, epoch := a.ds.step(p)
	rng := rand.New(rand.NewPCG(a.cfg.Seed, 0x6167656e74<<8|uint64(p)))
	nt := len(ids) * a.cfg.Group
	diff := make([]float64, nt)
	tlat := make([]float64, nt)
	for i := range diff {
		diff[i] = a.ds.difficulty(ids[i/a.cfg.Group], epoch)
		tlat[i] = Correlated(rng, diff[i], sh.LengthCorr)
	}
	span := a.cfg.MaxTurns - a.cfg.MinTurns + 1
	turns := RankQuantiles(tlat, func(q float64) int { return a.cfg.MinTurns + min(span-1, int(q*float64(span))) })
	total := 0
	for _, t := range turns {
		total += t
	}
	rlat := make([]float64, 0, total)
	for i, t := range turns {
		for k := 0; k < t; k++ {
			rlat = append(rlat, Correlated(rng, diff[i], sh.LengthCorr))
		}
	}
	resp := RankQuantiles(rlat, func(q float64) int { return a.cfg.Response.Quantile(q, sh.Truncate) })
	tools := stratified(rng, total, func(q float64) float64 { return float64(a.cfg.Tool.Quantile(q, 0)) })
	var lats []float64
	if a.cfg.ToolPareto != nil {
		lats = stratified(rng, total, a.cfg.ToolPareto.Quantile)
	} else {
		lats = stratified(rng, total, func(q float64) float64 {
			return a.cfg.ToolLatencyMedian * math.Exp(a.cfg.ToolLatencySigma*NormQuantile(q))
		})
	}
	var out []*Item
	j := 0
	for ti, k := range ids {
		prng := promptRNG(a.cfg.Seed, k)
		body := randTokens(prng, a.cfg.Task.Draw(prng), a.cfg.Vocab)
		prompt := append(append(make([]int32, 0, len(a.system)+len(body)), a.system...), body...)
		for g := 0; g < a.cfg.Group; g++ {
			i := ti*a.cfg.Group + g
			idx := p*1_000_000 + ti*1000 + g
			tr := &agentTraj{key: fmt.Sprintf("st%d-t%d-g%d", p, ti, g), phase: p, turns: turns[i]}
			for t := 0; t < turns[i]; t++ {
				tr.resp = append(tr.resp, resp[j])
				tr.tool = append(tr.tool, randTokens(rng, int(tools[j]), a.cfg.Vocab))
				tr.lat = append(tr.lat, lats[j])
				j++
			}
			a.trajs[idx] = tr
			out = append(out, &Item{Key: tr.key, ID: tr.key + "-0", At: start, Phase: p, MaxTokens: tr.resp[0],
				Seed: uint64(idx), prompt: prompt, traj: idx, turn: 0, seq: len(out), chained: true, Group: k, Epoch: epoch})
		}
	}
	return out
}

// DefaultClientRate is the acquire rate verl 0.9.1's own client path
// sustains through its balancer actor: 867–1,012 acquire/release pairs/s
// measured here (docs/performance.md, `make actor-bench`).
const DefaultClientRate = 1000

// DefaultClientWorkers is verl's default number of agent-loop workers.
const DefaultClientWorkers = 8

// VerlArrivals sets the arrival times of a phase's initial items (in batch
// order: a prompt's samples consecutive) as verl submits them: the batch is
// split into `workers` contiguous chunks, one per agent-loop worker; each
// worker starts its chunk's requests in order and the balancer actor
// serves the workers' calls interleaved, `rate` acquires a second in all.
// Item i of worker w's chunk arrives at start + (i·workers + w)/rate.
func VerlArrivals(items []*Item, start, rate float64, workers int) {
	if workers <= 0 {
		workers = DefaultClientWorkers
	}
	n := len(items)
	chunk := (n + workers - 1) / workers
	if chunk == 0 {
		return
	}
	for j, it := range items {
		w, i := j/chunk, j%chunk
		it.At = start + float64(i*workers+w)/rate
	}
}
