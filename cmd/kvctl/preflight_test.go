package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

const vllmMetrics = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n" +
	"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 1.0\n" +
	"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n"

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// The configuration is checked as the library checks it: a whole verl YAML
// is recognised, its errors name the key as the user wrote it.
func TestPreflightConfig(t *testing.T) {
	verl := func(router string) string {
		return "trainer:\n  total_epochs: 1\nactor_rollout_ref:\n  rollout:\n    name: vllm\n    router:\n" + router
	}
	for _, tc := range []struct {
		name, config, stdin string
		code                int
		want                []string
	}{
		{"no config: the default router", "", "", 0, []string{"config: OK the default router", "mode default",
			"servers: none to probe", "preflight: OK"}},
		{"whole verl YAML", verl("      type: kvc_aware\n      config:\n        kv_events: auto\n"), "", 0,
			[]string{"mode kvc_aware", "kv_events: auto: the verl hook gives each replica", "preflight: OK"}},
		{"whole verl YAML, unknown key", verl("      type: kvc_aware\n      bogus: 1\n"), "", 1,
			[]string{"config: FAIL actor_rollout_ref.rollout.router.bogus: unknown key (allowed keys here: 'config', 'type')",
				"what to do: fix that key"}},
		{"router block, bad value", "type: kvc_aware\nconfig:\n  kv_events: sometimes\n", "", 1,
			[]string{"config: FAIL config.kv_events", "sometimes"}},
		{"bad router type", "type: fastest\n", "", 1, []string{"config: FAIL type:", "'kvc_aware'"}},
		{"JSON on stdin", "-", `{"type": "kvc_aware"}`, 0, []string{"config: OK -: mode kvc_aware"}},
		{"not YAML", "type: [kvc_aware\n", "", 1, []string{"config: FAIL not valid YAML or JSON"}},
		{"non-finite number", "type: kvc_aware\nconfig:\n  load_threshold: .nan\n", "", 1,
			[]string{"config: FAIL router_config.config.load_threshold: must be a finite number"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"preflight"}
			switch tc.config {
			case "":
			case "-":
				args = append(args, "--config", "-")
			default:
				args = append(args, "--config", writeFile(t, "verl.yaml", tc.config))
			}
			code, out, errs := runCmd(t, tc.stdin, args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\n%s%s", code, tc.code, out, errs)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
		})
	}
	if code, _, _ := runCmd(t, "", "preflight", "--config", filepath.Join(t.TempDir(), "absent.yaml")); code != 1 {
		t.Fatalf("a missing file: exit %d", code)
	}
	if code, _, _ := runCmd(t, "", "preflight", "extra"); code != 2 {
		t.Fatalf("a positional argument: exit %d", code)
	}
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// silentListener accepts connections and never writes (not a ZMQ peer).
func silentListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// Every server the configuration names (and every --server) is probed
// against real loopback servers: /metrics answered and parsed, refused or
// answered with an error; a KV-event publisher that speaks ZMQ, one that
// is closed and one that listens but never greets (bounded by --timeout).
func TestPreflightProbes(t *testing.T) {
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprint(w, vllmMetrics)
	}))
	defer ok.Close()
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "boom", http.StatusInternalServerError)
	}))
	defer broken.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := zmq4.NewPub(ctx)
	defer pub.Close()
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	okID := strings.TrimPrefix(ok.URL, "http://")
	brokenID := strings.TrimPrefix(broken.URL, "http://")
	down := closedAddr(t)
	silent := silentListener(t)
	replay := silentListener(t) // the replay probe only connects
	cfg := fmt.Sprintf(`type: kvc_aware
config:
  strategies:
    - _target_: kvc_router.config.KVCAwareStrategyConfig
      collector_names: [vllm_metrics, vllm_zmq]
  collector:
    urls:
      %[1]q: %[2]q
    endpoints:
      %[1]q:
        - {endpoint: "tcp://%[3]s", replay: "tcp://%[4]s", topic: kv}
      %[5]q:
        - {endpoint: "tcp://%[6]s", replay: "tcp://%[7]s"}
        - {endpoint: "tcp://%[8]s"}
`, okID, ok.URL+"/metrics", pub.Addr().String(), replay, brokenID, down, down, silent)
	path := writeFile(t, "router.yaml", cfg)
	start := time.Now()
	code, out, errs := runCmd(t, "", "preflight", "--config", path, "--timeout", "300ms", "--server", down)
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("took %v with a 300ms bound per probe", el)
	}
	if code != 1 || !strings.Contains(errs, "5 problem(s)") {
		t.Fatalf("exit %d, stderr %q\n%s", code, errs, out)
	}
	blocks := map[string]string{}
	for _, b := range strings.Split(out, "\nserver ")[1:] {
		id, rest, _ := strings.Cut(b, "\n")
		blocks[id] = rest
	}
	for _, tc := range []struct {
		server string
		want   []string
	}{
		{okID, []string{"metrics OK   " + ok.URL + "/metrics: running 3, waiting 1, KV-cache usage 25.0%",
			"events  OK   tcp://" + pub.Addr().String() + `: ZMQ publisher answered (topic "kv")`,
			"replay  OK   tcp://" + replay + ": reachable"}},
		{brokenID, []string{"metrics FAIL http://" + brokenID + "/metrics answered 500",
			"events  FAIL tcp://" + down + ": ", "connection refused", "what to do: nothing listens there",
			"replay  FAIL tcp://" + down, "drop `replay`",
			"events  FAIL tcp://" + silent + ": no answer within 300ms", "not as a ZMQ publisher"}},
		{down, []string{"metrics FAIL http://" + down + "/metrics: ", "what to do: start the server"}},
	} {
		b, found := blocks[tc.server]
		if !found {
			t.Fatalf("no report for %s:\n%s", tc.server, out)
		}
		for _, w := range tc.want {
			if !strings.Contains(b, w) {
				t.Errorf("server %s: report lacks %q:\n%s", tc.server, w, b)
			}
		}
	}
	if strings.Contains(blocks[okID], "FAIL") {
		t.Errorf("healthy server reported failing:\n%s", blocks[okID])
	}
	// All healthy: exit 0.
	code, out, errs = runCmd(t, "", "preflight", "--server", okID)
	if code != 0 || !strings.Contains(out, "preflight: OK") || !strings.Contains(out, "metrics OK") {
		t.Fatalf("exit %d %s\n%s", code, errs, out)
	}
}
