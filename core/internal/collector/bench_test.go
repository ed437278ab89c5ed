package collector

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/kvevents"
	"github.com/kvc-router/kvc-router/core/internal/router"
)

// BenchmarkDecodeApply measures the event path end to end on one core:
// msgpack decode of a vLLM batch (positional layout, 8 BlockStored runs of
// 16 blocks and 8 single-block BlockRemoved events) and its application to
// the index.
func BenchmarkDecodeApply(b *testing.B) {
	for _, layout := range []kvevents.Layout{kvevents.LayoutArray, kvevents.LayoutMap} {
		b.Run(map[kvevents.Layout]string{kvevents.LayoutArray: "array", kvevents.LayoutMap: "map"}[layout], func(b *testing.B) {
			r := newRouter(b, "a")
			const runs, blocks, bs = 8, 16, 16
			payloads := make([][]byte, 1024)
			for p := range payloads {
				batch := &kvevents.Batch{TS: 1, DPRank: 0}
				for i := 0; i < runs; i++ {
					hs := make([]uint64, blocks)
					toks := make([]int32, blocks*bs)
					for j := range hs {
						hs[j] = uint64(p*1000000+i*1000+j) | 1<<63
					}
					for j := range toks {
						toks[j] = int32(p*7 + i*13 + j)
					}
					batch.Events = append(batch.Events, stored(hs, nil, toks, "GPU", ""))
					batch.Events = append(batch.Events, kvevents.Event{Kind: kvevents.KindRemoved, BlockHashes: hs[:1], Medium: "GPU", LoraID: -1, GroupIdx: -1})
				}
				pl, err := kvevents.Encode(batch, layout)
				if err != nil {
					b.Fatal(err)
				}
				payloads[p] = pl
			}
			var st EventStats
			b.ResetTimer()
			n := 0
			for b.Loop() {
				if err := ApplyPayload(r, "a", payloads[n%len(payloads)], &st); err != nil {
					b.Fatal(err)
				}
				n++
			}
			b.ReportMetric(float64(n*runs*(blocks+1))/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}

// cpuTimes is the process's user and system CPU time.
func cpuTimes() (user, sys time.Duration) {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

// TestHelperMetricsServers is not a test: BenchmarkPolling64 runs the test
// binary again with KVC_HELPER_SERVERS set so that the scraped servers live
// in another process and only the poller's CPU is measured.
func TestHelperMetricsServers(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("KVC_HELPER_SERVERS"))
	if n == 0 {
		t.Skip("helper process for BenchmarkPolling64")
	}
	body, err := os.ReadFile("../metrics/testdata/vllm_single_engine.txt")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(body) }))
		defer srv.Close()
		fmt.Println(strings.TrimPrefix(srv.URL, "http://"))
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin) // serve until the benchmark closes stdin
}

// BenchmarkPolling64 polls 64 loopback servers (another process, serving a
// realistic 45 KB vLLM scrape) every 100 ms for 3 s and reports the
// poller's CPU as a share of one core.
func BenchmarkPolling64(b *testing.B) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperMetricsServers$", "-test.v")
	cmd.Env = append(os.Environ(), "KVC_HELPER_SERVERS=64")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = stdin.Close(); _ = cmd.Wait() }()
	var ids []string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() && sc.Text() != "ready" {
		if strings.Contains(sc.Text(), ":") && !strings.HasPrefix(sc.Text(), "=") {
			ids = append(ids, sc.Text())
		}
	}
	if len(ids) != 64 {
		b.Fatalf("helper gave %d servers", len(ids))
	}
	for b.Loop() {
		r, _ := router.New(router.Config{})
		_ = r.AddServers(ids)
		p := NewPoller(r, PollerConfig{Interval: 100 * time.Millisecond})
		start := time.Now()
		usr0, sys0 := cpuTimes()
		p.Start()
		time.Sleep(3 * time.Second)
		_ = p.Close()
		usr, sys := cpuTimes()
		usr, sys = usr-usr0, sys-sys0
		wall, cpu := time.Since(start), usr+sys
		scrapes, errs := uint64(0), uint64(0)
		for _, s := range p.Status() {
			scrapes += s.Scrapes
			errs += s.Errors
		}
		if errs > 0 {
			b.Fatalf("%d scrape errors", errs)
		}
		b.ReportMetric(100*cpu.Seconds()/wall.Seconds(), "%core")
		b.ReportMetric(float64(scrapes)/wall.Seconds(), "scrapes/s")
		// On a loaded machine the helper's servers fall behind and fewer
		// scrapes happen, which lowers %core without any gain: CPU per
		// scrape, and %core rescaled to the nominal 640 scrapes/s, compare
		// runs fairly.
		if scrapes > 0 {
			perScrape := cpu.Seconds() / float64(scrapes)
			b.ReportMetric(1e6*perScrape, "cpu-us/scrape")
			// The kernel's share (socket reads and writes, epoll,
			// futex) against the user share (HTTP, parsing, runtime).
			b.ReportMetric(1e6*sys.Seconds()/float64(scrapes), "sys-us/scrape")
			b.ReportMetric(100*perScrape*float64(len(ids))/0.1, "%core@640/s")
		}
	}
}
