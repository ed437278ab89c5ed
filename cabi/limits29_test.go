package main

import (
	"strings"
	"testing"
)

// Issue 29 rows 16 and 18: limits and durations that used to be accepted
// and then panicked, truncated or wrapped are configuration errors naming
// their key; errors inside servers["s"] name the field.
func TestConfigBoundsNameTheKey(t *testing.T) {
	const maxInt64 = "9223372036854775807"
	for _, tc := range []struct{ cfg, key string }{
		// Row 16: a push limit of 2^31 let C.GoBytes panic (poisoning the
		// handle), 2^32+16 let it copy 16 bytes; no upper bound existed.
		{`{"push":{"max_event_bytes":2147483648}}`, "push.max_event_bytes"},
		{`{"push":{"max_event_bytes":4294967312}}`, "push.max_event_bytes"},
		{`{"push":{"max_metrics_bytes":` + maxInt64 + `}}`, "push.max_metrics_bytes"},
		// Row 18: 2^63-1 ms overflowed time.Duration and became the default.
		{`{"router":{"index":{"spec_ttl_ms":` + maxInt64 + `}}}`, "router.index.spec_ttl_ms"},
		{`{"router":{"index":{"approx_ttl_ms":` + maxInt64 + `}}}`, "router.index.approx_ttl_ms"},
		{`{"router":{"load":{"stale_after_ms":` + maxInt64 + `}}}`, "router.load.stale_after_ms"},
		{`{"collectors":{"collectors":[{"name":"vllm_zmq","retry_ms":` + maxInt64 + `}]}}`, "collectors.collectors[0].retry_ms"},
		{`{"collectors":{"collectors":[{"name":"vllm_zmq","replay_timeout_ms":` + maxInt64 + `}]}}`, "collectors.collectors[0].replay_timeout_ms"},
		{`{"collectors":{"collectors":[{"name":"vllm_metrics","interval_ms":` + maxInt64 + `}]}}`, "collectors.collectors[0].interval_ms"},
		{`{"collectors":{"collectors":[{"name":"vllm_metrics","timeout_ms":604800001}]}}`, "collectors.collectors[0].timeout_ms"},
		// Row 18: servers["s"] errors name the field.
		{`{"router":{"servers":{"s":{"block_size":-1}}}}`, `router.servers["s"].block_size`},
		{`{"router":{"servers":{"s":{"block_size":70000}}}}`, `router.servers["s"].block_size`},
		{`{"router":{"servers":{"s":{"capacity":-1}}}}`, `router.servers["s"].capacity`},
	} {
		res := abiValidate([]byte(tc.cfg), int64(len(tc.cfg)), false)
		if res.Code != codeInvalidConfig || !strings.HasPrefix(res.Err, tc.key+": ") {
			t.Errorf("%s: code %d, message %q; want KVR_INVALID_CONFIG starting with %q", tc.cfg, res.Code, res.Err, tc.key+": ")
		}
	}
	// The largest accepted values still work.
	for _, cfg := range []string{
		`{"push":{"max_event_bytes":1073741824,"max_metrics_bytes":1073741824}}`,
		`{"router":{"index":{"spec_ttl_ms":604800000}}}`,
		`{"collectors":{"collectors":[{"name":"vllm_zmq","retry_ms":604800000}]}}`,
	} {
		if res := abiValidate([]byte(cfg), int64(len(cfg)), false); res.Code != codeOK {
			t.Errorf("%s: %d %s", cfg, res.Code, res.Err)
		}
	}
}

// Issue 29 row 17: kvr_acquire_with trusted opts.size up to 1 MiB (reading
// past the caller's struct until a guard page aborted the process), and a
// size that split a field half-copied it. Only the published layouts, or a
// newer caller's larger struct of whole fields within a bound, are read.
func TestAcquireOptsSizeValidated(t *testing.T) {
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
	for _, tc := range []struct {
		size uint64
		ok   bool
	}{
		{40, true}, {72, true}, {full, true}, {full + 8, true}, {full + 128, true},
		{44, false}, {48, false}, {76, false}, {80, false}, // split or between layouts
		{full + 4, false}, {full + 136, false}, {1 << 20, false}, {^uint64(0), false},
	} {
		var tail []byte
		if tc.size > full && tc.size <= 2<<20 {
			tail = make([]byte, tc.size-full) // zeros: a newer caller's unused fields
		}
		_, _, res := abiAcquireWith(h, "r", toks, -1, -1, tc.size, tail, false)
		if got := res.Code == codeOK; got != tc.ok {
			t.Errorf("opts.size %d: code %d %q, want ok=%v", tc.size, res.Code, res.Err, tc.ok)
		}
		if !tc.ok && (res.Code != codeInvalidArgument || !strings.Contains(res.Err, "not a kvr_acquire_opts size")) {
			t.Errorf("opts.size %d: %d %q", tc.size, res.Code, res.Err)
		}
	}
}
