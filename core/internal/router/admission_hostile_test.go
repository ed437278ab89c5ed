package router

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	timeclock "github.com/kvc-router/kvc-router/core/internal/clock"
	"github.com/kvc-router/kvc-router/core/internal/load"
	"github.com/kvc-router/kvc-router/core/internal/memtrim"
)

// Issue 29's admission rows: each test names its row.

// clock is a settable test clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time      { return c.t }
func (c *clock) add(d time.Duration) { c.t = c.t.Add(d) }
func newClock() *clock               { return &clock{t: time.Unix(1_700_000_000, 0)} }
func down(r *Router, id string)      { r.ld.Down(id, errors.New("connection refused")) }
func heal(r *Router, id string, at time.Time) {
	r.ld.Update(id, load.Metrics{At: at})
}

func mustSubmit(t *testing.T, r *Router, req Request, ticket uint64) (string, bool) {
	t.Helper()
	d, q, err := r.Submit(req, ticket)
	if err != nil {
		t.Fatalf("submit %s: %v", req.ID, err)
	}
	return d.Server, q
}

func newReq(id string, tokens []int32) Request { return Request{ID: id, Tokens: tokens, Pin: -1} }

// Row 3: an unhealthy server has no room, so it neither turns admission
// off nor takes held requests; a session held for a server that turns
// unhealthy is routed elsewhere.
func TestAdmissionUnhealthyServerHasNoRoom(t *testing.T) {
	r := mustNew(t, admitConfig(2), "s0", "s1", "dead")
	down(r, "dead")
	held := 0
	for i := 0; i < 6; i++ {
		if _, q := mustSubmit(t, r, newReq(fmt.Sprint("r", i), prompt(32, int32(1000*i))), uint64(i+1)); q {
			held++
		}
	}
	if r.Inflight("s0") != 2 || r.Inflight("s1") != 2 || r.Inflight("dead") != 0 || held != 2 {
		t.Fatalf("in flight s0=%d s1=%d dead=%d, held %d; want 2/2/0 and 2 held",
			r.Inflight("s0"), r.Inflight("s1"), r.Inflight("dead"), held)
	}
	// Releasing on, or pumping, never admits onto the unhealthy server.
	if got := r.Pump(nil); len(got) != 0 {
		t.Fatalf("pump admitted %+v onto an unhealthy server", got)
	}
	got, _ := r.ReleaseAdmit("s1", nil)
	if len(got) != 1 || got[0].Decision.Server != "s1" {
		t.Fatalf("release on s1 admitted %+v, want one on s1", got)
	}
	r.ld.Acquire("dead", 0) // a count there to release
	if got, _ := r.ReleaseAdmit("dead", nil); len(got) != 0 {
		t.Fatalf("release on the unhealthy server admitted %+v onto it", got)
	}
	// Every server unhealthy: as routing does, admission falls back to all.
	down(r, "s0")
	down(r, "s1")
	if got := r.Pump(nil); len(got) != 1 || got[0].Decision.Server != "dead" {
		t.Fatalf("all unhealthy: pump admitted %+v, want the held request on the one with room", got)
	}
}

func TestAdmissionHeldSessionLeavesAnUnhealthyServer(t *testing.T) {
	c := newClock()
	cfg := admitConfig(1)
	cfg.Now = c.now
	r := mustNew(t, cfg, "s0", "s1")
	if d, _, err := r.Submit(Request{ID: "sess", Tokens: prompt(64, 1), Pin: 0}, 1); err != nil || d.Server != "s0" {
		t.Fatalf("pinned session: %v %v", d.Server, err)
	}
	r.Release("s0")
	if d, err := r.Acquire(Request{ID: "x", Tokens: prompt(64, 7000), Pin: 0}); err != nil || d.Server != "s0" {
		t.Fatalf("pinned x: %v %v", d.Server, err)
	}
	if _, q := mustSubmit(t, r, newReq("sess", prompt(96, 1)), 2); !q {
		t.Fatal("session turn not held for its full server")
	}
	if got := r.Pump(nil); len(got) != 0 {
		t.Fatalf("pump admitted %+v while the session's server is healthy and full", got)
	}
	down(r, "s0")
	got := r.Pump(nil)
	if len(got) != 1 || got[0].Ticket != 2 || got[0].Decision.Server != "s1" {
		t.Fatalf("after s0 turned unhealthy pump admitted %+v, want the session (ticket 2) on s1", got)
	}
}

