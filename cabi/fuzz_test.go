package main

import (
	"encoding/binary"
	"strings"
	"testing"

	json "github.com/goccy/go-json"

	"github.com/kvc-router/kvc-router/core/kvcrouter"
)

// opReader turns fuzz input into a stream of small decisions and buffers.
type opReader struct{ b []byte }

func (r *opReader) byte() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *opReader) u64() uint64 {
	var v [8]byte
	n := copy(v[:], r.b)
	r.b = r.b[n:]
	return binary.LittleEndian.Uint64(v[:])
}

// bytes takes a length-prefixed chunk (up to 255 bytes), or one of a few
// well-formed payloads so the fuzzer also reaches the success paths.
func (r *opReader) bytes() []byte {
	n := int(r.byte())
	switch n {
	case 250:
		return []byte(`["a:1","b:2"]`)
	case 251:
		return []byte("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} 3\n")
	case 252:
		return []byte{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90, 0x00} // [0.0, [], 0]
	case 253:
		return []byte(`[{"endpoint":"tcp://127.0.0.1:1"}]`)
	}
	n = min(n, len(r.b))
	out := append([]byte{}, r.b[:n]...)
	r.b = r.b[n:]
	return out
}

// arg picks a (buffer, declared length) pair: honest, negative, huge, a
// short read, or NULL with a positive length. The declared length never
// exceeds the buffer unless the export must reject it before reading.
func (r *opReader) arg(buf []byte) ([]byte, int64) {
	switch r.byte() % 6 {
	case 1:
		return buf, -1 - int64(r.byte())
	case 2:
		return buf, 1 << 40
	case 3:
		return buf, int64(len(buf) / 2)
	case 4:
		return nil, 1 + int64(r.byte())
	case 5:
		return nil, 0
	}
	return buf, int64(len(buf))
}

const fuzzRouterConfig = `{"router":{"mode":"kvc_aware","max_prompt_tokens":64,"index":{"max_entries":256},"admission":{"enabled":true,"max_inflight":2,"max_queue":4},"lengths":{"enabled":true}},"push":{"max_metrics_bytes":4096,"max_event_bytes":4096}}`

// safeConfig reports whether a fuzzed kvr_router_new config may be passed
// on: it must start no collector (they would dial whatever the input names)
// and not change GOMAXPROCS. It decodes exactly as newInstance does.
func safeConfig(data []byte) bool {
	c, err := kvcrouter.Parse(data)
	if err != nil {
		return true // newInstance fails identically, before starting anything
	}
	return c.MaxProcs == 0 && len(c.Collectors.Collectors) == 0
}

func checkResult(t *testing.T, what string, res abiResult) {
	t.Helper()
	switch {
	case res.Code == codeInternal || res.Code == codePoisoned:
		t.Fatalf("%s: Go panic reached the ABI: %d %q", what, res.Code, res.Err)
	case res.Code < 0 || res.Code > codeQueueFull:
		t.Fatalf("%s: status code %d out of range", what, res.Code)
	case (res.Code == codeOK || res.Code == codeHeld) && res.Err != "":
		t.Fatalf("%s: code %d with a message %q", what, res.Code, res.Err)
	case res.Code == codeHeld && res.Out != "":
		t.Fatalf("%s: held with an output %q", what, res.Out)
	case res.Code != codeOK && res.Code != codeHeld && res.Err == "":
		t.Fatalf("%s: code %d without a message", what, res.Code)
	case !utf8Valid(res.Err):
		t.Fatalf("%s: message is not UTF-8", what)
	}
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }

