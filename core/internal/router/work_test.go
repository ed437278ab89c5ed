package router

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	json "github.com/goccy/go-json"

	"github.com/kvc-router/kvc-router/core/internal/load"
)

// workConfig is a two-server kvc_aware router learning lengths, scoring
// with work_weight w and none of the spread terms (so placement reads load
// alone).
func workConfig(w float64) Config {
	p, _ := json.Marshal(map[string]any{"work_weight": w, "group_spread": 0, "task_spread": 0,
		"session_weight": 0, "kv_tokens": 10000})
	return Config{Mode: ModeKVCAware, Model: "m", Lengths: LengthsSpec{Enabled: true},
		Strategies: []StrategySpec{{Name: "kvc_aware", Weight: 1, Params: p}}}
}

// teach runs one request of each prompt to completion with its output
// count, then starts a new step (a weight sync).
func teach(t *testing.T, r *Router, outputs map[int32]int) {
	t.Helper()
	for seed, n := range outputs {
		id := fmt.Sprint("teach", seed)
		s := acq(t, r, id, prompt(64, seed)...)
		if _, ok := r.ReleaseDone(s, id, n, nil); !ok {
			t.Fatalf("release of %s failed", id)
		}
	}
	r.ResetCache()
}

// With work_weight a server's load counts the output predicted for its
// in-flight requests: once one server runs a prompt known to answer long,
// short requests go to the other; exactly that charge leaves when the
// request's release names it. Without work_weight the same requests
// alternate on prompt tokens.
func TestWorkWeightPlacesByPredictedOutput(t *testing.T) {
	for _, c := range []struct {
		w          float64
		wantShorts string
	}{{1, "[s1 s1 s1 s1]"}, {0, "[s1 s0 s1 s0]"}} {
		t.Run(fmt.Sprint("work_weight=", c.w), func(t *testing.T) {
			r := mustNew(t, workConfig(c.w), "s0", "s1")
			teach(t, r, map[int32]int{1: 6000, 1001: 10, 2001: 10, 3001: 10, 4001: 10})
			if s := acq(t, r, "long", prompt(64, 1)...); s != "s0" {
				t.Fatalf("long request on %s, want s0 (first added)", s)
			}
			var shorts []string
			for i := int32(1); i <= 4; i++ {
				shorts = append(shorts, acq(t, r, fmt.Sprint("short", i), prompt(64, 1000*i+1)...))
			}
			if fmt.Sprint(shorts) != c.wantShorts {
				t.Fatalf("short requests on %v, want %s", shorts, c.wantShorts)
			}
			if c.w == 0 {
				if got := r.workOf("s0"); got != 0 {
					t.Fatalf("work summed (%v) though the strategy reads none", got)
				}
				return
			}
			if got := r.workOf("s0"); got != 6000 {
				t.Fatalf("s0 predicted output %v, want 6000", got)
			}
			if got := r.workOf("s1"); got != 40 {
				t.Fatalf("s1 predicted output %v, want 40 (4 x 10)", got)
			}
			if got := r.LengthCounters().PredictedTokens; got["s0"] != 6000 || got["s1"] != 40 {
				t.Fatalf("status shows predicted tokens %v", got)
			}
			r.ReleaseDone("s0", "long", 5800, nil)
			if got := r.workOf("s0"); got != 0 {
				t.Fatalf("s0 predicted output %v after the long request's release, want 0", got)
			}
			if s := acq(t, r, "after", prompt(64, 9001)...); s != "s0" {
				t.Fatalf("request after the release on %s, want s0 (idle)", s)
			}
		})
	}
}