// Row 4: sessions bound to one full server, however many, do not keep a
// slot freed elsewhere from a request that may go there.
func TestAdmissionBoundSessionsDoNotStarveOthers(t *testing.T) {
	cfg := admitConfig(1)
	cfg.Admission.Window = 4
	r := mustNew(t, cfg, "s0", "s1")
	for i := 0; i < 8; i++ { // eight sessions bound to s0
		if d, err := r.Acquire(Request{ID: fmt.Sprint("sess", i), Tokens: prompt(32, int32(100*i)), Pin: 0}); err != nil || d.Server != "s0" {
			t.Fatalf("bind: %v %v", d.Server, err)
		}
		r.Release("s0")
	}
	mustSubmit(t, r, Request{ID: "x", Tokens: prompt(32, 9000), Pin: 0}, 100)
	mustSubmit(t, r, Request{ID: "y", Tokens: prompt(32, 9500), Pin: 1}, 101)
	for i := 0; i < 8; i++ {
		if _, q := mustSubmit(t, r, newReq(fmt.Sprint("sess", i), prompt(48, int32(100*i))), uint64(i+1)); !q {
			t.Fatalf("session %d not held", i)
		}
	}
	if _, q := mustSubmit(t, r, newReq("fresh", prompt(32, 20000)), 50); !q {
		t.Fatal("fresh request not held")
	}
	got, _ := r.ReleaseAdmit("s1", nil)
	if len(got) != 1 || got[0].Ticket != 50 || got[0].Decision.Server != "s1" {
		t.Fatalf("s1's freed slot admitted %+v, want the fresh request (ticket 50)", got)
	}
	// s0's slot goes to its oldest bound session.
	got, _ = r.ReleaseAdmit("s0", nil)
	if len(got) != 1 || got[0].Ticket != 1 {
		t.Fatalf("s0's freed slot admitted %+v, want session 0 (ticket 1)", got)
	}
}

// Row 4: a request free to go anywhere is not passed over for ever by
// younger requests the order prefers.
func TestAdmissionOldestIsNotStarvedByPreferredYounger(t *testing.T) {
	cfg := admitConfig(1)
	cfg.Admission.Window = 3
	r := mustNew(t, cfg, "s0")
	a := prompt(64, 1)
	mustSubmit(t, r, newReq("a0", a), 1) // s0 holds a's prompt
	old := prompt(64, 5000)
	// The oldest held request: a prompt held elsewhere would lose to any
	// sibling; make it one held nowhere but keep a stream of siblings.
	mustSubmit(t, r, newReq("old", old), 2)
	tk := uint64(10)
	for i := 0; i < 3; i++ {
		mustSubmit(t, r, newReq(fmt.Sprint("a", tk), a), tk)
		tk++
	}
	admittedOld := false
	for round := 0; round < 12 && !admittedOld; round++ {
		got, _ := r.ReleaseAdmit("s0", nil)
		for _, g := range got {
			if g.Ticket == 2 {
				admittedOld = true
			}
		}
		mustSubmit(t, r, newReq(fmt.Sprint("a", tk), a), tk) // another sibling arrives
		tk++
	}
	if !admittedOld {
		t.Fatal("the oldest held request was passed over 12 times by younger siblings")
	}
}

