package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// freePorts finds n consecutive free TCP ports on loopback (best effort).
func freePorts(t *testing.T, n int) int {
	t.Helper()
	for try := 0; try < 50; try++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		base := l.Addr().(*net.TCPAddr).Port
		l.Close()
		ok := true
		for i := 0; i < n && ok; i++ {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base+i))
			if err != nil {
				ok = false
				continue
			}
			l.Close()
		}
		if ok && base+n < 65535 {
			return base
		}
	}
	t.Fatal("no free port range")
	return 0
}

func TestFleet(t *testing.T) {
	httpBase := freePorts(t, 2)
	eventBase := freePorts(t, 4)
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	errc := make(chan error, 1)
	go func() {
		errc <- run(ctx, []string{"--fleet", "2", "--base-port", strconv.Itoa(httpBase), "--base-event-port", strconv.Itoa(eventBase),
			"--num-gpu-blocks", "128", "--speed", "0", "--kv-events-topic", "kv@{host}:{port}@{model}", "--log-level", "error"}, pw, io.Discard)
		pw.Close()
	}()
	sc := bufio.NewScanner(pr)
	var infos []ServerInfo
	for len(infos) < 2 && sc.Scan() {
		var info ServerInfo
		if err := json.Unmarshal(sc.Bytes(), &info); err != nil {
			t.Fatalf("bad line %q: %v", sc.Text(), err)
		}
		infos = append(infos, info)
	}
	if len(infos) != 2 {
		t.Fatalf("got %d server lines; run: %v", len(infos), <-errc)
	}
	for i, info := range infos {
		if info.Port != httpBase+i || info.Index != i {
			t.Fatalf("server %d info %+v", i, info)
		}
		wantPub := "tcp://127.0.0.1:" + strconv.Itoa(eventBase+2*i)
		wantRep := "tcp://127.0.0.1:" + strconv.Itoa(eventBase+2*i+1)
		if len(info.KVEvents) != 1 || info.KVEvents[0] != wantPub || len(info.KVEventsReplay) != 1 || info.KVEventsReplay[0] != wantRep {
			t.Fatalf("server %d endpoints %+v", i, info)
		}
		if info.Topic != "kv@127.0.0.1:"+strconv.Itoa(info.Port)+"@sim/llama-8b" {
			t.Fatalf("topic %q", info.Topic)
		}
		resp, err := http.Post(info.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"a b c d e","max_tokens":4}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), `"completion_tokens":4`) {
			t.Fatalf("completion %d %s", resp.StatusCode, b)
		}
	}
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no clean shutdown")
	}
}

func TestFlagErrors(t *testing.T) {
	tests := [][]string{
		{"--kv-events-encoding", "json"},
		{"--kv-events-replay-layout", "4"},
		{"--fleet", "0"},
		{"--fleet", "2", "--base-port", "9000", "--kv-events-endpoint", "tcp://127.0.0.1:1"},
		{"--kv-events-replay-endpoint", "tcp://127.0.0.1:1"},
		{"--hash-seed", "zz", "--port", "0"},
		{"stray"},
	}
	for _, args := range tests {
		if err := run(context.Background(), args, io.Discard, io.Discard); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}
