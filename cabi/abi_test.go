package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	json "github.com/goccy/go-json"
)

// statusCodes is every status code the Go side returns, by its header name.
var statusCodes = map[string]int{
	"KVR_OK": codeOK, "KVR_INVALID_ARGUMENT": codeInvalidArgument, "KVR_NOT_FOUND": codeNotFound,
	"KVR_INVALID_STATE": codeInvalidState, "KVR_INTERNAL": codeInternal, "KVR_POISONED": codePoisoned,
	"KVR_NO_SERVERS": codeNoServers, "KVR_INVALID_CONFIG": codeInvalidConfig, "KVR_HELD": codeHeld,
	"KVR_QUEUE_FULL": codeQueueFull,
}

// headerDefines reads kvcrouter.h's integer #defines and its function
// declarations, split into the release ABI and the KVR_TEST_BUILD block.
func headerDefines(t *testing.T) (defs map[string]int, release, testOnly []string) {
	t.Helper()
	f, err := os.Open("kvcrouter.h")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	def := regexp.MustCompile(`^#define (KVR_[A-Z_]+) (-?\d+)`)
	fn := regexp.MustCompile(`^int32_t (kvr_[a-z_]+)\(|^void (kvr_[a-z_]+)\(`)
	defs = map[string]int{}
	inTest := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "#ifdef KVR_TEST_BUILD":
			inTest = true
		case inTest && line == "#endif":
			inTest = false
		}
		if m := def.FindStringSubmatch(line); m != nil {
			n, _ := strconv.Atoi(m[2])
			defs[m[1]] = n
		}
		if m := fn.FindStringSubmatch(line); m != nil {
			name := m[1] + m[2]
			if inTest {
				testOnly = append(testOnly, name)
			} else {
				release = append(release, name)
			}
		}
	}
	return defs, release, testOnly
}

// goExports lists the //export names of the non-test Go files, split by
// whether the file is only in the kvrdebug build.
func goExports(t *testing.T) (release, testOnly []string) {
	t.Helper()
	files, _ := filepath.Glob("*.go")
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		tagged := bytes.HasPrefix(src, []byte("//go:build kvrdebug"))
		for _, m := range regexp.MustCompile(`(?m)^//export (\w+)$`).FindAllSubmatch(src, -1) {
			if tagged {
				testOnly = append(testOnly, string(m[1]))
			} else {
				release = append(release, string(m[1]))
			}
		}
	}
	return release, testOnly
}

// TestHeaderMatchesGo: kvcrouter.h is the one definition of the status
// codes, the ABI version and the exports; the Go side must agree with it.
func TestHeaderMatchesGo(t *testing.T) {
	defs, hRelease, hTest := headerDefines(t)
	if defs["KVR_ABI_VERSION"] != abiVersion || defs["KVR_ABI_MINOR"] != abiMinor {
		t.Errorf("KVR_ABI_VERSION.MINOR %d.%d in the header, %d.%d in Go", defs["KVR_ABI_VERSION"], defs["KVR_ABI_MINOR"], abiVersion, abiMinor)
	}
	codes := map[string]int{}
	for name, v := range defs {
		if !strings.HasPrefix(name, "KVR_ABI_") && !strings.HasPrefix(name, "KVR_METRICS_") {
			codes[name] = v
		}
	}
	if len(codes) != len(statusCodes) {
		t.Errorf("header status codes %v, Go %v", codes, statusCodes)
	}
	for name, v := range statusCodes {
		if hv, ok := codes[name]; !ok || hv != v {
			t.Errorf("%s: header %d (present %v), Go %d", name, hv, ok, v)
		}
	}
	gRelease, gTest := goExports(t)
	slices.Sort(hRelease)
	slices.Sort(gRelease)
	if !slices.Equal(hRelease, gRelease) {
		t.Errorf("release exports: header %v, Go %v", hRelease, gRelease)
	}
	if !slices.Equal(hTest, gTest) || len(gTest) == 0 {
		t.Errorf("test-build exports: header %v, Go %v", hTest, gTest)
	}
}