// A caller's hint (a reference row's true length) is charged instead of
// the learnt figure; releases that name no request cannot take a charge
// back, so a server's sum is forgotten once nothing is in flight there; a
// re-added server starts from zero and a removed one is forgotten.
func TestWorkHintPlainReleaseAndPool(t *testing.T) {
	r := mustNew(t, workConfig(1), "s0", "s1")
	d, err := r.Acquire(Request{ID: "h", Tokens: prompt(64, 1), Pin: -1, Hint: 700})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.workOf(d.Server); got != 700 {
		t.Fatalf("hinted request charged %v, want 700", got)
	}
	d2, err := r.Acquire(Request{ID: "h2", Tokens: prompt(64, 5001), Pin: -1, Hint: 300})
	if err != nil {
		t.Fatal(err)
	}
	if d2.Server == d.Server {
		t.Fatalf("second hinted request joined the first on %s", d.Server)
	}
	if !r.Release(d.Server) {
		t.Fatal("plain release failed")
	}
	if got := r.workOf(d.Server); got != 0 {
		t.Fatalf("idle server keeps %v predicted tokens after a plain release", got)
	}
	if err := r.AddServers([]string{d2.Server}); err != nil {
		t.Fatal(err)
	}
	if got := r.workOf(d2.Server); got != 0 {
		t.Fatalf("re-added server keeps %v predicted tokens", got)
	}
	r.ReleaseDone(d2.Server, "h2", 300, nil) // its charge was already dropped: no negative sum
	if got := r.workOf(d2.Server); got != 0 {
		t.Fatalf("sum %v after releasing a dropped charge", got)
	}
	r.RemoveServers([]string{d2.Server})
	r.mu.Lock()
	_, kept := r.lens.work[d2.Server]
	r.mu.Unlock()
	if kept {
		t.Fatal("a removed server's predicted output is still kept")
	}
}

// work_weight reads what length learning learns: without it the router
// refuses the configuration, naming both settings.
func TestWorkWeightNeedsLengths(t *testing.T) {
	c := workConfig(1)
	c.Lengths.Enabled = false
	_, err := New(c)
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("err %v, want ErrConfig", err)
	}
	for _, want := range []string{"work_weight", "lengths.enabled"} {
		if !contains(err.Error(), want) {
			t.Fatalf("error %q does not name %s", err, want)
		}
	}
}

// At each weight sync the learner measures how alike a prompt's responses
// were in the step that ended, and the status shows it.
func TestStatusShowsMeasuredCorrelation(t *testing.T) {
	for _, tc := range []struct {
		name     string
		lengths  func(prompt, sample int) int
		wantCorr float64
	}{
		{"siblings alike", func(p, _ int) int { return 100 * (p + 1) }, 1},
		// Every prompt gets the same four lengths: nothing is the prompt's.
		{"siblings independent of the prompt", func(_, j int) int { return []int{10, 1000, 100, 5000}[j] }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := mustNew(t, Config{Mode: ModeKVCAware, Model: "m", Lengths: LengthsSpec{Enabled: true}}, "s0", "s1")
			if c := r.LengthCounters(); c.LengthCorrKnown {
				t.Fatalf("a fresh router knows a correlation: %+v", c)
			}
			for k := 0; k < 10; k++ {
				for j := 0; j < 4; j++ {
					id := fmt.Sprintf("p%d-%d", k, j)
					s := acq(t, r, id, prompt(64, int32(1000*(k+1)))...)
					r.ReleaseDone(s, id, tc.lengths(k, j), nil)
				}
			}
			if c := r.LengthCounters(); c.LengthCorrKnown {
				t.Fatalf("the correlation is known before the step ends: %+v", c)
			}
			r.ResetCache()
			if c := r.LengthCounters(); !c.LengthCorrKnown || math.Abs(c.LengthCorr-tc.wantCorr) > 1e-9 {
				t.Fatalf("measured correlation %v (known %v), want %v", c.LengthCorr, c.LengthCorrKnown, tc.wantCorr)
			}
		})
	}
}

// hinted acquires id on server pin with a hinted output length.
func hinted(t *testing.T, r *Router, id string, pin int, seed int32, hint float64) {
	t.Helper()
	if _, err := r.Acquire(Request{ID: id, Tokens: prompt(64, seed), Pin: pin, Hint: hint}); err != nil {
		t.Fatalf("acquire %s: %v", id, err)
	}
}

// mustAdd adds (or re-adds) servers to r's pool.
func mustAdd(t *testing.T, r *Router, ids ...string) {
	t.Helper()
	if err := r.AddServers(ids); err != nil {
		t.Fatal(err)
	}
}