// Row 5: a server whose engine runs fewer requests than the router counts
// there, at every scrape for reconcile_after_ms, gets the excess back.
func TestAdmissionReconcilesLeakedSlotsWithEngineCounts(t *testing.T) {
	c := newClock()
	cfg := admitConfig(2)
	cfg.Now = c.now
	r := mustNew(t, cfg, "s0")
	mustSubmit(t, r, newReq("leak0", nil), 1) // two requests whose clients died:
	mustSubmit(t, r, newReq("leak1", nil), 2) // never released
	if _, q := mustSubmit(t, r, newReq("live", nil), 3); !q {
		t.Fatal("not held at the cap")
	}
	// A transient excess (requests on their way) that clears changes nothing.
	r.UpdateMetrics("s0", load.Metrics{Running: 0, At: c.t})
	c.add(20 * time.Second)
	r.UpdateMetrics("s0", load.Metrics{Running: 2, At: c.t})
	c.add(20 * time.Second)
	r.UpdateMetrics("s0", load.Metrics{Running: 1, At: c.t})
	if r.Inflight("s0") != 2 {
		t.Fatalf("in flight %d after a transient excess, want 2", r.Inflight("s0"))
	}
	// The engine reports one request at every scrape for 31 s: one slot leaked.
	for i := 0; i < 4; i++ {
		c.add(10 * time.Second)
		r.UpdateMetrics("s0", load.Metrics{Running: 1, Waiting: 0, At: c.t})
	}
	if r.Inflight("s0") != 1 {
		t.Fatalf("in flight %d after 40 s of the engine running 1, want 1", r.Inflight("s0"))
	}
	got := r.Pump(nil)
	if len(got) != 1 || got[0].Ticket != 3 {
		t.Fatalf("pump admitted %+v, want the held request into the reconciled slot", got)
	}
	if st := r.Status().Admission; st.Reconciled != 1 {
		t.Fatalf("reconciled_total %d, want 1", st.Reconciled)
	}
	// Off: -1.
	cfg.Admission.ReconcileAfterMS = -1
	r2 := mustNew(t, cfg, "s0")
	mustSubmit(t, r2, newReq("a", nil), 1)
	for i := 0; i < 5; i++ {
		c.add(time.Minute)
		r2.UpdateMetrics("s0", load.Metrics{At: c.t})
	}
	if r2.Inflight("s0") != 1 {
		t.Fatal("reconciled with reconcile_after_ms = -1")
	}
}

// Row 7: held prompts have a byte budget, and are dropped once admitted or
// cancelled (the heap returns to its baseline).
func TestAdmissionHeldBytesBudget(t *testing.T) {
	cfg := admitConfig(1)
	cfg.Admission.MaxHeldBytes = 64 << 10
	r := mustNew(t, cfg, "s0")
	mustSubmit(t, r, newReq("run", nil), 1)
	var err error
	n := 0
	for ; n < 100; n++ {
		if _, _, err = r.Submit(newReq(fmt.Sprint("h", n), prompt(4096, int32(n))), uint64(10+n)); err != nil {
			break
		}
	}
	if !errors.Is(err, ErrQueueFull) || !strings.Contains(err.Error(), "admission.max_held_bytes") || n != 3 {
		t.Fatalf("after %d held 16 KiB prompts: err %v, want ErrQueueFull naming admission.max_held_bytes after 3", n, err)
	}
	if st := r.Status().Admission; st.HeldBytes <= 3*16<<10 || st.HeldBytes > 64<<10 {
		t.Fatalf("held_bytes %d", st.HeldBytes)
	}
	r.Cancel(10)
	r.ReleaseAdmit("s0", nil)
	r.Cancel(12)
	if st := r.Status().Admission; st.HeldBytes != 0 || st.Held != 0 {
		t.Fatalf("after cancel and admit: %+v", st)
	}
}

func TestAdmissionDrainedPromptsAreFreed(t *testing.T) {
	const delay = 50 * time.Millisecond
	fc := timeclock.NewFake(time.Unix(1_700_000_000, 0))
	defer memtrim.UseClock(fc)()
	memtrim.Configure(0, delay, delay)
	defer memtrim.Configure(memtrim.DefaultThreshold, memtrim.DefaultDelay, memtrim.DefaultMinInterval)
	cfg := admitConfig(1)
	r := mustNew(t, cfg, "s0")
	mustSubmit(t, r, newReq("run", nil), 1)
	// retained is the heap the process keeps from the OS: in use, or
	// free but not yet returned.
	retained := func() (inuse, kept uint64) {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc, m.HeapSys - m.HeapReleased
	}
	debug.FreeOSMemory()
	_, base := retained()
	const n, toks = 5000, 2048 // 40 MB of prompts
	for i := 0; i < n; i++ {
		if _, q := mustSubmit(t, r, newReq(fmt.Sprint("h", i), prompt(toks, int32(i*toks))), uint64(10+i)); !q {
			t.Fatal("not held")
		}
	}
	if _, full := retained(); full < base+n*toks*4 {
		t.Fatalf("retained %d MB while holding %d MB of prompts", full>>20, n*toks*4>>20)
	}
	for i := n - 1; i >= n/2; i-- { // half cancelled (newest first), half admitted
		r.Cancel(uint64(10 + i))
	}
	for r.Held() > 0 {
		if got, _ := r.ReleaseAdmit("s0", nil); len(got) != 1 {
			t.Fatalf("release admitted %d", len(got))
		}
	}
	// The queue drained: it armed a memory return, which runs once its
	// delay has passed.
	trims := memtrim.Snapshot().Trims
	fc.Advance(delay)
	if memtrim.Snapshot().Trims != trims+1 {
		t.Fatal("the drained queue armed no memory return")
	}
	inuse, kept := retained()
	if inuse > base+8<<20 || kept > base+8<<20 {
		t.Fatalf("after the queue drained the heap holds %d MB in use, %d MB kept from the OS (%d MB before it filled)",
			inuse>>20, kept>>20, base>>20)
	}
}

