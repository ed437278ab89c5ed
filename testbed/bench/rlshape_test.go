package bench

import (
	"flag"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"

	json "github.com/goccy/go-json"
)

func shapedGRPO(seed uint64, sh Shape, steps, prompts, n int) *GRPO {
	g := DefaultGRPOSat()
	g.Seed, g.Steps, g.Prompts, g.N, g.SystemTokens = seed, steps, prompts, n, 16
	g.Prompt = LogNormal{Median: 64, Sigma: 0.3, Min: 16, Max: 256}
	g.Shape = &sh
	return NewGRPO(g)
}

func lengths(items []*Item) []int {
	out := make([]int, len(items))
	for i, it := range items {
		out[i] = it.MaxTokens
	}
	return out
}

// withinCorr is the within-group (intraclass) correlation of log length:
// the share of log-length variance between groups' means, corrected for
// the noise a finite group's mean keeps.
func withinCorr(items []*Item, n int) float64 {
	var all []float64
	var means []float64
	for g := 0; g+n <= len(items); g += n {
		m := 0.0
		for _, it := range items[g : g+n] {
			v := math.Log(float64(it.MaxTokens))
			all = append(all, v)
			m += v
		}
		means = append(means, m/float64(n))
	}
	mu, tot := 0.0, 0.0
	for _, v := range all {
		mu += v
	}
	mu /= float64(len(all))
	for _, v := range all {
		tot += (v - mu) * (v - mu)
	}
	tot /= float64(len(all))
	between := 0.0
	for _, m := range means {
		between += (m - mu) * (m - mu)
	}
	between /= float64(len(means))
	// E[between] = ρ·tot + (1−ρ)·tot/n.
	return (between - tot/float64(n)) / (tot * (1 - 1/float64(n)))
}

func TestShapeSameMultisetAnySeedAnyRho(t *testing.T) {
	var want []int
	for _, seed := range []uint64{1, 2, 3} {
		for _, rho := range []float64{0, 0.5, 0.8} {
			got := lengths(shapedGRPO(seed, Shape{LengthCorr: rho, EpochCorr: 0.8}, 1, 64, 16).Start(0, 0))
			slices.Sort(got)
			if want == nil {
				want = got
				continue
			}
			if !slices.Equal(got, want) {
				t.Fatalf("seed %d rho %v: the step's multiset of lengths changed", seed, rho)
			}
		}
	}
	// The stratified multiset follows the marginal: its median is the
	// distribution's median.
	m := DefaultGRPOSat().Response
	if med := want[len(want)/2]; math.Abs(float64(med)-m.Median)/m.Median > 0.01 {
		t.Fatalf("median length %d, want about %v", med, m.Median)
	}
}

func TestShapeWithinGroupCorrelation(t *testing.T) {
	for _, rho := range []float64{0, 0.5, 0.8} {
		var got []float64
		for seed := uint64(1); seed <= 4; seed++ {
			got = append(got, withinCorr(shapedGRPO(seed, Shape{LengthCorr: rho}, 1, 256, 16).Start(0, 0), 16))
		}
		mean := 0.0
		for _, v := range got {
			mean += v / float64(len(got))
		}
		if math.Abs(mean-rho) > 0.06 {
			t.Fatalf("rho %v: measured within-group correlation %.3f (%v)", rho, mean, got)
		}
	}
}

func TestShapeTruncationShare(t *testing.T) {
	items := shapedGRPO(5, Shape{LengthCorr: 0.8, Truncate: 0.05}, 1, 128, 16).Start(0, 0)
	max := DefaultGRPOSat().Response.Max
	at := 0
	for _, it := range items {
		if it.MaxTokens == max {
			at++
		}
	}
	share := float64(at) / float64(len(items))
	if share < 0.05-1.0/float64(len(items)) || share > 0.055 {
		t.Fatalf("%.4f of responses at max_tokens, want 0.05 (+ the lognormal's own tail above the max)", share)
	}
	// Truncation clusters in hard prompts: fewer groups hold them than
	// independent draws would spread them over.
	groups := map[int]bool{}
	for _, it := range items {
		if it.MaxTokens == max {
			groups[it.Group] = true
		}
	}
	if len(groups) > at/2 {
		t.Fatalf("%d truncated responses over %d groups: no clustering at rho 0.8", at, len(groups))
	}
}