// A release that names a request takes exactly its charge back, whatever
// else is still in flight on the server; charges made before the server's
// sum restarted (a re-add, or going idle with id-less releases
// outstanding) never reach the new sum.
func TestWorkChargesStayExact(t *testing.T) {
	// One server but the last case: where every request runs is fixed.
	for _, tc := range []struct {
		name    string
		servers []string
		run     func(t *testing.T, r *Router)
		want    float64
	}{
		{"a named release with others in flight", []string{"s0"}, func(t *testing.T, r *Router) {
			hinted(t, r, "long", 0, 1, 6000)
			hinted(t, r, "short", 0, 2, 10)
			r.ReleaseDone("s0", "long", 5900, nil)
		}, 10},
		{"a session's next turn replaces its earlier charge", []string{"s0"}, func(t *testing.T, r *Router) {
			hinted(t, r, "other", 0, 1, 10)
			hinted(t, r, "sess", 0, 2, 100)
			hinted(t, r, "sess", 0, 3, 400)
		}, 410},
		{"a release from before a re-add", []string{"s0"}, func(t *testing.T, r *Router) {
			hinted(t, r, "old", 0, 1, 6000)
			mustAdd(t, r, "s0")
			hinted(t, r, "new1", 0, 2, 500)
			hinted(t, r, "new2", 0, 3, 200)
			r.ReleaseDone("s0", "old", 5900, nil)
		}, 700},
		{"a reused id after id-less releases", []string{"s0"}, func(t *testing.T, r *Router) {
			hinted(t, r, "a", 0, 1, 100)
			r.Release("s0") // no id: "a"'s charge stays on record, the idle server's sum restarts
			hinted(t, r, "b", 0, 2, 400)
			hinted(t, r, "a", 0, 3, 50) // the stale "a" must not take 100 off the new sum
		}, 450},
		{"a removed and re-added server", []string{"s0", "s1"}, func(t *testing.T, r *Router) {
			hinted(t, r, "gone", 0, 1, 300)
			r.RemoveServers([]string{"s0"})
			mustAdd(t, r, "s0")
			hinted(t, r, "n1", 1, 2, 80) // s0 is now the second server
			hinted(t, r, "n2", 1, 3, 40)
			r.ReleaseDone("s0", "gone", 290, nil)
		}, 120},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := mustNew(t, workConfig(1), tc.servers...)
			tc.run(t, r)
			if got := r.workOf("s0"); got != tc.want {
				t.Fatalf("s0's predicted output in flight %v, want %v", got, tc.want)
			}
		})
	}
}

// Admission's sticky check reads the same load as routing: a session whose
// server is overloaded by predicted output is not held for that server.
func TestAdmissionOverloadCountsPredictedWork(t *testing.T) {
	c := workConfig(1)
	c.Admission = AdmissionSpec{Enabled: true, MaxInflight: 1}
	r := mustNew(t, c, "s0", "s1")
	if d, _, err := r.Submit(Request{ID: "sess", Tokens: prompt(64, 1), Pin: 0}, 1); err != nil || d.Server != "s0" {
		t.Fatalf("pinned session: %v %v", d.Server, err)
	}
	r.Release("s0")
	hinted(t, r, "x", 0, 7000, 9500) // s0's one slot, and 0.96 of its KV predicted
	d, held, err := r.Submit(Request{ID: "sess", Tokens: prompt(96, 1), Pin: -1}, 2)
	if err != nil {
		t.Fatal(err)
	}
	if held || d.Server != "s1" {
		t.Fatalf("the session's turn was held=%v on %q, want s1 now (s0 is overloaded by its predicted output)", held, d.Server)
	}
}

// Slots that admission takes back from dead clients (reconcile) take their
// predicted output with them once nothing is left in flight: the clients
// will never name those requests in a release.
func TestWorkReconciledSlotsLeaveNoCharge(t *testing.T) {
	c := newClock()
	cfg := workConfig(1)
	cfg.Admission = AdmissionSpec{Enabled: true, MaxInflight: 2}
	cfg.Now = c.now
	r := mustNew(t, cfg, "s0")
	for i, h := range []float64{300, 200} {
		req := newReq(fmt.Sprint("dead", i), nil)
		req.Hint = h
		mustSubmit(t, r, req, uint64(i+1))
	}
	if got := r.workOf("s0"); got != 500 {
		t.Fatalf("charged %v, want 500", got)
	}
	for i := 0; i < 5; i++ { // the engine runs nothing for 50 s
		c.add(10 * time.Second)
		r.UpdateMetrics("s0", load.Metrics{At: c.t})
	}
	if r.Inflight("s0") != 0 {
		t.Fatalf("in flight %d after reconcile, want 0", r.Inflight("s0"))
	}
	if got := r.workOf("s0"); got != 0 {
		t.Fatalf("an idle server keeps %v predicted tokens from reconciled slots", got)
	}
}
