package metrics

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
)

// checkFastAgrees is the differential check between the fast path and
// expfmt: whenever fastFamilies accepts the kept lines, expfmt must accept
// them too and produce the same families, types, label sets and values.
func checkFastAgrees(t *testing.T, body []byte, flavor Flavor) {
	t.Helper()
	wanted := vllmFamilies
	if flavor == SGLang {
		wanted = sglangFamilies
	}
	var f filtered
	if err := f.filter(body, wanted); err != nil {
		return
	}
	fast, ok := fastFamilies(f.text)
	if !ok {
		return
	}
	ref, err := expfmtFamilies(f.text)
	if err != nil {
		t.Fatalf("fast path accepted what expfmt rejects (%v):\n%s", err, f.text)
	}
	if a, b := famDump(fast), famDump(ref); a != b {
		t.Fatalf("fast path and expfmt disagree:\nfast:\n%s\nexpfmt:\n%s", a, b)
	}
}

func famDump(fams map[string]*dto.MetricFamily) string {
	var lines []string
	for name, f := range fams {
		for _, m := range f.Metric {
			var ls []string
			for _, l := range m.Label {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			sort.Strings(ls)
			v, _ := value(m)
			if math.IsNaN(v) {
				v = -12345.678 // NaN != NaN
			}
			lines = append(lines, name+" "+f.GetType().String()+" {"+strings.Join(ls, ",")+"} "+
				strconv.FormatFloat(v, 'g', -1, 64))
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func TestFastPathAgreesWithExpfmtOnFixtures(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatal("no fixtures", err)
	}
	accepted := 0
	for _, p := range files {
		body, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, fl := range []Flavor{VLLM, SGLang} {
			checkFastAgrees(t, body, fl)
			var f filtered
			wanted := vllmFamilies
			if fl == SGLang {
				wanted = sglangFamilies
			}
			if f.filter(body, wanted) == nil {
				if _, ok := fastFamilies(f.text); ok {
					accepted++
				}
			}
		}
	}
	// The realistic scrapes must take the fast path, or it saves nothing.
	for _, name := range []string{"vllm_single_engine.txt", "vllm_two_engines.txt", "sglang_single.txt"} {
		body := fixture(t, name)
		fl := VLLM
		if strings.HasPrefix(name, "sglang") {
			fl = SGLang
		}
		wanted := vllmFamilies
		if fl == SGLang {
			wanted = sglangFamilies
		}
		var f filtered
		if err := f.filter(body, wanted); err != nil {
			t.Fatal(err)
		}
		if _, ok := fastFamilies(f.text); !ok {
			t.Errorf("%s does not take the fast path", name)
		}
	}
	t.Logf("fast path accepted %d fixture/flavor pairs", accepted)
}

func TestFastPathDefersUnusualSyntax(t *testing.T) {
	cases := map[string]string{
		"timestamp":        "vllm:num_requests_running{engine=\"0\"} 1 1700000000000\n",
		"escaped label":    "vllm:num_requests_running{engine=\"a\\\"b\"} 1\n",
		"escaped help":     "# HELP vllm:num_requests_running a\\nb\nvllm:num_requests_running 1\n",
		"interleaved":      "vllm:num_requests_running{engine=\"0\"} 1\nvllm:num_requests_waiting 2\nvllm:num_requests_running{engine=\"1\"} 1\n",
		"duplicate series": "vllm:num_requests_running{engine=\"0\"} 1\nvllm:num_requests_running{engine=\"0\"} 2\n",
		"duplicate label":  "vllm:num_requests_running{engine=\"0\",engine=\"1\"} 1\n",
		"type after":       "vllm:num_requests_running 1\n# TYPE vllm:num_requests_running gauge\n",
		"histogram type":   "# TYPE vllm:num_requests_running histogram\nvllm:num_requests_running 1\n",
		"hex value":        "vllm:num_requests_running 0x1p3\n",
		"two spaces":       "vllm:num_requests_running  1\n",
	}
	for name, text := range cases {
		if _, ok := fastFamilies([]byte(text)); ok {
			t.Errorf("%s: fast path accepted %q", name, text)
		}
		checkFastAgrees(t, []byte(text), VLLM)
	}
	ok := map[string]string{
		"trailing comma": "vllm:num_requests_running{engine=\"0\",} 3\n",
		"no labels":      "# HELP vllm:num_requests_running Running.\n# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n",
		"nan":            "vllm:kv_cache_usage_perc{engine=\"0\"} NaN\n",
	}
	for name, text := range ok {
		if _, fine := fastFamilies([]byte(text)); !fine {
			t.Errorf("%s: fast path refused %q", name, text)
		}
		checkFastAgrees(t, []byte(text), VLLM)
	}
}

func TestLabelsEndFastPathAgrees(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	alphabet := []byte(`ab"\}{=, `)
	for i := 0; i < 200000; i++ {
		s := make([]byte, 1+rng.IntN(24))
		s[0] = '{'
		for j := 1; j < len(s); j++ {
			s[j] = alphabet[rng.IntN(len(alphabet))]
		}
		if got, want := labelsEnd(s), labelsEndSlow(s); got != want {
			t.Fatalf("labelsEnd(%q) = %d, want %d", s, got, want)
		}
	}
}

// checkBlockSkipAgrees: skipping runs of unread-family lines by prefix
// gives the same kept lines, line map and error as the line-by-line path.
func checkBlockSkipAgrees(t *testing.T, body []byte, wanted *familySet) {
	t.Helper()
	var a, b filtered
	blockSkipOn = false
	errA := a.filter(body, wanted)
	blockSkipOn = true
	errB := b.filter(body, wanted)
	if fmt.Sprint(errA) != fmt.Sprint(errB) || string(a.text) != string(b.text) || fmt.Sprint(a.lines) != fmt.Sprint(b.lines) {
		t.Fatalf("block skip differs:\nline by line: %v %v\n%s\nblock skip: %v %v\n%s", errA, a.lines, a.text, errB, b.lines, b.text)
	}
}

func TestBlockSkipAgrees(t *testing.T) {
	files, _ := filepath.Glob("testdata/*.txt")
	bodies := [][]byte{
		// A wanted name extends the unread family: no block skip.
		[]byte("# TYPE vllm:prefix_cache gauge\nvllm:prefix_cache 1\nvllm:prefix_cache_hits_total 2\nvllm:prefix_cache_x{ 3\n"),
		// Blank, indented and foreign lines inside an unread family, no final newline.
		[]byte("# HELP vllm:lat_seconds x\nvllm:lat_seconds_bucket{le=\"1\"} 1\n\n  vllm:lat_seconds_sum 2\nbad{ 1\nvllm:num_requests_running 3\nvllm:lat_seconds_count"),
		[]byte("# TYPE a counter\na_total 1\na_created 2\nvllm:num_requests_waiting 1\na_total{"),
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		bodies = append(bodies, b)
	}
	for _, b := range bodies {
		checkBlockSkipAgrees(t, b, vllmFamilies)
		checkBlockSkipAgrees(t, b, sglangFamilies)
	}
}
