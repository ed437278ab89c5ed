package main

import (
	"strings"
	"testing"

	json "github.com/goccy/go-json"
)

// admissionHandle is a kvc_aware router with admission on, a cap of one
// request per server and room for two held requests.
func admissionHandle(t *testing.T, admission string, servers string) uint64 {
	t.Helper()
	cfg := []byte(`{"router":{"mode":"kvc_aware","admission":` + admission + `}}`)
	h, res := abiNew(cfg, int64(len(cfg)), false)
	if res.Code != codeOK {
		t.Fatalf("new: %+v", res)
	}
	t.Cleanup(func() { abiClose(h) })
	if r := abiString(h, "add", []byte(servers), int64(len(servers)), nil, 0, 0); r.Code != codeOK {
		t.Fatalf("add: %+v", r)
	}
	return h
}

func submitABI(h uint64, id string, first int32, ticket uint64) (int32, string, abiResult) {
	toks := make([]int32, 64)
	for i := range toks {
		toks[i] = first + int32(i)
	}
	size, _ := acquireOptsLayout()
	return abiSubmit(h, id, toks, -1, -1, uint64(size), nil, false, ticket, 1)
}

func admittedOf(t *testing.T, js string) []admittedDoc {
	t.Helper()
	if js == "" {
		return nil
	}
	var out []admittedDoc
	if err := json.Unmarshal([]byte(js), &out); err != nil {
		t.Fatalf("admitted JSON %q: %v", js, err)
	}
	return out
}

func inflight(t *testing.T, h uint64, server string) int {
	t.Helper()
	var st statusDoc
	if err := json.Unmarshal([]byte(abiPlain(h, "status", false).Out), &st); err != nil {
		t.Fatal(err)
	}
	for _, s := range st.Router.Servers {
		if s.ID == server {
			return s.Load.Inflight
		}
	}
	t.Fatalf("server %q not in status", server)
	return 0
}

// TestAdmissionThroughABI: held requests answer KVR_HELD with no outputs,
// come back from kvr_release_admit / kvr_pump with their ticket and server
// (index and id), can be cancelled while held, and a full queue is
// KVR_QUEUE_FULL with a message naming the limit.
func TestAdmissionThroughABI(t *testing.T) {
	h := admissionHandle(t, `{"enabled":true,"max_inflight":1,"max_queue":2}`, `["a:1","b:1"]`)
	seen := map[int32]bool{}
	for i, id := range []string{"r0", "r1"} {
		idx, srv, res := submitABI(h, id, int32(1000*i), uint64(i))
		if res.Code != codeOK || idx < 0 || srv == "" {
			t.Fatalf("%s with room: %d %q %+v", id, idx, srv, res)
		}
		seen[idx] = true
	}
	if len(seen) != 2 {
		t.Fatalf("both requests on one server with cap 1: %v", seen)
	}
	for _, tk := range []uint64{7, 8} {
		idx, srv, res := submitABI(h, "held", 5000+int32(tk), tk)
		if res.Code != codeHeld || idx != -1 || srv != "" || res.Out != "" || res.Err != "" {
			t.Fatalf("ticket %d: want KVR_HELD and no outputs, got %d %q %+v", tk, idx, srv, res)
		}
	}
	idx, _, res := submitABI(h, "over", 9000, 9)
	if res.Code != codeQueueFull || idx != -1 || !strings.Contains(res.Err, "admission queue full: 2 requests held (admission.max_queue)") {
		t.Fatalf("queue full: %d %+v", idx, res)
	}
	// Ticket 8's caller gives up: cancelled once, then unknown.
	if c, r := abiCancel(h, 8); c != 1 || r.Code != codeOK {
		t.Fatalf("cancel held: %d %+v", c, r)
	}
	for _, tk := range []uint64{8, 12345} {
		if c, r := abiCancel(h, tk); c != 0 || r.Code != codeOK {
			t.Fatalf("cancel %d (not held): %d %+v", tk, c, r)
		}
	}
	// A release admits ticket 7 (the only one held) onto the freed server.
	rel, r := abiReleaseAdmit(h, "a:1", false)
	got := admittedOf(t, r.Out)
	if r.Code != codeOK || rel != 1 || len(got) != 1 || got[0] != (admittedDoc{Ticket: 7, Index: 0, Generation: 2, Server: "a:1"}) {
		t.Fatalf("release_admit: %d %+v %+v", rel, r, got)
	}
	if n := inflight(t, h, "a:1"); n != 1 {
		t.Fatalf("a:1 in flight %d after release+admit, want 1", n)
	}
	// Nothing held: a release admits nothing and allocates no string.
	if rel, r := abiReleaseAdmit(h, "b:1", false); r.Code != codeOK || rel != 1 || r.Out != "" {
		t.Fatalf("release with nothing held: %d %+v", rel, r)
	}
	if rel, r := abiReleaseAdmit(h, "nope", false); r.Code != codeOK || rel != 0 || r.Out != "" {
		t.Fatalf("release of an unknown id: %d %+v", rel, r)
	}
	// Room without a release: b:1 was freed above, so fill it, hold one
	// more, then a new server's room reaches it through kvr_pump.
	if _, _, res := submitABI(h, "fill", 20000, 20); res.Code != codeOK {
		t.Fatalf("fill: %+v", res)
	}
	if _, _, res := submitABI(h, "late", 30000, 30); res.Code != codeHeld {
		t.Fatalf("late: %+v", res)
	}
	if r := abiPump(h, false); r.Code != codeOK || r.Out != "" {
		t.Fatalf("pump without room: %+v", r)
	}
	ids := []byte(`["c:1"]`)
	if r := abiString(h, "add", ids, int64(len(ids)), nil, 0, 0); r.Code != codeOK {
		t.Fatal(r)
	}
	r = abiPump(h, false)
	if got := admittedOf(t, r.Out); r.Code != codeOK || len(got) != 1 || got[0] != (admittedDoc{Ticket: 30, Index: 2, Generation: 3, Server: "c:1"}) {
		t.Fatalf("pump after adding c:1: %+v %+v", r, got)
	}
	var st statusDoc
	if err := json.Unmarshal([]byte(abiPlain(h, "status", false).Out), &st); err != nil {
		t.Fatal(err)
	}
	if a := st.Router.Admission; !a.Enabled || a.Held != 0 || a.Queued != 3 || a.Admitted != 2 || a.Cancelled != 1 || a.Rejected != 1 || a.MaxHeld != 2 {
		t.Fatalf("admission status %+v", a)
	}
}