func TestShapeRecurringPrompts(t *testing.T) {
	const b, n = 32, 64
	g := shapedGRPO(7, Shape{LengthCorr: 0.6, DatasetPrompts: n, EpochCorr: 0.8}, 6, b, 4)
	seen := map[int]int{}
	prompts := map[int][]int32{}
	for p := 0; p < 6; p++ {
		items := g.Start(p, 0)
		wantEpoch := p / (n / b)
		for i, it := range items {
			if it.Epoch != wantEpoch {
				t.Fatalf("step %d: epoch %d, want %d", p, it.Epoch, wantEpoch)
			}
			if i%4 == 0 {
				seen[it.Group]++
			} else if it.Group != items[i-1].Group || !slices.Equal(it.prompt, items[i-1].prompt) {
				t.Fatal("a prompt's samples must be consecutive and share the prompt")
			}
			if prev, ok := prompts[it.Group]; ok && !slices.Equal(prev, it.prompt) {
				t.Fatalf("prompt %d changed text between epochs", it.Group)
			}
			prompts[it.Group] = it.prompt
		}
	}
	if len(seen) != n {
		t.Fatalf("%d distinct prompts over 3 epochs, want the dataset's %d", len(seen), n)
	}
	for k, c := range seen {
		if c != 3 {
			t.Fatalf("prompt %d seen %d times in 3 epochs, want once per epoch", k, c)
		}
	}
	// Difficulty correlation between consecutive epochs ≈ EpochCorr.
	ds := newDataset(11, Shape{DatasetPrompts: 4000, EpochCorr: 0.8}, 100)
	var sxy, sxx, syy float64
	for k := 0; k < 4000; k++ {
		x, y := ds.difficulty(k, 2), ds.difficulty(k, 3)
		sxy, sxx, syy = sxy+x*y, sxx+x*x, syy+y*y
	}
	if r := sxy / math.Sqrt(sxx*syy); math.Abs(r-0.8) > 0.03 {
		t.Fatalf("epoch-to-epoch difficulty correlation %.3f, want 0.8", r)
	}
}

func TestShapeValidate(t *testing.T) {
	for _, bad := range []Shape{{LengthCorr: -0.1}, {LengthCorr: 1.1}, {EpochCorr: 2}, {Truncate: 1}, {DatasetPrompts: -1}, {DatasetPrompts: 10}} {
		if bad.Validate(16) == nil {
			t.Fatalf("%+v accepted", bad)
		}
	}
	if err := (Shape{LengthCorr: 1, EpochCorr: 1, Truncate: 0.1, DatasetPrompts: 16}).Validate(16); err != nil {
		t.Fatal(err)
	}
}