// Row 8: requests held when the pool empties fail once it stays empty for
// admission.empty_pool_ms; a server added before that admits them.
func TestAdmissionHeldRequestsFailWhenThePoolStaysEmpty(t *testing.T) {
	c := newClock()
	cfg := admitConfig(1)
	cfg.Now = c.now
	r := mustNew(t, cfg, "s0")
	mustSubmit(t, r, Request{ID: "sess", Tokens: prompt(32, 1), Pin: 0}, 1)
	r.Release("s0")
	mustSubmit(t, r, newReq("x", prompt(32, 500)), 2)
	for i, q := range []Request{newReq("sess", prompt(48, 1)), newReq("free", prompt(32, 900))} {
		if _, held := mustSubmit(t, r, q, uint64(10+i)); !held {
			t.Fatalf("%s not held", q.ID)
		}
	}
	r.RemoveServers([]string{"s0"})
	c.add(4 * time.Second)
	if got := r.Pump(nil); len(got) != 0 || r.Held() != 2 {
		t.Fatalf("before the deadline: pump %+v, held %d", got, r.Held())
	}
	// A server added in time takes them.
	if err := r.AddServers([]string{"s1"}); err != nil {
		t.Fatal(err)
	}
	c.add(4 * time.Second)
	if got := r.Pump(nil); len(got) != 1 || got[0].Err != nil || got[0].Decision.Server != "s1" {
		t.Fatalf("new server: pump %+v, want one admitted on s1", got)
	}
	r.RemoveServers([]string{"s1"})
	c.add(5 * time.Second)
	got := r.Pump(nil)
	if len(got) != 1 || !errors.Is(got[0].Err, ErrNoServers) || !strings.Contains(got[0].Err.Error(), "admission.empty_pool_ms") {
		t.Fatalf("pool empty 5 s: pump %+v, want the held request failed with ErrNoServers", got)
	}
	if r.Held() != 0 || r.Status().Admission.Failed != 1 {
		t.Fatalf("held %d, status %+v", r.Held(), r.Status().Admission)
	}
}

// Row 9: room that appears without ReleaseAdmit (a server added, a cap
// raised by metrics, a plain Release) goes to held requests before a new
// submit.
func TestAdmissionRoomWithoutReleaseAdmitGoesToHeldFirst(t *testing.T) {
	c := newClock()
	cfg := admitConfig(0)
	cfg.Load.MaxNumSeqs = 1
	cfg.Now = c.now
	r := mustNew(t, cfg, "s0")
	mustSubmit(t, r, newReq("run", prompt(32, 1)), 1)
	if _, q := mustSubmit(t, r, newReq("A", prompt(32, 100)), 2); !q {
		t.Fatal("A not held")
	}
	steps := []struct {
		name string
		room func()
		want string // where the held request goes
	}{
		{"server added", func() { _ = r.AddServers([]string{"s1"}) }, "s1"},
		{"plain release", func() { r.Release("s0") }, "s0"},
		{"cap raised", func() { r.UpdateMetrics("s1", load.Metrics{MaxNumSeqs: 2, At: c.t}) }, "s1"},
	}
	heldTicket := uint64(2)
	for i, st := range steps {
		st.room()
		next := uint64(10 + i)
		if _, q := mustSubmit(t, r, newReq(fmt.Sprint("new", i), prompt(32, int32(300+100*i))), next); !q {
			t.Fatalf("%s: a new submit took the room ahead of held ticket %d", st.name, heldTicket)
		}
		got := r.Pump(nil)
		if len(got) != 1 || got[0].Ticket != heldTicket || got[0].Decision.Server != st.want {
			t.Fatalf("%s: pump %+v, want ticket %d on %s", st.name, got, heldTicket, st.want)
		}
		heldTicket = next
	}
}