// TestAdmissionABIArguments: the precise errors of the new paths.
func TestAdmissionABIArguments(t *testing.T) {
	h := admissionHandle(t, `{"enabled":true,"max_inflight":1}`, `["a:1"]`)
	if _, _, res := submitABI(h, "r", 0, 1); res.Code != codeOK {
		t.Fatal(res)
	}
	size, _ := acquireOptsLayout()
	if _, _, res := abiSubmit(h, "x", []int32{1}, -1, -1, uint64(size), nil, false, 1, 2); res.Code != codeInvalidArgument ||
		res.Err != "opts.submit must be 0 or 1, got 2" {
		t.Fatalf("submit 2: %+v", res)
	}
	// NULL out_admitted is refused before anything is released.
	if _, r := abiReleaseAdmit(h, "a:1", true); r.Code != codeInvalidArgument || r.Err != "out_admitted is NULL" {
		t.Fatalf("release_admit NULL out: %+v", r)
	}
	if n := inflight(t, h, "a:1"); n != 1 {
		t.Fatalf("in flight %d after a refused release, want 1", n)
	}
	if r := abiPump(h, true); r.Code != codeInvalidArgument || r.Err != "out_admitted is NULL" {
		t.Fatalf("pump NULL out: %+v", r)
	}
	// As kvr_release: an id no server can have is an unknown id (a no-op).
	if rel, r := abiReleaseAdmit(h, string([]byte{0xff}), false); r.Code != codeOK || rel != 0 {
		t.Fatalf("invalid UTF-8 id: %d %+v", rel, r)
	}
	abiClose(h)
	if _, r := abiReleaseAdmit(h, "a:1", false); r.Code != codeInvalidState {
		t.Fatalf("closed handle release_admit: %+v", r)
	}
	if r := abiPump(h, false); r.Code != codeInvalidState {
		t.Fatalf("closed handle pump: %+v", r)
	}
	if _, r := abiCancel(h, 1); r.Code != codeInvalidState {
		t.Fatalf("closed handle cancel: %+v", r)
	}
	if _, r := abiCancel(0, 1); r.Code != codeInvalidArgument {
		t.Fatalf("handle 0 cancel: %+v", r)
	}
}

// TestAdmissionOffSubmitRoutes: without admission, submit routes every
// request (nothing is ever held), and release_admit is a release.
func TestAdmissionOffSubmitRoutes(t *testing.T) {
	h := admissionHandle(t, `{"enabled":false,"max_inflight":1}`, `["a:1"]`)
	for i := 0; i < 5; i++ {
		if idx, _, res := submitABI(h, "r", int32(i), uint64(i)); res.Code != codeOK || idx != 0 {
			t.Fatalf("request %d: %d %+v", i, idx, res)
		}
	}
	if rel, r := abiReleaseAdmit(h, "a:1", false); r.Code != codeOK || rel != 1 || r.Out != "" {
		t.Fatalf("release_admit: %d %+v", rel, r)
	}
	if n := inflight(t, h, "a:1"); n != 4 {
		t.Fatalf("in flight %d, want 4", n)
	}
}

