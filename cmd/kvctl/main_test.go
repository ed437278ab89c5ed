package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/core/kvcrouter"

	"github.com/go-zeromq/zmq4"
)

func runCmd(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

func samplePayload(t *testing.T, layout kvcrouter.EventLayout) []byte {
	t.Helper()
	toks := make([]int32, 32)
	for i := range toks {
		toks[i] = int32(i + 1)
	}
	b := &kvcrouter.EventBatch{TS: 1789095808.5, DPRank: 0, Events: []kvcrouter.Event{
		{Kind: kvcrouter.EventStored, BlockHashes: []uint64{0xDEADBEEFCAFEBABE, 7}, TokenIDs: toks, BlockSize: 16, LoraID: -1, Medium: "GPU", GroupIdx: -1},
		{Kind: kvcrouter.EventRemoved, BlockHashes: []uint64{7}, Medium: "GPU", LoraID: -1, GroupIdx: -1},
		{Kind: kvcrouter.EventCleared, LoraID: -1, GroupIdx: -1},
	}}
	p, err := kvcrouter.EncodeEvents(b, layout)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDecodeEvents(t *testing.T) {
	for _, layout := range []kvcrouter.EventLayout{kvcrouter.EventLayoutArray, kvcrouter.EventLayoutMap} {
		path := filepath.Join(t.TempDir(), "batch.msgpack")
		if err := os.WriteFile(path, samplePayload(t, layout), 0o600); err != nil {
			t.Fatal(err)
		}
		code, out, errs := runCmd(t, "", "decode-events", path)
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errs)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 3 {
			t.Fatalf("%d lines: %s", len(lines), out)
		}
		var ev map[string]any
		dec := json.NewDecoder(strings.NewReader(lines[0]))
		dec.UseNumber()
		if err := dec.Decode(&ev); err != nil {
			t.Fatal(err)
		}
		hashes := ev["block_hashes"].([]any)
		if ev["type"] != "BlockStored" || hashes[0].(json.Number).String() != "16045690984503098046" ||
			ev["medium"] != "GPU" || ev["parent_block_hash"] != nil || ev["dp_rank"].(json.Number).String() != "0" ||
			len(ev["token_ids"].([]any)) != 32 || ev["ts"].(json.Number).String() != "1789095808.5" {
			t.Fatalf("first event %v", ev)
		}
		if !strings.Contains(lines[1], `"type":"BlockRemoved"`) || !strings.Contains(lines[2], `"type":"AllBlocksCleared"`) {
			t.Fatalf("%s", out)
		}
		// stdin works too.
		code, out2, _ := runCmd(t, string(samplePayload(t, layout)), "decode-events", "-")
		if code != 0 || out2 != out {
			t.Fatalf("stdin decode differs")
		}
	}
}

func TestErrorsAndHelp(t *testing.T) {
	cases := []struct {
		name  string
		stdin string
		args  []string
		code  int
		want  string
	}{
		{"no args", "", nil, 2, "Usage"},
		{"unknown command", "", []string{"frobnicate"}, 1, "unknown command"},
		{"missing file", "", []string{"decode-events", "/nonexistent/x"}, 1, "no such file"},
		{"garbage payload", "\x93\xff\xff", []string{"decode-events", "-"}, 1, "kvctl decode-events"},
		{"decode without arg", "", []string{"decode-events"}, 2, "Usage"},
		{"keys not json", "hello", []string{"keys"}, 1, "JSON array"},
		{"keys bad block size", "[1]", []string{"keys", "--block-size", "0"}, 1, "positive"},
		{"keys out of range", "[99999999999]", []string{"keys"}, 1, "int32"},
		{"scrape refused", "", []string{"scrape", "http://127.0.0.1:1/metrics", "--timeout", "1s"}, 1, "kvctl scrape"},
		{"scrape bad flavor", "", []string{"scrape", "--flavor", "tgi", "x"}, 1, "allowed"},
	}
	for _, c := range cases {
		code, _, errs := runCmd(t, c.stdin, c.args...)
		if code != c.code || !strings.Contains(errs, c.want) {
			t.Errorf("%s: exit %d stderr %q", c.name, code, errs)
		}
	}
	for _, sub := range []string{"decode-events", "scrape", "watch", "keys"} {
		code, _, errs := runCmd(t, "", sub, "--help")
		if code != 0 || !strings.Contains(errs, "Usage: kvctl "+sub) {
			t.Errorf("%s --help: exit %d %q", sub, code, errs)
		}
	}
}

func TestKeys(t *testing.T) {
	toks := make([]int32, 40)
	for i := range toks {
		toks[i] = int32(i * 3)
	}
	in, _ := json.Marshal(toks)
	code, out, errs := runCmd(t, string(in), "keys", "--block-size", "16", "--model", "m")
	if code != 0 {
		t.Fatal(errs)
	}
	var got []uint64
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	want := kvcrouter.BlockKeys(toks, 16, kvcrouter.HashNamespace("m", ""))
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("got %v want %v", got, want)
	}
}

func TestScrape(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\",model_name=\"m\"} 5.0\n"+
			"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 1.0\n"+
			"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.5\n")
	}))
	defer srv.Close()
	code, out, errs := runCmd(t, "", "scrape", srv.URL+"/metrics")
	if code != 0 {
		t.Fatal(errs)
	}
	var m map[string]any
	_ = json.Unmarshal([]byte(out), &m)
	if m["running"] != 5.0 || m["waiting"] != 1.0 || m["kv_cache_usage"] != 0.5 {
		t.Fatalf("%v", m)
	}
	// A bare host:port means http://host:port/metrics.
	if code, _, errs := runCmd(t, "", "scrape", strings.TrimPrefix(srv.URL, "http://")); code != 0 {
		t.Fatal(errs)
	}
}

func TestWatch(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := zmq4.NewPub(ctx)
	defer pub.Close()
	if err := pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	payload := samplePayload(t, kvcrouter.EventLayoutMap)
	done := make(chan struct{})
	go func() {
		var seq uint64
		for {
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
			var b [8]byte
			binary.BigEndian.PutUint64(b[:], seq)
			seq++
			_ = pub.Send(zmq4.NewMsgFrom([]byte("kv@x"), b[:], payload))
		}
	}()
	defer close(done)
	code, out, errs := runCmd(t, "", "watch", "tcp://"+pub.Addr().String(), "--topic", "kv@", "--count", "2", "--duration", "10s")
	if code != 0 {
		t.Fatalf("exit %d %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 6 || !strings.Contains(lines[0], `"seq":`) || !strings.Contains(lines[0], "BlockStored") {
		t.Fatalf("%q", out)
	}
}