// Row 10: full_determinism pins respect the cap, and a held pinned request
// is admitted only on its pinned server.
func TestAdmissionPinsRespectTheCapAndKeepThePin(t *testing.T) {
	r := mustNew(t, admitConfig(1), "s0", "s1")
	if s, q := mustSubmit(t, r, Request{ID: "p1", Tokens: prompt(32, 1), Pin: 0}, 1); q || s != "s0" {
		t.Fatalf("p1: %s held=%v", s, q)
	}
	if _, q := mustSubmit(t, r, Request{ID: "p2", Tokens: prompt(32, 500), Pin: 2}, 2); !q {
		t.Fatalf("p2 pinned to full s0 routed past the cap (s0 in flight %d)", r.Inflight("s0"))
	}
	if s, q := mustSubmit(t, r, Request{ID: "q1", Tokens: prompt(32, 900), Pin: 1}, 3); q || s != "s1" {
		t.Fatalf("q1: %s held=%v", s, q)
	}
	if r.Inflight("s0") != 1 {
		t.Fatalf("s0 in flight %d > cap 1", r.Inflight("s0"))
	}
	if got, _ := r.ReleaseAdmit("s1", nil); len(got) != 0 {
		t.Fatalf("s1's slot admitted %+v: a pin to s0 lost its pin", got)
	}
	got, _ := r.ReleaseAdmit("s0", nil)
	if len(got) != 1 || got[0].Ticket != 2 || got[0].Decision.Server != "s0" {
		t.Fatalf("s0's slot admitted %+v, want p2 on s0", got)
	}
	// A pin to an unhealthy server moves to the healthy ones, deterministically.
	down(r, "s0")
	r.Release("s1")
	if s, q := mustSubmit(t, r, Request{ID: "p3", Tokens: prompt(32, 1300), Pin: 0}, 4); q || s != "s1" {
		t.Fatalf("p3 pinned to unhealthy s0: %s held=%v, want s1", s, q)
	}
}
func TestAdmissionRejectsATicketAlreadyHeld(t *testing.T) {
	r := mustNew(t, admitConfig(1), "s0")
	mustSubmit(t, r, newReq("a", nil), 1)
	mustSubmit(t, r, newReq("b", nil), 2)
	if _, _, err := r.Submit(newReq("c", nil), 2); !errors.Is(err, ErrTicketHeld) {
		t.Fatalf("err %v, want ErrTicketHeld", err)
	}
}