func TestShapedAgentDifficulty(t *testing.T) {
	a := DefaultAgent()
	a.Seed, a.Tasks, a.Group, a.MinTurns, a.MaxTurns = 3, 64, 4, 2, 12
	a.Shape = &Shape{LengthCorr: 0.8, EpochCorr: 0.8}
	a.ToolPareto = &DefaultToolLatency
	ag := NewAgent(a)
	items := ag.Start(0, 0)
	// Trajectories of one task have similar turn counts: the spread of
	// turn counts inside a task is well below the spread overall.
	var within, total float64
	var all []float64
	for i := 0; i < len(items); i += a.Group {
		m := 0.0
		for _, it := range items[i : i+a.Group] {
			m += float64(ag.trajs[it.traj].turns)
		}
		m /= float64(a.Group)
		for _, it := range items[i : i+a.Group] {
			v := float64(ag.trajs[it.traj].turns)
			within += (v - m) * (v - m)
			all = append(all, v)
		}
	}
	mu := 0.0
	for _, v := range all {
		mu += v / float64(len(all))
	}
	for _, v := range all {
		total += (v - mu) * (v - mu)
	}
	if within > 0.5*total {
		t.Fatalf("turn counts: within-task variance %.1f of total %.1f, no task difficulty", within, total)
	}
	// Hard tasks (more turns) also have longer turns.
	var xs, ys []float64
	var lats []float64
	for _, it := range items {
		tr := ag.trajs[it.traj]
		s := 0.0
		for _, r := range tr.resp {
			s += math.Log(float64(r))
		}
		xs, ys = append(xs, float64(tr.turns)), append(ys, s/float64(tr.turns))
		lats = append(lats, tr.lat...)
	}
	if c := pearson(xs, ys); c < 0.3 {
		t.Fatalf("turn count vs mean log turn length correlation %.2f, want clearly positive", c)
	}
	sort.Float64s(lats)
	if lats[0] < 1 || lats[len(lats)-1] > 60 || lats[len(lats)/2] > 4 || lats[len(lats)*99/100] < 20 {
		t.Fatalf("tool latency: min %.2f median %.2f p99 %.2f max %.2f, want 1-60 s heavy-tailed",
			lats[0], lats[len(lats)/2], lats[len(lats)*99/100], lats[len(lats)-1])
	}
}

func pearson(x, y []float64) float64 {
	var mx, my float64
	for i := range x {
		mx += x[i] / float64(len(x))
		my += y[i] / float64(len(y))
	}
	var sxy, sxx, syy float64
	for i := range x {
		sxy += (x[i] - mx) * (y[i] - my)
		sxx += (x[i] - mx) * (x[i] - mx)
		syy += (y[i] - my) * (y[i] - my)
	}
	return sxy / math.Sqrt(sxx*syy)
}

func TestVerlArrivals(t *testing.T) {
	items := shapedGRPO(1, Shape{}, 1, 16, 4).Start(0, 10)
	VerlArrivals(items, 10, 1000, 8)
	// 64 requests, 8 workers of 8: worker w's i-th at 10 + (8i + w)/1000.
	for j, it := range items {
		w, i := j/8, j%8
		if want := 10 + float64(i*8+w)/1000; math.Abs(it.At-want) > 1e-12 {
			t.Fatalf("item %d at %v, want %v", j, it.At, want)
		}
	}
	// Within a worker's chunk a prompt's samples arrive back to back (in
	// that worker's stream) and the whole batch takes n/rate seconds.
	last := 0.0
	for _, it := range items {
		last = math.Max(last, it.At)
	}
	if math.Abs(last-(10+63.0/1000)) > 1e-12 {
		t.Fatalf("last arrival %v", last)
	}
}

var updateGolden = flag.Bool("update-golden", false, "rewrite testdata/rlshape_golden.json")

// TestShapeGolden pins the model's deterministic parts (the quantile
// functions) in testdata/rlshape_golden.json, which the arena's Python
// implementation is tested against, so both benches draw the same model.
func TestShapeGolden(t *testing.T) {
	type row struct {
		Q        float64 `json:"q"`
		Response int     `json:"response"`
		Trunc    int     `json:"response_trunc_0_1"`
		Tool     float64 `json:"tool_latency_s"`
		Turns    int     `json:"turns_4_12"`
	}
	resp := LogNormal{Median: 192, Sigma: 0.9, Min: 1, Max: 2048}
	var rows []row
	for i := 0; i < 40; i++ {
		q := (float64(i) + 0.5) / 40
		rows = append(rows, row{Q: q, Response: resp.Quantile(q, 0), Trunc: resp.Quantile(q, 0.1),
			Tool: math.Round(DefaultToolLatency.Quantile(q)*1e9) / 1e9, Turns: 4 + min(8, int(q*9))})
	}
	doc := map[string]any{"response": resp, "tool_latency": DefaultToolLatency, "rows": rows}
	b, err := json.MarshalIndent(doc, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", "rlshape_golden.json")
	if *updateGolden {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -run TestShapeGolden -update-golden)", err)
	}
	if string(want) != string(append(b, '\n')) {
		t.Fatal("the shape's quantile functions changed: update the golden file and the arena's workloads.py together")
	}
}