// FuzzABI drives every export with fuzz-chosen handles (live, closed, 0,
// arbitrary), pointers (NULL or not), lengths (negative, huge, short),
// invalid UTF-8 and malformed JSON, msgpack and metrics text, and checks that
// each call returns a status code and message and never panics, and that a
// live handle stays consistent.
func FuzzABI(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 0, 5, 'r', 'e', 'q', '-', '1', 0, 4, 1, 2, 3, 4, 0})
	f.Add([]byte{2, 0, 250, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 2, 'a', ':', 0, 8, 0})
	f.Add([]byte{5, 0, 3, 'a', ':', '1', 0, 251, 0, 1, 6, 0, 3, 'a', ':', '1', 0, 252, 0})
	f.Add([]byte{9, 12, '{', '"', 'r', 'o', 'u', 't', 'e', 'r', '"', ':', '{', '}', 0})
	f.Add([]byte{7, 0, 3, 'a', ':', '1', 0, 253, 0, 10, 0, 1, 8, 2, 1})
	f.Add([]byte{0, 1, 2, 0xff, 0xfe, 0, 0, 3, 0, 1, 4, 2, 0, 3, 1, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 4096 {
			return
		}
		before := panics.Load()
		live, res := abiNew([]byte(fuzzRouterConfig), int64(len(fuzzRouterConfig)), false)
		checkResult(t, "new", res)
		closed, _ := abiNew([]byte("{}"), 2, false)
		checkResult(t, "close", abiClose(closed))
		ids := []byte(`["a:1","b:2"]`)
		abiString(live, "add", ids, int64(len(ids)), nil, 0, 0)
		liveOpen := true
		defer func() {
			if liveOpen {
				abiClose(live)
			}
		}()
		r := &opReader{b: data}
		for step := 0; len(r.b) > 0 && step < 64; step++ {
			op := r.byte() % 14
			var h uint64
			switch r.byte() % 5 {
			case 0, 1:
				h = live
			case 2:
				h = closed
			case 3:
				h = 0
			case 4:
				h = r.u64()
			}
			switch op {
			case 0:
				id, idn := r.arg(r.bytes())
				raw := r.bytes()
				toks := make([]int32, len(raw)/4)
				for i := range toks {
					toks[i] = int32(binary.LittleEndian.Uint32(raw[4*i:]))
				}
				var tb []int32
				var tn int64
				switch r.byte() % 5 {
				case 0, 1:
					tb, tn = toks, int64(len(toks))
				case 2:
					tn = -int64(r.byte()) - 1
				case 3:
					tn = 1 << 40
				case 4:
					tn = int64(r.byte()) + 1 // NULL array with a length
				}
				lora, ln := r.arg(r.bytes())
				pin := int64(int8(r.byte()))
				_, res := abiAcquire(h, id, idn, tb, tn, pin, lora, ln, int64(int8(r.byte())))
				checkResult(t, "acquire", res)
				if res.Code == codeOK && !json.Valid([]byte(res.Out)) {
					t.Fatalf("acquire decision is not JSON: %q", res.Out)
				}
			case 1, 2, 3, 4:
				which := [...]string{"release", "add", "remove", "inflight"}[op-1]
				s, n := r.arg(r.bytes())
				checkResult(t, which, abiString(h, which, s, n, nil, 0, 0))
			case 5, 6, 7:
				which := [...]string{"metrics", "events", "endpoints"}[op-5]
				s, n := r.arg(r.bytes())
				x, xn := r.arg(r.bytes())
				checkResult(t, which, abiString(h, which, s, n, x, xn, int32(int8(r.byte()))))
			case 8:
				which := [...]string{"servers", "total", "status", "clear_sticky", "reset"}[r.byte()%5]
				res := abiPlain(h, which, r.byte()%4 == 0)
				checkResult(t, which, res)
				if res.Code == codeOK && res.Out != "" && !json.Valid([]byte(res.Out)) {
					t.Fatalf("%s: output is not JSON: %q", which, res.Out)
				}
			case 9:
				cfg, n := r.arg(r.bytes())
				// kvr_validate_config starts nothing, so any config is safe.
				vres := abiValidate(cfg, n, false)
				checkResult(t, "validate (fuzzed)", vres)
				if vres.Code == codeOK && !json.Valid([]byte(vres.Out)) {
					t.Fatalf("validate: output is not JSON: %q", vres.Out)
				}
				if !safeConfig(cfg) {
					continue
				}
				nullOut := r.byte()%8 == 0
				nh, res := abiNew(cfg, n, nullOut)
				checkResult(t, "new (fuzzed)", res)
				if !nullOut && (vres.Code == codeOK) != (res.Code == codeOK) {
					t.Fatalf("validate says %d (%s) but kvr_router_new says %d (%s)", vres.Code, vres.Err, res.Code, res.Err)
				}
				if res.Code == codeOK {
					checkResult(t, "close (fuzzed)", abiClose(nh))
				} else if nh != 0 {
					t.Fatalf("failed kvr_router_new left handle %d", nh)
				}
			case 10:
				res := abiClose(h)
				checkResult(t, "close", res)
				if h == live && res.Code == codeOK {
					liveOpen = false
				}
			case 11:
				checkResult(t, "close closed", abiClose(closed))
			case 12:
				// Admission: submit with a fuzzed ticket and submit value.
				id, _ := r.arg(r.bytes())
				size, _ := acquireOptsLayout()
				_, _, res := abiSubmit(h, string(id), []int32{int32(r.byte()), 7}, -1, -1, uint64(size), nil, false,
					uint64(r.byte()), int64(int8(r.byte()))%3)
				checkResult(t, "submit", res)
			case 13:
				var res abiResult
				switch r.byte() % 4 {
				case 0:
					s, _ := r.arg(r.bytes())
					_, res = abiReleaseAdmit(h, string(s), r.byte()%4 == 0)
				case 1:
					res = abiPump(h, r.byte()%4 == 0)
				case 2:
					_, res = abiCancel(h, uint64(r.byte()))
				case 3:
					s, _ := r.arg(r.bytes())
					rid, ridn := r.arg(r.bytes())
					_, res = abiReleaseDone(h, s, rid, ridn, int64(int8(r.byte()))<<18)
				}
				checkResult(t, "admission", res)
				if res.Code == codeOK && res.Out != "" && !json.Valid([]byte(res.Out)) {
					t.Fatalf("admitted list is not JSON: %q", res.Out)
				}
			}
		}
		if panics.Load() != before {
			t.Fatalf("%d Go panics recovered during the run", panics.Load()-before)
		}
		if !liveOpen {
			return
		}
		res = abiPlain(live, "status", false)
		checkResult(t, "final status", res)
		var st statusDoc
		if err := json.Unmarshal([]byte(res.Out), &st); err != nil {
			t.Fatalf("final status: %v", err)
		}
		sum := 0
		for _, s := range st.Router.Servers {
			if s.Load.Inflight < 0 {
				t.Fatalf("negative in-flight count: %+v", s)
			}
			sum += s.Load.Inflight
		}
		if sum != st.Router.TotalInflight {
			t.Fatalf("in-flight sum %d != total %d", sum, st.Router.TotalInflight)
		}
		if st.Router.Admission.Held > 4 {
			t.Fatalf("%d requests held, max_queue 4", st.Router.Admission.Held)
		}
		if st.Router.Index.Entries > st.Router.Index.MaxEntries {
			t.Fatalf("index over budget: %d > %d", st.Router.Index.Entries, st.Router.Index.MaxEntries)
		}
	})
}

