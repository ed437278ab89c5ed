package lengths

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

func TestKeyOf(t *testing.T) {
	a, b := KeyOf([]int32{1, 2, 3}), KeyOf([]int32{1, 2, 3})
	if a != b {
		t.Fatal("equal prompts must hash equal")
	}
	for _, other := range [][]int32{{1, 2}, {3, 2, 1}, {1, 2, 3, 0}, {1, 2, 4}, nil} {
		if KeyOf(other) == a {
			t.Fatalf("%v collides with [1 2 3]", other)
		}
	}
}

func TestPredict(t *testing.T) {
	near := func(got, want float64) bool { return math.Abs(got-want) < 1e-9 }
	tr := New(Config{Weight: 0.5})
	p, q := KeyOf([]int32{7}), KeyOf([]int32{8})
	cases := []struct {
		name string
		do   func()
		key  Key
		want Estimate
	}{
		{"nothing seen: unknown", func() {}, p, Estimate{}},
		{"siblings this step", func() { tr.Observe(p, 100); tr.Observe(p, 300) }, p, Estimate{Tokens: 200, Siblings: 2}},
		{"unseen prompt: the mean of all", func() {}, q, Estimate{Tokens: 200}},
		{"non-positive counts ignored", func() { tr.Observe(p, 0); tr.Observe(p, -5) }, p, Estimate{Tokens: 200, Siblings: 2}},
		{"next step: history", func() { tr.NextStep() }, p, Estimate{Tokens: 200, History: true}},
		{"history + a sibling, one step's weight each", func() { tr.Observe(p, 600) }, p, Estimate{Tokens: 400, History: true, Siblings: 1}},
		{"EWMA over steps (weight 0.5)", func() { tr.NextStep() }, p, Estimate{Tokens: 400, History: true}},
		{"third step", func() { tr.Observe(p, 1000); tr.NextStep() }, p, Estimate{Tokens: 700, History: true}},
	}
	for _, c := range cases {
		c.do()
		got := tr.Predict(c.key)
		if !near(got.Tokens, c.want.Tokens) || got.History != c.want.History || got.Siblings != c.want.Siblings {
			t.Fatalf("%s: got %+v, want %+v", c.name, got, c.want)
		}
		// Mean is what an unseen prompt predicts (admission's longest-first
		// order ranks the prompts it knows nothing of at it).
		if m, u := tr.Mean(), tr.Predict(KeyOf([]int32{99})); !near(m, u.Tokens) {
			t.Fatalf("%s: Mean %v, an unseen prompt predicts %v", c.name, m, u.Tokens)
		}
	}
	if want := (100.0 + 300 + 600 + 1000) / 4; !near(tr.Mean(), want) {
		t.Fatalf("Mean %v, want %v over every response", tr.Mean(), want)
	}
}

func TestBoundedMemory(t *testing.T) {
	tr := New(Config{MaxPrompts: 3})
	for i := int32(0); i < 5; i++ {
		tr.Observe(KeyOf([]int32{i}), 10)
	}
	if n, dropped := tr.Len(); n != 3 || dropped != 2 {
		t.Fatalf("len %d dropped %d, want 3 and 2", n, dropped)
	}
	if e := tr.Predict(KeyOf([]int32{0})); e.Siblings != 0 || e.History {
		t.Fatal("the least recently seen prompt must be the one dropped")
	}
	if e := tr.Predict(KeyOf([]int32{4})); e.Siblings != 1 {
		t.Fatal("the newest prompt must be kept")
	}
}

func TestConcurrent(t *testing.T) {
	tr := New(Config{})
	done := make(chan struct{})
	for g := 0; g < 4; g++ {
		go func(g int) {
			for i := 0; i < 1000; i++ {
				k := KeyOf([]int32{int32(i % 17)})
				tr.Observe(k, 1+i%50)
				tr.Predict(k)
				if i%100 == 0 {
					tr.NextStep()
				}
			}
			done <- struct{}{}
		}(g)
	}
	for g := 0; g < 4; g++ {
		<-done
	}
	if n, _ := tr.Len(); n != 17 {
		t.Fatalf("%d prompts, want 17", n)
	}
}

