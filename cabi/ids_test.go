package main

import (
	"strings"
	"testing"

	json "github.com/goccy/go-json"
)

// Issue 20 D3/D4: server ids are checked once at the boundary. An id that
// is not valid UTF-8 (raw bytes, or a JSON-escaped lone surrogate, as
// Python's json.dumps writes one) used to be rewritten to U+FFFD, merging
// servers and losing releases; an id with NUL was accepted and came back
// truncated from kvr_acquire's NUL-terminated out_server.
func TestServerIDsCheckedAtTheBoundary(t *testing.T) {
	h, res := abiNew([]byte(`{}`), 2, false)
	if res.Code != codeOK {
		t.Fatal(res)
	}
	defer abiClose(h)
	add := func(list string) abiResult {
		return abiString(h, "add", []byte(list), int64(len(list)), nil, 0, 0)
	}
	refused := []struct{ list, want string }{
		{"[\"a\xffb\"]", "server id list JSON: invalid UTF-8 at byte 3"},
		{`["x\ud800y"]`, `unpaired UTF-16 surrogate escape \ud800 at byte 3`},
		{`["x\udc80"]`, `unpaired UTF-16 surrogate escape \udc80`},
		{`["\ude00\ud83d"]`, `unpaired UTF-16 surrogate escape \ude00`},
		{`["ok", "a\u0000b"]`, "server id 1: invalid server id: contains a NUL byte at offset 1"},
		{`[""]`, "server id 0: invalid server id: empty"},
		{`["` + strings.Repeat("x", maxIDBytes+1) + `"]`, "more than the limit of 65536"},
	}
	for _, c := range refused {
		res := add(c.list)
		if res.Code != codeInvalidArgument || !strings.Contains(res.Err, c.want) {
			t.Errorf("add %.40q: %+v, want %q", c.list, res, c.want)
		}
	}
	if out := abiPlain(h, "servers", false).Out; out != "[]" {
		t.Fatalf("pool after refused adds: %s", out)
	}
	// Escaped pairs, raw UTF-8 and a literal U+FFFD are ordinary ids and
	// come back from kvr_acquire byte for byte.
	ids := []string{"\U0001F600-emoji", "é-raw", "\uFFFD-literal"}
	list := `["\ud83d\ude00-emoji", "é-raw", "\ufffd-literal"]`
	if res := add(list); res.Code != codeOK {
		t.Fatal(res)
	}
	seen := map[string]bool{}
	for i := 0; i < 64 && len(seen) < len(ids); i++ {
		srv, n, res := abiAcquireServer(h, "r"+strings.Repeat("x", i))
		if res.Code != codeOK || n != len(srv) {
			t.Fatalf("acquire: %q (strlen %d) %+v", srv, n, res)
		}
		seen[srv] = true
	}
	for _, id := range ids {
		if !seen[id] {
			t.Fatalf("id %q never returned (got %v)", id, seen)
		}
	}
	var pool []string
	_ = json.Unmarshal([]byte(abiPlain(h, "servers", false).Out), &pool)
	if strings.Join(pool, "|") != strings.Join(ids, "|") {
		t.Fatalf("pool %q", pool)
	}

	// Events, metrics and endpoints for an impossible id: a precise error.
	for _, which := range []string{"metrics", "events", "endpoints"} {
		res := abiString(h, which, []byte("a\x00b"), 3, []byte("[]"), 2, 0)
		if res.Code != codeInvalidArgument || !strings.Contains(res.Err, "server_id: invalid server id: contains a NUL byte") {
			t.Errorf("%s: %+v", which, res)
		}
	}
	// Releases and in-flight lookups of impossible ids are unknown ids:
	// no-ops, counted in status.
	long := []byte(strings.Repeat("x", maxIDBytes+1))
	for _, id := range [][]byte{long, []byte("a\x00b"), []byte("\xff"), {}} {
		for _, which := range []string{"release", "inflight"} {
			if res := abiString(h, which, id, int64(len(id)), nil, 0, 0); res.Code != codeOK {
				t.Fatalf("%s(%.20q): %+v", which, id, res)
			}
		}
	}
	var st struct {
		Ignored uint64 `json:"ignored_invalid_ids"`
	}
	if err := json.Unmarshal([]byte(abiPlain(h, "status", false).Out), &st); err != nil || st.Ignored != 8 {
		t.Fatalf("ignored_invalid_ids %d (%v)", st.Ignored, err)
	}
}

func TestCheckJSONText(t *testing.T) {
	ok := []string{`[]`, `["a"]`, `["\\ud800"]`, `["\"\ud83d\ude00"]`, `["\u00e9", "\n"]`, "[\"é\"]", `["\u12"]`}
	for _, s := range ok {
		if err := checkJSONText([]byte(s)); err != nil {
			t.Errorf("%q: %v", s, err)
		}
	}
	bad := []string{`["\ud800"]`, `["\ud800\u0041"]`, `["\udfff"]`, `["\ud800`, "[\"\xc3\"]"}
	for _, s := range bad {
		if err := checkJSONText([]byte(s)); err == nil {
			t.Errorf("%q accepted", s)
		}
	}
}