// TestABIHostileInputs is the deterministic core of FuzzABI: every export
// with every bad handle, and every string argument NULL, negative, huge
// and invalid UTF-8.
func TestABIHostileInputs(t *testing.T) {
	live, res := abiNew([]byte(fuzzRouterConfig), int64(len(fuzzRouterConfig)), false)
	checkResult(t, "new", res)
	defer abiClose(live)
	closed, _ := abiNew([]byte("{}"), 2, false)
	abiClose(closed)
	ids := []byte(`["a:1"]`)
	if res := abiString(live, "add", ids, int64(len(ids)), nil, 0, 0); res.Code != codeOK {
		t.Fatal(res)
	}
	for _, h := range []uint64{0, closed, 0xdeadbeef, ^uint64(0)} {
		for _, which := range []string{"servers", "total", "status", "clear_sticky", "reset"} {
			if res := abiPlain(h, which, false); res.Code != codeInvalidArgument && res.Code != codeInvalidState {
				t.Fatalf("%s on handle %d: %+v", which, h, res)
			}
		}
		for _, which := range []string{"release", "add", "remove", "inflight", "metrics", "events", "endpoints"} {
			res := abiString(h, which, []byte(`["a:1"]`), 7, []byte("[]"), 2, 0)
			if res.Code != codeInvalidArgument && res.Code != codeInvalidState && res.Code != codeInvalidConfig {
				t.Fatalf("%s on handle %d: %+v", which, h, res)
			}
			checkResult(t, which, res)
		}
		if _, res := abiAcquire(h, []byte("r"), 1, nil, 0, -1, nil, 0, -1); res.Code == codeOK {
			t.Fatalf("acquire on handle %d succeeded", h)
		}
		_, ra := abiReleaseAdmit(h, "a:1", false)
		_, rc := abiCancel(h, 1)
		_, rd := abiReleaseDone(h, []byte("a:1"), []byte("r"), 1, 3)
		for _, res := range []abiResult{ra, abiPump(h, false), rc, rd} {
			if res.Code != codeInvalidArgument && res.Code != codeInvalidState {
				t.Fatalf("admission export on handle %d: %+v", h, res)
			}
		}
		if res := abiClose(h); res.Code == codeOK {
			t.Fatalf("close of handle %d succeeded", h)
		}
	}
	// lookup: an id no server can have, which release and inflight treat
	// as unknown (a counted no-op, KVR_OK) rather than as an error.
	bad := []struct {
		buf    []byte
		n      int64
		lookup bool
	}{{nil, 5, false}, {[]byte("abc"), -1, false}, {[]byte("abc"), -1 << 62, false}, {[]byte("abc"), 1 << 40, true},
		{nil, 1 << 62, false}, {[]byte{0xff, 0xfe, 0xfd}, 3, true}}
	for _, b := range bad {
		for _, which := range []string{"release", "add", "remove", "inflight", "metrics", "events", "endpoints"} {
			res := abiString(live, which, b.buf, b.n, []byte("x"), 1, 0)
			want := int32(codeInvalidArgument)
			if b.lookup && (which == "release" || which == "inflight") {
				want = codeOK
			}
			if res.Code != want {
				t.Fatalf("%s(%q, %d): %+v", which, b.buf, b.n, res)
			}
		}
		for _, which := range []string{"metrics", "events", "endpoints"} {
			res := abiString(live, which, []byte("a:1"), 3, b.buf, b.n, 0)
			if res.Code != codeInvalidArgument {
				t.Fatalf("%s payload (%q, %d): %+v", which, b.buf, b.n, res)
			}
		}
		if _, res := abiAcquire(live, b.buf, b.n, nil, 0, -1, nil, 0, -1); res.Code != codeInvalidArgument {
			t.Fatalf("acquire id (%q, %d): %+v", b.buf, b.n, res)
		}
		if _, res := abiAcquire(live, []byte("r"), 1, nil, 0, -1, b.buf, b.n, -1); res.Code != codeInvalidArgument {
			t.Fatalf("acquire lora (%q, %d): %+v", b.buf, b.n, res)
		}
		if b.buf == nil || b.n < 0 || b.n > 64 {
			if _, res := abiNew(b.buf, b.n, false); res.Code != codeInvalidArgument {
				t.Fatalf("new (%q, %d): %+v", b.buf, b.n, res)
			}
		}
	}
	for _, n := range []int64{-1, -1 << 62, 65, 1 << 40} {
		if _, res := abiAcquire(live, []byte("r"), 1, nil, n, -1, nil, 0, -1); res.Code != codeInvalidArgument {
			t.Fatalf("acquire with %d tokens: %+v", n, res)
		}
	}
	if _, res := abiAcquire(live, []byte("r"), 1, []int32{1, 2}, 2, -7, nil, 0, -1); res.Code != codeInvalidArgument {
		t.Fatalf("pin -7: %+v", res)
	}
	for _, which := range []string{"servers", "total", "status"} {
		if res := abiPlain(live, which, true); res.Code != codeInvalidArgument || !strings.Contains(res.Err, "NULL") {
			t.Fatalf("%s with NULL out: %+v", which, res)
		}
	}
	for _, cfg := range []string{"{", `{"router":{"mode":"x"}}`, `{"router":{"sticky_max_size":-1}}`, `{"push":{"max_event_bytes":-1}}`,
		`{"collectors":{"collectors":[{"name":"os.system"}]}}`, `{"collectors":{"collectors":[{"name":"vllm_metrics","interval_ms":-5}]}}`,
		`{"router":{"index":{"max_entries":-1}}}`, `{"router":{}} trailing`, "\xff\xfe"} {
		if h, res := abiNew([]byte(cfg), int64(len(cfg)), false); res.Code != codeInvalidConfig || h != 0 {
			t.Fatalf("config %q: handle %d, %+v", cfg, h, res)
		}
	}
	if _, res := abiNew([]byte("{}"), 2, true); res.Code != codeInvalidArgument {
		t.Fatalf("NULL out_handle: %+v", res)
	}
	if n := panics.Load(); n != 0 {
		t.Fatalf("%d panics recovered", n)
	}
}