// TestLibraryLinksNoTooling: the shipped library must not depend on the
// proving ground (testbed/: simulator, benchmark, peer routers) or cmd, and
// the C shell reaches the library only through its one public package.
func TestLibraryLinksNoTooling(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go not on PATH")
	}
	for _, tags := range []string{"", "kvrdebug"} {
		cmd := exec.Command(goBin, "list", "-deps", "-tags", tags, ".")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list -deps: %v", err)
		}
		deps := strings.Fields(string(out))
		if !slices.Contains(deps, "github.com/kvc-router/kvc-router/core/internal/router") {
			t.Fatalf("go list -deps output does not look like cabi's dependencies: %v", deps)
		}
		for _, d := range deps {
			if strings.Contains(d, "/kvc-router/testbed") || strings.Contains(d, "/kvc-router/cmd/") || strings.Contains(d, "gonum.org/") {
				t.Errorf("tags %q: ./cabi depends on %s", tags, d)
			}
		}
		imp := exec.Command(goBin, "list", "-tags", tags, "-f", `{{join .Imports "\n"}}`, ".")
		out, err = imp.Output()
		if err != nil {
			t.Fatalf("go list -f imports: %v", err)
		}
		for _, d := range strings.Fields(string(out)) {
			if strings.HasPrefix(d, "github.com/kvc-router/kvc-router/") && d != "github.com/kvc-router/kvc-router/core/kvcrouter" {
				t.Errorf("tags %q: ./cabi imports %s directly; go through core/kvcrouter", tags, d)
			}
		}
	}
}

func TestValidateConfigReportsDefaults(t *testing.T) {
	for _, tc := range []struct {
		cfg, mode, strategy string
		params              map[string]any
	}{
		{"", "default", "least_inflight", map[string]any{}},
		{`{"router":{"mode":"kvc_aware"}}`, "kvc_aware", "kvc_aware", map[string]any{
			"alpha": 0.3, "load_threshold": 0.9, "layer_weights": map[string]any{"gpu": 0.7, "cpu": 0.2, "ssd": 0.1},
			"marginal": true, "token_load": true, "kv_tokens": 480000.0, "saved_scale_tokens": 4096.0,
			"session_weight": 0.5, "sibling_spread": false, "group_spread": 0.1, "group_spread_min_ratio": 4.0, "group_spread_min_corr": 0.25, "group_spread_open_corr": 0.0, "group_spread_open_max_servers": 2, "group_spread_open_ratio": 1.0, "group_spread_max_servers": 0, "task_spread": 0.1, "task_spread_min_corr": 0.25, "work_weight": 0.0,
		}},
	} {
		res := abiValidate([]byte(tc.cfg), int64(len(tc.cfg)), false)
		if res.Code != codeOK {
			t.Fatalf("%q: %d %s", tc.cfg, res.Code, res.Err)
		}
		var doc struct {
			Router struct {
				Mode          string `json:"mode"`
				Turns         string `json:"turns"`
				StickyMaxSize int    `json:"sticky_max_size"`
				Strategies    []struct {
					Name   string         `json:"name"`
					Weight float64        `json:"weight"`
					Params map[string]any `json:"params"`
				} `json:"strategies"`
			} `json:"router"`
			LogLevel string `json:"log_level"`
		}
		if err := json.Unmarshal([]byte(res.Out), &doc); err != nil {
			t.Fatal(err)
		}
		r := doc.Router
		if r.Mode != tc.mode || r.Turns != "auto" || r.StickyMaxSize != 10000 || len(r.Strategies) != 1 || doc.LogLevel != "warn" {
			t.Fatalf("%q: %s", tc.cfg, res.Out)
		}
		s := r.Strategies[0]
		if s.Name != tc.strategy || s.Weight != 1 || len(s.Params) != len(tc.params) {
			t.Fatalf("%q: strategy %+v", tc.cfg, s)
		}
		for k, v := range tc.params {
			got, _ := json.Marshal(s.Params[k])
			want, _ := json.Marshal(v)
			if !bytes.Equal(got, want) {
				t.Errorf("%q: params.%s = %s, want %s", tc.cfg, k, got, want)
			}
		}
	}
	// A configured value wins over the default; the effective config
	// validates again to itself.
	cfg := `{"router":{"mode":"kvc_aware","strategies":[{"name":"kvc_aware","weight":2,"params":{"kv_tokens":1000}}]}}`
	res := abiValidate([]byte(cfg), int64(len(cfg)), false)
	if res.Code != codeOK || !strings.Contains(res.Out, `"kv_tokens":1000`) || !strings.Contains(res.Out, `"alpha":0.3`) {
		t.Fatalf("%d %s %s", res.Code, res.Err, res.Out)
	}
	again := abiValidate([]byte(res.Out), int64(len(res.Out)), false)
	if again.Code != codeOK || again.Out != res.Out {
		t.Fatalf("effective config is not a fixed point: %d %s\n%s\n%s", again.Code, again.Err, res.Out, again.Out)
	}
	if res := abiValidate([]byte(cfg), int64(len(cfg)), true); res.Code != codeOK {
		t.Fatalf("NULL out_json: %d %s", res.Code, res.Err)
	}
}