// Corr estimates the within-prompt correlation of log lengths from one
// step's finished responses: for latents sqrt(rho)*d_k + sqrt(1-rho)*e_kj
// (kvbench's length model) it lands near rho; a step without enough
// evidence keeps the last estimate.
func TestCorr(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for _, rho := range []float64{0, 0.5, 0.8} {
		tr := New(Config{})
		if _, ok := tr.Corr(); ok {
			t.Fatal("a fresh tracker claims a correlation")
		}
		for k := 0; k < 128; k++ {
			d := rng.NormFloat64()
			for j := 0; j < 16; j++ {
				z := math.Sqrt(rho)*d + math.Sqrt(1-rho)*rng.NormFloat64()
				tr.Observe(Key(k), max(1, int(math.Round(math.Exp(6+z)))))
			}
		}
		if _, ok := tr.Corr(); ok {
			t.Fatal("the correlation is known before the step ends")
		}
		tr.NextStep()
		got, ok := tr.Corr()
		if !ok || math.Abs(got-rho) > 0.08 {
			t.Fatalf("rho %v: estimated %v (ok %v)", rho, got, ok)
		}
		// Too little evidence (4 prompts): the estimate stands.
		for k := 0; k < 4; k++ {
			tr.Observe(Key(1000+k), 10)
			tr.Observe(Key(1000+k), 5000)
		}
		tr.NextStep()
		if again, ok := tr.Corr(); !ok || again != got {
			t.Fatalf("rho %v: a thin step moved the estimate to %v (ok %v)", rho, again, ok)
		}
	}
	// Siblings exactly alike, prompts apart: 1. Every length equal: no evidence.
	tr := New(Config{})
	for k := 0; k < 10; k++ {
		for j := 0; j < 4; j++ {
			tr.Observe(Key(k), 100*(k+1))
		}
	}
	tr.NextStep()
	if c, ok := tr.Corr(); !ok || math.Abs(c-1) > 1e-9 {
		t.Fatalf("alike siblings: %v %v", c, ok)
	}
	tr = New(Config{})
	for k := 0; k < 10; k++ {
		for j := 0; j < 4; j++ {
			tr.Observe(Key(k), 50)
		}
	}
	tr.NextStep()
	if _, ok := tr.Corr(); ok {
		t.Fatal("equal lengths everywhere gave a correlation")
	}
}

// iccRef is the one-way ANOVA intra-class correlation of groups of values,
// computed in two passes from its textbook definition (n0 for unequal
// group sizes), clamped to [0, 1].
func iccRef(groups [][]float64) float64 {
	var n, k, sum, n2 float64
	for _, g := range groups {
		for _, y := range g {
			sum += y
		}
		n += float64(len(g))
		n2 += float64(len(g) * len(g))
		k++
	}
	grand := sum / n
	var ssb, ssw float64
	for _, g := range groups {
		m := 0.0
		for _, y := range g {
			m += y
		}
		m /= float64(len(g))
		ssb += float64(len(g)) * (m - grand) * (m - grand)
		for _, y := range g {
			ssw += (y - m) * (y - m)
		}
	}
	msb, msw := ssb/(k-1), ssw/(n-k)
	n0 := (n - n2/n) / (k - 1)
	return min(1, max(0, (msb-msw)/(msb+(n0-1)*msw)))
}

