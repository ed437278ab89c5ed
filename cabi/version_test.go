package main

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	json "github.com/goccy/go-json"
)

func TestVersion(t *testing.T) {
	if kvr_abi_minor() != abiMinor {
		t.Fatal("kvr_abi_minor")
	}
	res := abiVersionJSON(false)
	if res.Code != codeOK {
		t.Fatalf("%+v", res)
	}
	var doc versionDoc
	if err := json.Unmarshal([]byte(res.Out), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Version == "" || doc.ABIVersion != abiVersion || doc.ABIMinor != abiMinor || !strings.HasPrefix(doc.GoVersion, "go") {
		t.Fatalf("%s", res.Out)
	}
}

func TestConfigSchema(t *testing.T) {
	res := abiVersionJSON(true)
	var s struct {
		Targets    map[string]string
		Collectors []string
	}
	if res.Code != codeOK || json.Unmarshal([]byte(res.Out), &s) != nil {
		t.Fatalf("%+v", res)
	}
	if s.Targets["kvc_router.config.KVCAwareStrategyConfig"] != "kvc_aware" || len(s.Collectors) != 4 {
		t.Fatalf("%s", res.Out)
	}
}

// TestAcquireOptsLayout: the struct cgo compiles is the header's, field
// for field, and its layout has no padding (every field 8 bytes, LP64).
func TestAcquireOptsLayout(t *testing.T) {
	typedef := regexp.MustCompile(`(?s)typedef struct kvr_acquire_opts \{(.*?)\} kvr_acquire_opts;`)
	fields := func(file string) string {
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		m := typedef.FindSubmatch(src)
		if m == nil {
			t.Fatalf("%s: no kvr_acquire_opts", file)
		}
		return strings.Join(strings.Fields(string(m[1])), " ")
	}
	if h, g := fields("kvcrouter.h"), fields("version.go"); h != g {
		t.Fatalf("header fields\n  %s\ncgo copy\n  %s", h, g)
	}
	size, offs := acquireOptsLayout()
	for i, o := range offs {
		if o != uintptr(8*i) {
			t.Fatalf("field %d at offset %d", i, o)
		}
	}
	if size != uintptr(8*len(offs)) {
		t.Fatalf("size %d", size)
	}
}

// TestAcquireWith: the growable acquire routes as kvr_acquire does; a
// short size takes the later fields' defaults; bytes of fields this
// library does not know are accepted only when zero.
func TestAcquireWith(t *testing.T) {
	cfg := []byte(`{"router":{"mode":"kvc_aware"}}`)
	h, res := abiNew(cfg, int64(len(cfg)), false)
	if res.Code != codeOK {
		t.Fatalf("%+v", res)
	}
	defer abiClose(h)
	ids := []byte(`["a:1","b:1"]`)
	if r := abiString(h, "add", ids, int64(len(ids)), nil, 0, 0); r.Code != codeOK {
		t.Fatalf("%+v", r)
	}
	size, _ := acquireOptsLayout()
	full := uint64(size)
	toks := make([]int32, 64)
	cases := []struct {
		name       string
		size       uint64
		pin, known int64
		tail       []byte
		nilOpts    bool
		code       int32
		err        string
		wantServer bool
	}{
		{name: "full size, generation known", size: full, pin: -1, known: 2, code: codeOK},
		{name: "full size, generation unknown", size: full, pin: -1, known: -1, code: codeOK, wantServer: true},
		{name: "pin", size: full, pin: 1, known: -1, code: codeOK, wantServer: true},
		{name: "first-version size: defaults", size: 40, pin: 1, known: 1, code: codeOK, wantServer: true},
		{name: "too small", size: 39, code: codeInvalidArgument, err: "smaller than the first kvr_acquire_opts"},
		{name: "zero size", size: 0, code: codeInvalidArgument, err: "smaller"},
		{name: "huge size", size: 1 << 40, code: codeInvalidArgument, err: "not a kvr_acquire_opts size"},
		{name: "newer caller, zero new fields", size: full + 16, pin: -1, known: -1, tail: make([]byte, 16), code: codeOK, wantServer: true},
		{name: "newer caller, a new field set", size: full + 16, tail: append(make([]byte, 9), 1, 0, 0, 0, 0, 0, 0), code: codeInvalidArgument, err: fmt.Sprintf("byte %d is set", full+9)},
		{name: "ABI 1.1 size: no admission fields", size: 72, pin: -1, known: -1, code: codeOK, wantServer: true},
		{name: "NULL opts", nilOpts: true, code: codeInvalidArgument, err: "opts is NULL"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			idx, srv, res := abiAcquireWith(h, "req-"+tc.name, toks, tc.pin, tc.known, tc.size, tc.tail, tc.nilOpts)
			if res.Code != tc.code || !strings.Contains(res.Err, tc.err) {
				t.Fatalf("got %d %q, want %d %q", res.Code, res.Err, tc.code, tc.err)
			}
			if tc.code != codeOK {
				if idx != -1 || srv != "" || res.Out != "" {
					t.Fatalf("outputs set on failure: %d %q %q", idx, srv, res.Out)
				}
				return
			}
			if idx < 0 || idx > 1 || (srv != "") != tc.wantServer {
				t.Fatalf("index %d server %q", idx, srv)
			}
			if tc.pin >= 0 && tc.size == full && idx != int32(tc.pin) {
				t.Fatalf("pin %d ignored: index %d", tc.pin, idx)
			}
			var d struct{ Server string }
			if err := json.Unmarshal([]byte(res.Out), &d); err != nil || d.Server == "" {
				t.Fatalf("decision %q", res.Out)
			}
		})
	}
}

// TestValidateErrorJSON: a rejected configuration also comes back as
// {"key", "reason"}.
func TestValidateErrorJSON(t *testing.T) {
	cfg := []byte(`{"router":{"mode":"kvc_aware","strategies":[{"name":"kvc_aware","weight":1,"params":{"alpha":2}}]}}`)
	res := abiValidate(cfg, int64(len(cfg)), false)
	if res.Code != codeInvalidConfig {
		t.Fatalf("%+v", res)
	}
	var fe struct{ Key, Reason string }
	if err := json.Unmarshal([]byte(res.Out), &fe); err != nil {
		t.Fatalf("%q: %v", res.Out, err)
	}
	if fe.Key != "router.strategies[0].params.alpha" || res.Err != fe.Key+": "+fe.Reason {
		t.Fatalf("%+v vs %q", fe, res.Err)
	}
	if res := abiValidate(cfg, int64(len(cfg)), true); res.Code != codeInvalidConfig || res.Out != "" {
		t.Fatalf("NULL out_json: %+v", res)
	}
}