// TestConfigErrorsNameTheKey: every rejected configuration is
// KVR_INVALID_CONFIG with a message that starts with the key path.
func TestConfigErrorsNameTheKey(t *testing.T) {
	for _, tc := range []struct{ cfg, key string }{
		{`{"routr":{}}`, "routr"},
		{`{"max_procs":-1}`, "max_procs"},
		{`{"max_procs":"2"}`, "max_procs"},
		{`{"log_level":"loud"}`, "log_level"},
		{`{"push":{"max_event_bytes":-1}}`, "push.max_event_bytes"},
		{`{"router":{"mode":"fast"}}`, "router.mode"},
		{`{"router":{"sticky_max_size":-3}}`, "router.sticky_max_size"},
		{`{"router":{"sticky_max_size":1.5}}`, "router.sticky_max_size"},
		{`{"router":{"block_size":70000}}`, "router.block_size"},
		{`{"router":{"index":{"max_entries":-1}}}`, "router.index.max_entries"},
		{`{"router":{"index":{"max_entriez":1}}}`, "router.index.max_entriez"},
		{`{"router":{"load":{"unhealthy_after":true}}}`, "router.load.unhealthy_after"},
		{`{"router":{"servers":{"a:1":{"capacity":-1}}}}`, `router.servers["a:1"].capacity`},
		{`{"router":{"servers":{"a:1":{"evnts":true}}}}`, `router.servers["a:1"].evnts`},
		{`{"router":{"strategies":[{"name":"nope","weight":1}]}}`, "router.strategies[0].name"},
		{`{"router":{"mode":"kvc_aware","strategies":[{"name":"kvc_aware","weight":0}]}}`, "router.strategies[0].weight"},
		{`{"router":{"mode":"kvc_aware","strategies":[{"name":"kvc_aware","weight":1,"params":{"alpha":2}}]}}`, "router.strategies[0].params.alpha"},
		{`{"router":{"mode":"kvc_aware","strategies":[{"name":"kvc_aware","weight":1,"params":{"alfa":2}}]}}`, "router.strategies[0].params.alfa"},
		{`{"router":{"mode":"kvc_aware","strategies":[{"name":"kvc_aware","weight":1,"params":{"kv_tokens":"x"}}]}}`, "router.strategies[0].params.kv_tokens"},
		{`{"router":{"mode":"kvc_aware","strategies":[{"name":"kvc_aware","weight":1,"params":{"layer_weights":{"hbm":1}}}]}}`, "router.strategies[0].params.layer_weights.hbm"},
		{`{"router":{"strategies":[{"name":"kvc_aware","weight":1}]}}`, "router.strategies[0].name"},
		{`{"router":{"strategies":[{"name":"least_inflight","weight":1,"params":{"x":1}}]}}`, "router.strategies[0].params.x"},
		{`{"collectors":{"collectors":[{"name":"vllm_metrics","interval_ms":-1}]}}`, "collectors.collectors[0].interval_ms"},
		{`{"collectors":{"collectors":[{"name":"vllm_metrics","intervl_ms":1}]}}`, "collectors.collectors[0].intervl_ms"},
		{`{"collectors":{"collectors":[{"name":"x"}]}}`, "collectors.collectors[0].name"},
		{`{"collectors":{"collectors":[{"name":"vllm_metrics","urls":{"a":"ftp://a"}}]}}`, `collectors.collectors[0].urls["a"]`},
	} {
		res := abiValidate([]byte(tc.cfg), int64(len(tc.cfg)), false)
		if res.Code != codeInvalidConfig || !strings.HasPrefix(res.Err, tc.key+": ") {
			t.Errorf("%s: code %d, message %q; want KVR_INVALID_CONFIG starting with %q", tc.cfg, res.Code, res.Err, tc.key+": ")
		}
		// kvr_router_new rejects it with the same message.
		if h, nres := abiNew([]byte(tc.cfg), int64(len(tc.cfg)), false); nres.Code != codeInvalidConfig || nres.Err != res.Err || h != 0 {
			t.Errorf("%s: kvr_router_new %d %q, kvr_validate_config %q", tc.cfg, nres.Code, nres.Err, res.Err)
		}
	}
	if res := abiValidate(nil, 5, false); res.Code != codeInvalidArgument {
		t.Fatalf("NULL config with a length: %d", res.Code)
	}
}