// With groups of unequal sizes (prompts whose samples finished unevenly,
// singletons among them) the incremental estimate is the two-pass ANOVA
// estimator's, n0 correction included; the evidence floor counts
// within-prompt degrees of freedom, not responses.
func TestCorrUnequalGroups(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 5))
	for trial := 0; trial < 20; trial++ {
		tr := New(Config{})
		var groups [][]float64
		for k := 0; k < 12; k++ {
			d := rng.NormFloat64()
			size := []int{1, 2, 3, 16}[rng.IntN(4)]
			var g []float64
			for j := 0; j < size; j++ {
				n := max(1, int(math.Round(math.Exp(6+0.8*d+0.6*rng.NormFloat64()))))
				tr.Observe(Key(k), n)
				g = append(g, math.Log(float64(n)))
			}
			groups = append(groups, g)
		}
		within := 0
		for _, g := range groups {
			within += len(g) - 1
		}
		tr.NextStep()
		got, ok := tr.Corr()
		if within < minCorrWithin {
			if ok {
				t.Fatalf("trial %d: %d within-prompt degrees of freedom gave an estimate", trial, within)
			}
			continue
		}
		if want := iccRef(groups); !ok || math.Abs(got-want) > 1e-9 {
			t.Fatalf("trial %d: incremental %v (ok %v), two-pass %v", trial, got, ok, want)
		}
	}
	// Exactly at the floor: 8 prompts of 3 (16 within) count, of 2 (8) do not.
	for _, tc := range []struct {
		size int
		want bool
	}{{3, true}, {2, false}} {
		tr := New(Config{})
		for k := 0; k < 8; k++ {
			for j := 0; j < tc.size; j++ {
				tr.Observe(Key(k), 10*(k+1)+j)
			}
		}
		tr.NextStep()
		if _, ok := tr.Corr(); ok != tc.want {
			t.Fatalf("8 prompts of %d: known %v, want %v", tc.size, ok, tc.want)
		}
	}
}

// TestTasks: trajectories are summed over their turns and grouped by their
// first turn's prompt; the correlation is high when a task sets its
// trajectories' totals, near 0 when they are independent, unknown without
// 8 tasks and 16 trajectories beyond one per task, and kept through a step
// without evidence; the bound samples the step's first trajectories.
func TestTasks(t *testing.T) {
	cases := []struct {
		name      string
		tasks     int
		max       int
		turn      func(rng *rand.Rand, task int) int
		wantKnown bool
		want      func(c float64) bool
		dropped   uint64
	}{
		{"task sets the totals", 12, 1 << 10,
			func(rng *rand.Rand, task int) int {
				return int(float64(50*(1+task*task)) * math.Exp(0.1*rng.NormFloat64()))
			},
			true, func(c float64) bool { return c > 0.9 }, 0},
		{"independent trajectories", 64, 1 << 10,
			func(rng *rand.Rand, _ int) int { return int(200 * math.Exp(rng.NormFloat64())) },
			true, func(c float64) bool { return c < 0.25 }, 0},
		{"7 tasks: not enough evidence", 7, 1 << 10,
			func(rng *rand.Rand, task int) int { return 100 * (1 + task) },
			false, nil, 0},
		{"bound of 40: the first 10 tasks stand for 12", 12, 40,
			func(rng *rand.Rand, task int) int {
				return int(float64(50*(1+task*task)) * math.Exp(0.1*rng.NormFloat64()))
			},
			true, func(c float64) bool { return c > 0.9 }, 24}, // 8 trajectories x 3 turns
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(5, 6))
			tr := NewTasks(tc.max)
			for task := 0; task < tc.tasks; task++ {
				key := KeyOf([]int32{int32(task)})
				for j := 0; j < 4; j++ {
					id := fmt.Sprintf("t%d-%d", task, j)
					for turn := 0; turn < 3; turn++ {
						// Later turns' prompts hash differently: the first names the task.
						tr.Start(id, key+Key(turn))
						tr.Add(id, tc.turn(rng, task))
					}
				}
			}
			tr.Add("never-started", 1000)
			tr.NextStep()
			c, ok := tr.Corr()
			if ok != tc.wantKnown || (ok && !tc.want(c)) {
				t.Fatalf("corr %v known %v, want known %v", c, ok, tc.wantKnown)
			}
			if tr.DroppedTurns() != tc.dropped {
				t.Fatalf("dropped %d turns, want %d", tr.DroppedTurns(), tc.dropped)
			}
			// A step with nothing finished keeps the last figure.
			tr.Start("idle", 1)
			tr.NextStep()
			if c2, ok2 := tr.Corr(); c2 != c || ok2 != ok {
				t.Fatalf("an empty step changed corr %v/%v to %v/%v", c, ok, c2, ok2)
			}
		})
	}
}