// TestReleaseDoneTeachesLengths: kvr_release_done names the finished
// request and its output count; the learnt length reorders admission
// (longest first), status reports it, and bad arguments are refused
// before anything is released. min_corr 0: longest-first ranks on what
// one release taught (no step to measure a correlation on).
func TestReleaseDoneTeachesLengths(t *testing.T) {
	cfg := []byte(`{"router":{"mode":"kvc_aware","admission":{"enabled":true,"max_inflight":1},"lengths":{"enabled":true,"min_corr":0}}}`)
	h, res := abiNew(cfg, int64(len(cfg)), false)
	if res.Code != codeOK {
		t.Fatalf("new: %+v", res)
	}
	t.Cleanup(func() { abiClose(h) })
	if r := abiString(h, "add", []byte(`["a:1"]`), 7, nil, 0, 0); r.Code != codeOK {
		t.Fatal(r)
	}
	// warm (prompt A) wrote 900 tokens; then with r0 (prompt B) running,
	// B's sibling and A's second sample wait.
	if _, _, res := submitABI(h, "warm", 100, 0); res.Code != codeOK {
		t.Fatalf("warm: %+v", res)
	}
	if rel, r := abiReleaseDone(h, []byte("a:1"), []byte("warm"), 4, 900); r.Code != codeOK || rel != 1 || r.Out != "" {
		t.Fatalf("release warm: %d %+v", rel, r)
	}
	if _, _, res := submitABI(h, "r0", 5000, 1); res.Code != codeOK {
		t.Fatalf("r0: %+v", res)
	}
	if _, _, res := submitABI(h, "b2", 5000, 2); res.Code != codeHeld {
		t.Fatalf("b2: %+v", res)
	}
	if _, _, res := submitABI(h, "a2", 100, 3); res.Code != codeHeld {
		t.Fatalf("a2: %+v", res)
	}
	for _, c := range []struct {
		name string
		rid  []byte
		n    int64
		tok  int64
		want string
	}{
		{"negative count", []byte("r0"), 2, -1, "output_tokens must be in [0, 16777216], got -1"},
		{"huge count", []byte("r0"), 2, 1<<24 + 1, "output_tokens must be in [0, 16777216], got 16777217"},
		{"NULL id", nil, 2, 5, "request_id is NULL with length 2"},
		{"bad UTF-8 id", []byte{0xff}, 1, 5, "request_id is not valid UTF-8"},
		{"id over the limit", make([]byte, maxIDBytes+1), maxIDBytes + 1, 5, "request_id is 65537 bytes, more than the limit of 65536"},
	} {
		if rel, r := abiReleaseDone(h, []byte("a:1"), c.rid, c.n, c.tok); r.Code != codeInvalidArgument || r.Err != c.want || rel != 0 {
			t.Errorf("%s: %d %+v, want %q", c.name, rel, r, c.want)
		}
	}
	if n := inflight(t, h, "a:1"); n != 1 {
		t.Fatalf("in flight %d after refused releases, want 1", n)
	}
	// r0 wrote 10: A's sample (learnt long) goes before B's earlier-held one.
	rel, r := abiReleaseDone(h, []byte("a:1"), []byte("r0"), 2, 10)
	if got := admittedOf(t, r.Out); r.Code != codeOK || rel != 1 || len(got) != 1 || got[0].Ticket != 3 {
		t.Fatalf("release_done: %d %+v %+v, want ticket 3 (a2) admitted", rel, r, got)
	}
	if rel, r := abiReleaseDone(h, []byte("nope"), []byte("x"), 1, 3); r.Code != codeOK || rel != 0 {
		t.Fatalf("unknown server: %d %+v", rel, r)
	}
	var st struct {
		Router struct {
			Lengths *struct {
				Observed  int `json:"observed_tokens"`
				Unmatched int `json:"unmatched_releases"`
			} `json:"lengths"`
		} `json:"router"`
	}
	if err := json.Unmarshal([]byte(abiPlain(h, "status", false).Out), &st); err != nil {
		t.Fatal(err)
	}
	// x was never acquired: unmatched, counted.
	if l := st.Router.Lengths; l == nil || l.Observed != 2 || l.Unmatched != 1 {
		t.Fatalf("status lengths %+v", l)
	}
}