// Property (rows 3, 4, 8, 9, 10 together): random submits (sessions, pins,
// fresh), releases plain and admitting, cancels, health flips, servers
// added and removed, pumps. After every step: no server runs more than its
// cap; nothing is routed or admitted onto an unhealthy server while a
// healthy one exists; a request free to go anywhere is held only while no
// eligible server has room; after a pump nothing held may go to an
// eligible server with room; every request is accounted for exactly once.
func TestAdmissionInvariantsUnderHealthAndChurn(t *testing.T) {
	for seed := uint64(1); seed <= 40; seed++ {
		rng := rand.New(rand.NewPCG(seed, 29))
		c := newClock()
		capacity := 1 + rng.IntN(3)
		cfg := admitConfig(capacity)
		cfg.Now = c.now
		cfg.Admission.ReconcileAfterMS = -1
		cfg.Admission.Window = 1 + rng.IntN(6)
		all := []string{"s0", "s1", "s2", "s3", "s4"}
		in := map[string]bool{}
		start := all[:1+rng.IntN(3)]
		for _, s := range start {
			in[s] = true
		}
		r := mustNew(t, cfg, start...)
		running := map[string]int{}
		unhealthy := map[string]bool{}
		held := map[uint64]bool{}
		var ticket uint64
		healthyWithRoom := func() []string {
			var out []string
			anyHealthy := false
			for _, s := range r.Servers() {
				if !unhealthy[s] {
					anyHealthy = true
				}
			}
			for _, s := range r.Servers() {
				if (!anyHealthy || !unhealthy[s]) && running[s] < capacity {
					out = append(out, s)
				}
			}
			return out
		}
		onto := func(step int, what, srv string) {
			if !in[srv] {
				t.Fatalf("seed %d step %d: %s onto %s, not in the pool", seed, step, what, srv)
			}
			anyHealthy := false
			for s := range in {
				if !unhealthy[s] {
					anyHealthy = true
				}
			}
			if anyHealthy && unhealthy[srv] {
				t.Fatalf("seed %d step %d: %s onto unhealthy %s while a healthy server exists", seed, step, what, srv)
			}
			running[srv]++
		}
		takeAdmitted := func(step int, got []Admitted) {
			for _, a := range got {
				if !held[a.Ticket] {
					t.Fatalf("seed %d step %d: admitted unknown ticket %d", seed, step, a.Ticket)
				}
				delete(held, a.Ticket)
				if a.Err != nil {
					if !errors.Is(a.Err, ErrNoServers) {
						t.Fatalf("seed %d: failed with %v", seed, a.Err)
					}
					continue
				}
				onto(step, "admitted", a.Decision.Server)
			}
		}
		for step := 0; step < 500; step++ {
			switch op := rng.IntN(20); {
			case op < 9:
				ticket++
				req := newReq(fmt.Sprint("q", rng.IntN(25)), prompt(16*(1+rng.IntN(4)), int32(100*rng.IntN(6))))
				if rng.IntN(5) == 0 {
					req.Pin = rng.IntN(7)
				}
				room := healthyWithRoom()
				d, queued, err := r.Submit(req, ticket)
				if errors.Is(err, ErrNoServers) && len(in) == 0 {
					continue
				}
				if err != nil {
					t.Fatalf("seed %d step %d: %v", seed, step, err)
				}
				// A submit first hands room to held requests.
				takeAdmitted(step, r.Pump(nil))
				if queued {
					held[ticket] = true
					_, bound := r.sticky.Peek(req.ID)
					if !bound && req.Pin < 0 && len(room) > 0 && len(healthyWithRoom()) > 0 {
						t.Fatalf("seed %d step %d: free request held while %v had room", seed, step, healthyWithRoom())
					}
					continue
				}
				onto(step, "routed", d.Server)
			case op < 14:
				var busy []string
				for _, n := range r.Servers() {
					if running[n] > 0 {
						busy = append(busy, n)
					}
				}
				if len(busy) == 0 {
					continue
				}
				n := busy[rng.IntN(len(busy))]
				running[n]--
				if rng.IntN(3) == 0 {
					r.Release(n)
					continue
				}
				got, _ := r.ReleaseAdmit(n, nil)
				takeAdmitted(step, got)
			case op < 15:
				for tk := range held {
					if !r.Cancel(tk) {
						t.Fatalf("seed %d: cancel of held ticket %d failed", seed, tk)
					}
					delete(held, tk)
					break
				}
			case op < 17:
				s := all[rng.IntN(len(all))]
				if !in[s] {
					continue
				}
				if unhealthy[s] {
					heal(r, s, c.t)
					delete(unhealthy, s)
				} else {
					down(r, s)
					unhealthy[s] = true
				}
			case op < 18:
				s := all[rng.IntN(len(all))]
				if in[s] {
					r.RemoveServers([]string{s})
					delete(in, s)
					delete(running, s) // its count goes with it
					delete(unhealthy, s)
				} else {
					if err := r.AddServers([]string{s}); err != nil {
						t.Fatal(err)
					}
					heal(r, s, c.t) // a re-added id keeps old metrics: make it healthy
					in[s] = true
					running[s] = 0
				}
			default:
				c.add(time.Duration(rng.IntN(3000)) * time.Millisecond)
				takeAdmitted(step, r.Pump(nil))
				// After a pump, held requests wait only for servers without room.
				room := healthyWithRoom()
				r.mu.Lock()
				for _, h := range r.aq.tickets {
					if h.affinity == nil && len(room) > 0 {
						r.mu.Unlock()
						t.Fatalf("seed %d step %d: ticket %d free to go anywhere stays held while %v have room", seed, step, h.ticket, room)
					}
					if h.affinity != nil && slices.Contains(room, h.affinity.id) {
						r.mu.Unlock()
						t.Fatalf("seed %d step %d: ticket %d waits for %s, which has room", seed, step, h.ticket, h.affinity.id)
					}
				}
				r.mu.Unlock()
			}
			for _, n := range r.Servers() {
				if running[n] > capacity {
					t.Fatalf("seed %d step %d: %s runs %d > cap %d", seed, step, n, running[n], capacity)
				}
				if got := r.Inflight(n); got != running[n] {
					t.Fatalf("seed %d step %d: router counts %d in flight on %s, test %d", seed, step, got, n, running[n])
				}
			}
			if r.Held() != len(held) {
				t.Fatalf("seed %d step %d: router holds %d, test %d", seed, step, r.Held(), len(held))
			}
		}
	}
}