// TestTasksProperties: for random steps the figure is in [0, 1], is
// bit-identical for the same sequence of turns (runs reproduce), and does not
// depend, beyond rounding, on the order trajectories started in.
func TestTasksProperties(t *testing.T) {
	type turn struct {
		id     string
		task   Key
		tokens int
	}
	for seed := uint64(0); seed < 50; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		var turns []turn
		tasks, per := 8+rng.IntN(40), 2+rng.IntN(6)
		rho := rng.Float64()
		for k := 0; k < tasks; k++ {
			d := rng.NormFloat64()
			for j := 0; j < per; j++ {
				id := fmt.Sprintf("t%d-%d", k, j)
				for n := 0; n < 1+rng.IntN(4); n++ {
					y := math.Sqrt(rho)*d + math.Sqrt(1-rho)*rng.NormFloat64()
					turns = append(turns, turn{id, Key(k), 1 + int(300*math.Exp(y))})
				}
			}
		}
		run := func(ts []turn) (float64, bool) {
			tr := NewTasks(1 << 20)
			for _, x := range ts {
				tr.Start(x.id, x.task)
				tr.Add(x.id, x.tokens)
			}
			tr.NextStep()
			return tr.Corr()
		}
		c1, ok1 := run(turns)
		c2, ok2 := run(turns)
		if !ok1 || c1 != c2 || ok1 != ok2 || c1 < 0 || c1 > 1 {
			t.Fatalf("seed %d: corr %v/%v then %v/%v", seed, c1, ok1, c2, ok2)
		}
		// Trajectories started in another order (each one's turns kept in order).
		byID := map[string][]turn{}
		var ids []string
		for _, x := range turns {
			if _, ok := byID[x.id]; !ok {
				ids = append(ids, x.id)
			}
			byID[x.id] = append(byID[x.id], x)
		}
		rng.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		var shuffled []turn
		for _, id := range ids {
			shuffled = append(shuffled, byID[id]...)
		}
		if c3, _ := run(shuffled); math.Abs(c3-c1) > 1e-9 {
			t.Fatalf("seed %d: corr %v in start order, %v shuffled", seed, c1, c3)
		}
	}
}

// StepCorr reads this step's responses so far, behind its own evidence bar,
// and forgets them at the step boundary (Corr then holds the step's figure).
func TestStepCorr(t *testing.T) {
	tr := New(Config{})
	if _, ok := tr.StepCorr(1, 1); ok {
		t.Fatal("a correlation with no responses")
	}
	for i := 0; i < 10; i++ {
		for j := 0; j < 3; j++ {
			tr.Observe(KeyOf([]int32{int32(i)}), 10*(i+1)+j)
		}
	}
	if n := tr.StepResponses(); n != 30 {
		t.Fatalf("StepResponses %d, want 30", n)
	}
	if _, ok := tr.StepCorr(11, 1); ok {
		t.Fatal("10 prompts passed a bar of 11")
	}
	if _, ok := tr.StepCorr(10, 21); ok {
		t.Fatal("20 within-prompt responses passed a bar of 21")
	}
	c, ok := tr.StepCorr(10, 20)
	if !ok || c < 0.9 {
		t.Fatalf("StepCorr %v %v, want a strong correlation", c, ok)
	}
	tr.NextStep()
	if got, known := tr.Corr(); !known || got != c {
		t.Fatalf("Corr after the step %v %v, want %v", got, known, c)
	}
	if _, ok := tr.StepCorr(1, 1); ok || tr.StepResponses() != 0 {
		t.Fatal("the finished step's responses still counted")
	}
}
