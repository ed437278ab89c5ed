package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvc-router/kvc-router/testbed/sim"
)

func startServer(t *testing.T, cfg Config) *Server {
	t.Helper()
	if cfg.Engine.NumGPUBlocks == 0 {
		cfg.Engine.NumGPUBlocks = 256
	}
	if cfg.Engine.ModelName == "" {
		cfg.Engine.ModelName = "test/model"
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

func post(t *testing.T, url, body string) (int, []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

func get(t *testing.T, url string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

func idsJSON(start, n int) string {
	parts := make([]string, n)
	for i := range parts {
		parts[i] = fmt.Sprint(start + i)
	}
	return "[" + strings.Join(parts, ",") + "]"
}

type respJSON struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Text           string  `json:"text"`
		TokenIDs       []int32 `json:"token_ids"`
		PromptTokenIDs []int32 `json:"prompt_token_ids"`
		FinishReason   *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		TotalTokens         int `json:"total_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

func TestCompletionsNonStream(t *testing.T) {
	s := startServer(t, Config{})
	url := s.URL() + "/v1/completions"
	words := strings.Repeat("alpha beta gamma delta ", 10) // 40 words
	tests := []struct {
		name       string
		body       string
		prompt     int
		maxTokens  int
		wantCached int
		promptIDs  bool
	}{
		{"ids first", `{"prompt":` + idsJSON(1, 40) + `,"max_tokens":5}`, 40, 5, 0, false},
		{"ids repeat hits 2 blocks", `{"model":"test/model","prompt":` + idsJSON(1, 40) + `,"max_tokens":3,"return_token_ids":true}`, 40, 3, 32, true},
		{"nested ids repeat", `{"prompt":[` + idsJSON(1, 40) + `]}`, 40, DefaultMaxTokens, 32, false},
		{"text first", `{"prompt":"` + words + `","max_tokens":2}`, 40, 2, 0, false},
		{"text list repeat", `{"prompt":["` + words + `"],"max_tokens":2}`, 40, 2, 32, false},
		{"exact two blocks hits one", `{"prompt":` + idsJSON(1, 32) + `,"max_tokens":1}`, 32, 1, 16, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, b := post(t, url, tc.body)
			if code != 200 {
				t.Fatalf("status %d: %s", code, b)
			}
			var r respJSON
			if err := json.Unmarshal(b, &r); err != nil {
				t.Fatal(err)
			}
			if r.Object != "text_completion" || r.Model != "test/model" || len(r.Choices) != 1 || r.Usage == nil {
				t.Fatalf("response %s", b)
			}
			ch := r.Choices[0]
			if len(ch.TokenIDs) != tc.maxTokens || ch.Text != sim.Detokenize(ch.TokenIDs) || ch.FinishReason == nil || *ch.FinishReason != "length" {
				t.Fatalf("choice %s", b)
			}
			if (len(ch.PromptTokenIDs) == tc.prompt) != tc.promptIDs {
				t.Fatalf("prompt_token_ids %v", ch.PromptTokenIDs)
			}
			u := r.Usage
			if u.PromptTokens != tc.prompt || u.CompletionTokens != tc.maxTokens || u.TotalTokens != tc.prompt+tc.maxTokens ||
				u.PromptTokensDetails.CachedTokens != tc.wantCached {
				t.Fatalf("usage %s", b)
			}
		})
	}
}

func TestCompletionsErrors(t *testing.T) {
	s := startServer(t, Config{Engine: sim.Config{NumGPUBlocks: 4}})
	url := s.URL() + "/v1/completions"
	tests := []struct {
		name string
		body string
		code int
	}{
		{"bad json", `{"prompt":`, 400},
		{"no prompt", `{"max_tokens":3}`, 400},
		{"empty ids", `{"prompt":[]}`, 400},
		{"negative id", `{"prompt":[1,-2]}`, 400},
		{"id beyond vocab", `{"prompt":[32000]}`, 400},
		{"n=2", `{"prompt":[1],"n":2}`, 400},
		{"max_tokens 0", `{"prompt":[1],"max_tokens":0}`, 400},
		{"batch", `{"prompt":[[1],[2]]}`, 400},
		{"wrong model", `{"model":"x","prompt":[1]}`, 404},
		{"too long for cache", `{"prompt":` + idsJSON(1, 60) + `,"max_tokens":10}`, 400},
		{"ok", `{"prompt":[1,2,3],"max_tokens":1}`, 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, b := post(t, url, tc.body)
			if code != tc.code {
				t.Fatalf("status %d want %d: %s", code, tc.code, b)
			}
			if code != 200 && !bytes.Contains(b, []byte(`"object":"error"`)) {
				t.Fatalf("error body %s", b)
			}
		})
	}
}

func TestCompletionsStream(t *testing.T) {
	s := startServer(t, Config{Speed: 50})
	url := s.URL() + "/v1/completions"
	for i, wantCached := range []int{0, 16} {
		body := `{"prompt":` + idsJSON(7, 20) + `,"max_tokens":6,"stream":true,"return_token_ids":true,"stream_options":{"include_usage":true}}`
		resp, err := http.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
			t.Fatalf("content type %q", ct)
		}
		sc := bufio.NewScanner(resp.Body)
		var chunks []respJSON
		done := false
		for sc.Scan() {
			line := sc.Text()
			if line == "" {
				continue
			}
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok {
				t.Fatalf("bad SSE line %q", line)
			}
			if data == "[DONE]" {
				done = true
				continue
			}
			if done {
				t.Fatal("data after [DONE]")
			}
			var r respJSON
			if err := json.Unmarshal([]byte(data), &r); err != nil {
				t.Fatal(err)
			}
			chunks = append(chunks, r)
		}
		resp.Body.Close()
		if !done || len(chunks) != 7 {
			t.Fatalf("round %d: done %v chunks %d", i, done, len(chunks))
		}
		var toks []int32
		for j, c := range chunks[:6] {
			if len(c.Choices) != 1 || len(c.Choices[0].TokenIDs) != 1 || c.Usage != nil {
				t.Fatalf("chunk %d %+v", j, c)
			}
			if (j == 0) != (len(c.Choices[0].PromptTokenIDs) == 20) {
				t.Fatalf("prompt ids on chunk %d", j)
			}
			if (j == 5) != (c.Choices[0].FinishReason != nil) {
				t.Fatalf("finish reason on chunk %d", j)
			}
			toks = append(toks, c.Choices[0].TokenIDs...)
		}
		last := chunks[6]
		if len(last.Choices) != 0 || last.Usage == nil || last.Usage.CompletionTokens != 6 || last.Usage.PromptTokensDetails.CachedTokens != wantCached {
			t.Fatalf("usage chunk %+v", last)
		}
		// Streaming and non-streaming produce the same tokens.
		code, b := post(t, url, `{"prompt":`+idsJSON(7, 20)+`,"max_tokens":6}`)
		var r respJSON
		if code != 200 || json.Unmarshal(b, &r) != nil || fmt.Sprint(r.Choices[0].TokenIDs) != fmt.Sprint(toks) {
			t.Fatalf("non-stream tokens differ: %s vs %v", b, toks)
		}
	}
}

func TestModelsHealthReset(t *testing.T) {
	s := startServer(t, Config{})
	if code, _ := get(t, s.URL()+"/health"); code != 200 {
		t.Fatalf("health %d", code)
	}
	code, b := get(t, s.URL()+"/v1/models")
	if code != 200 || !bytes.Contains(b, []byte(`"id":"test/model"`)) {
		t.Fatalf("models %d %s", code, b)
	}
	body := `{"prompt":` + idsJSON(100, 50) + `,"max_tokens":2}`
	post(t, s.URL()+"/v1/completions", body)
	if code, b := post(t, s.URL()+"/reset_prefix_cache", ""); code != 200 {
		t.Fatalf("reset %d %s", code, b)
	}
	var n int
	if err := s.Do(0, func(e *sim.Engine) { n = len(e.CachedBlocks()) }); err != nil || n != 0 {
		t.Fatalf("blocks after reset %d %v", n, err)
	}
	_, b = post(t, s.URL()+"/v1/completions", body)
	var r respJSON
	if json.Unmarshal(b, &r) != nil || r.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("hit after reset: %s", b)
	}
	code, b = get(t, s.URL()+"/sim/cached_blocks")
	if code != 200 || !bytes.Contains(b, []byte(`"medium":"GPU"`)) {
		t.Fatalf("cached_blocks %d %s", code, b)
	}
}

func TestMetrics(t *testing.T) {
	tests := []struct {
		name     string
		cfg      Config
		external bool
		engines  int
	}{
		{"single", Config{}, false, 1},
		{"tiers", Config{Engine: sim.Config{CPUBlocks: 64, SSDBlocks: 128}}, true, 1},
		{"dp2", Config{DataParallelSize: 2}, false, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := startServer(t, tc.cfg)
			const reqs = 4
			for i := 0; i < reqs; i++ {
				if code, b := post(t, s.URL()+"/v1/completions", `{"prompt":`+idsJSON(1, 40)+`,"max_tokens":3}`); code != 200 {
					t.Fatalf("%d %s", code, b)
				}
			}
			code, b := get(t, s.URL()+"/metrics")
			if code != 200 {
				t.Fatal(code)
			}
			text := string(b)
			p := expfmt.NewTextParser(model.LegacyValidation)
			fams, err := p.TextToMetricFamilies(strings.NewReader(text))
			if err != nil {
				t.Fatalf("parse: %v\n%s", err, text)
			}
			for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
				"vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries_created", "vllm:prefix_cache_hits_total",
				"vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total",
				"vllm:request_success_total", "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
				"vllm:cache_config_info"} {
				f, ok := fams[name]
				if !ok {
					t.Fatalf("missing %s", name)
				}
				if name == "vllm:num_requests_running" && len(f.Metric) != tc.engines {
					t.Fatalf("%s has %d series", name, len(f.Metric))
				}
			}
			if _, ok := fams["vllm:external_prefix_cache_hits_total"]; ok != tc.external {
				t.Fatalf("external metrics present=%v", ok)
			}
			sum := func(name string) float64 {
				var v float64
				for _, m := range fams[name].Metric {
					switch {
					case m.Counter != nil:
						v += m.Counter.GetValue()
					case m.Gauge != nil:
						v += m.Gauge.GetValue()
					case m.Histogram != nil:
						v += float64(m.Histogram.GetSampleCount())
						if n := len(m.Histogram.Bucket); n != len(ttftBuckets)+1 && n != len(e2eBuckets)+1 { // +Inf included
							t.Fatalf("%s has %d buckets", name, n)
						}
					}
				}
				return v
			}
			if q := sum("vllm:prefix_cache_queries_total"); q != reqs*40 {
				t.Fatalf("queries %g", q)
			}
			if g := sum("vllm:generation_tokens_total"); g != reqs*3 {
				t.Fatalf("generation %g", g)
			}
			if tc.engines == 1 {
				if h := sum("vllm:prefix_cache_hits_total"); h != (reqs-1)*32 {
					t.Fatalf("hits %g", h)
				}
			}
			if n := sum("vllm:time_to_first_token_seconds"); n != reqs {
				t.Fatalf("ttft count %g", n)
			}
			for _, re := range []string{
				`(?m)^vllm:num_requests_running\{engine="0",model_name="test/model"\} 0\.0$`,
				`(?m)^vllm:time_to_first_token_seconds_bucket\{engine="0",le="0\.001",model_name="test/model"\} `,
				`(?m)^vllm:time_to_first_token_seconds_bucket\{engine="0",le="\+Inf",model_name="test/model"\} `,
				`(?m)^vllm:request_success_total\{engine="0",finished_reason="length",model_name="test/model"\} `,
				`(?m)^vllm:prefix_cache_queries_created\{engine="0",model_name="test/model"\} 1\.\d+e\+09$`,
				`(?m)^vllm:cache_config_info\{block_size="16",.*enable_prefix_caching="True",engine="0",.*num_gpu_blocks="256",.*prefix_caching_hash_algo="xxhash".*\} 1\.0$`,
			} {
				if !regexp.MustCompile(re).MatchString(text) {
					t.Fatalf("no line matching %s in\n%s", re, text)
				}
			}
			if tc.engines == 2 && !strings.Contains(text, `vllm:num_requests_running{engine="1",model_name="test/model"}`) {
				t.Fatal("no engine 1 series")
			}
		})
	}
}

func TestPyFloat(t *testing.T) {
	tests := []struct {
		in   float64
		want string
	}{
		{0, "0.0"}, {1, "1.0"}, {0.25, "0.25"}, {48210, "48210.0"}, {0.001, "0.001"}, {2560, "2560.0"},
		{1789095700.123456, "1.789095700123456e+09"}, {1234567, "1.234567e+06"}, {123456, "123456.0"},
		{1e-5, "1e-05"}, {-3.5, "-3.5"}, {1e16, "1e+16"},
	}
	for _, tc := range tests {
		if got := PyFloat(tc.in); got != tc.want {
			t.Errorf("PyFloat(%v) = %q want %q", tc.in, got, tc.want)
		}
	}
}

func TestParseCompletionRequest(t *testing.T) {
	tests := []struct {
		body    string
		ok      bool
		prompt  int
		max     int
		stream  bool
		isText  bool
		withIDs bool
	}{
		{`{"prompt":[1,2,3]}`, true, 3, 16, false, false, false},
		{`{"prompt":"a b c d","max_tokens":4,"stream":true}`, true, 4, 4, true, true, false},
		{`{"prompt":["a b"],"return_token_ids":true}`, true, 2, 16, false, true, true},
		{`{"prompt":[[5,6]],"max_tokens":null}`, true, 2, 16, false, false, false},
		{`{"prompt":"   "}`, false, 0, 0, false, false, false},
		{`{"prompt":[1.5]}`, false, 0, 0, false, false, false},
		{`{"prompt":{"a":1}}`, false, 0, 0, false, false, false},
		{`{"prompt":null}`, false, 0, 0, false, false, false},
		{`[]`, false, 0, 0, false, false, false},
	}
	for _, tc := range tests {
		r, err := ParseCompletionRequest([]byte(tc.body), 100)
		if (err == nil) != tc.ok {
			t.Fatalf("%s: err %v", tc.body, err)
		}
		if !tc.ok {
			continue
		}
		if len(r.Prompt) != tc.prompt || r.MaxTokens != tc.max || r.Stream != tc.stream || r.PromptIsText != tc.isText || r.ReturnTokenIDs != tc.withIDs {
			t.Fatalf("%s: %+v", tc.body, r)
		}
	}
}

func FuzzParseCompletionRequest(f *testing.F) {
	for _, s := range []string{`{"prompt":[1,2,3]}`, `{"prompt":"hi there","max_tokens":3}`, `{"prompt":[[1]],"n":1}`,
		`{"prompt":["x"],"stream":true,"stream_options":{"include_usage":true}}`, `{}`, `null`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := ParseCompletionRequest(body, 1000)
		if err != nil {
			return
		}
		if len(r.Prompt) == 0 || r.MaxTokens < 1 {
			t.Fatalf("accepted invalid request %+v", r)
		}
		for _, id := range r.Prompt {
			if id < 0 || id >= 1000 {
				t.Fatalf("token %d out of vocab", id)
			}
		}
	})
}

func TestSpeedPacing(t *testing.T) {
	// 10 steps of 20 ms simulated at speed 2 take >= 100 ms of wall time.
	s := startServer(t, Config{Speed: 2, Engine: sim.Config{StepBase: 0.02, PrefillPerToken: -1, DecodePerContextToken: -1}})
	start := time.Now()
	if code, b := post(t, s.URL()+"/v1/completions", `{"prompt":[1,2,3],"max_tokens":10}`); code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	if el := time.Since(start); el < 95*time.Millisecond || el > 2*time.Second {
		t.Fatalf("elapsed %v", el)
	}
	// The TTFT histogram is in simulated seconds: one 20 ms step.
	_, b := get(t, s.URL()+"/metrics")
	if !strings.Contains(string(b), `vllm:time_to_first_token_seconds_bucket{engine="0",le="0.04",model_name="test/model"} 1.0`) ||
		!strings.Contains(string(b), `vllm:time_to_first_token_seconds_bucket{engine="0",le="0.01",model_name="test/model"} 0.0`) {
		t.Fatalf("ttft buckets wrong:\n%s", b)
	}
}

// A paced clock advances a busy engine by its step durations only (a host
// stall adds no simulated time), and catches up with wall time x speed
// while the engine is idle.
func TestPacedClock(t *testing.T) {
	s := startServer(t, Config{Speed: 2, PacedClock: true,
		Engine: sim.Config{StepBase: 0.02, PrefillPerToken: -1, DecodePerContextToken: -1}})
	timings := func() []RequestTiming {
		_, b := get(t, s.URL()+"/sim/requests")
		var ts []RequestTiming
		if err := json.Unmarshal(b, &ts); err != nil {
			t.Fatalf("%v: %s", err, b)
		}
		return ts
	}
	for i := range 2 {
		if code, b := post(t, s.URL()+"/v1/completions", `{"prompt":[1,2,3],"max_tokens":10}`); code != 200 {
			t.Fatalf("%d %s", code, b)
		}
		if i == 0 {
			time.Sleep(150 * time.Millisecond) // idle: 0.3 simulated seconds at speed 2
		}
	}
	ts := timings()
	if len(ts) != 2 {
		t.Fatalf("timings %+v", ts)
	}
	for _, r := range ts {
		// Exactly ten 20 ms steps, whatever the host's scheduling did.
		if d := r.Finish - r.Arrival; math.Abs(d-0.2) > 1e-9 {
			t.Fatalf("e2e %v on the paced clock, want exactly 0.2 (10 steps x 20 ms): %+v", d, r)
		}
	}
	if gap := ts[1].Arrival - ts[0].Finish; gap < 0.28 {
		t.Fatalf("idle gap %v simulated seconds, want >= 0.3 (150 ms wall at speed 2)", gap)
	}
}

func TestClientDisconnectAborts(t *testing.T) {
	s := startServer(t, Config{Speed: 1, Engine: sim.Config{StepBase: 0.01}})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", s.URL()+"/v1/completions",
		strings.NewReader(`{"prompt":[1,2,3],"max_tokens":3000,"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var st sim.Stats
		if err := s.Do(0, func(e *sim.Engine) { st = e.Stats() }); err != nil {
			t.Fatal(err)
		}
		if st.Aborted == 1 && st.Running == 0 && st.FreeGPUBlocks == st.NumGPUBlocks {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("request not aborted: %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, b := get(t, s.URL()+"/metrics")
	if !strings.Contains(string(b), `vllm:request_success_total{engine="0",finished_reason="abort",model_name="test/model"} 1.0`) {
		t.Fatal("abort not counted")
	}
}

// TestHoldFreezesArrivals: requests sent over 200 ms of wall time while the
// fleet is held all arrive at the same simulated instant, nothing runs
// until the release, and the clock resumes where it froze (the held wall
// time is not simulated time).
func TestHoldFreezesArrivals(t *testing.T) {
	for _, paced := range []bool{true, false} {
		t.Run(map[bool]string{true: "paced", false: "wall"}[paced], func(t *testing.T) {
			s := startServer(t, Config{Speed: 2, PacedClock: paced,
				Engine: sim.Config{StepBase: 0.02, PrefillPerToken: -1, DecodePerContextToken: -1}})
			if code, b := post(t, s.URL()+"/sim/hold?timeout_s=30", ""); code != 200 || !strings.Contains(string(b), `"held":true`) {
				t.Fatalf("hold: %d %s", code, b)
			}
			var wg sync.WaitGroup
			for i := range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if code, b := post(t, s.URL()+"/v1/completions", `{"prompt":[1,2,3],"max_tokens":10}`); code != 200 {
						t.Errorf("%d %s", code, b)
					}
				}()
				if i < 2 {
					time.Sleep(100 * time.Millisecond) // 0.2 simulated seconds each, were the clock running
				}
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				_, b := get(t, s.URL()+"/sim/hold")
				if strings.Contains(string(b), `"requests":3`) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("3 requests never queued: %s", b)
				}
				time.Sleep(10 * time.Millisecond)
			}
			var st sim.Stats
			if err := s.Do(0, func(e *sim.Engine) { st = e.Stats() }); err != nil {
				t.Fatal(err)
			}
			if st.Running != 0 || st.Waiting != 3 {
				t.Fatalf("held engine scheduled work: %+v", st)
			}
			time.Sleep(300 * time.Millisecond) // held: must not count
			if code, b := post(t, s.URL()+"/sim/release", ""); code != 200 || !strings.Contains(string(b), `"held":false`) {
				t.Fatalf("release: %d %s", code, b)
			}
			wg.Wait()
			_, b := get(t, s.URL()+"/sim/requests")
			var ts []RequestTiming
			if err := json.Unmarshal(b, &ts); err != nil || len(ts) != 3 {
				t.Fatalf("%v: %s", err, b)
			}
			for _, r := range ts[1:] {
				if r.Arrival != ts[0].Arrival {
					t.Fatalf("arrivals differ under a hold: %+v", ts)
				}
			}
			// 0.5 s of wall time passed between the first submit and the
			// release (1 simulated second at speed 2): the first request's
			// latency must not include it.
			if d := ts[0].FirstToken - ts[0].Arrival; d > 0.5 {
				t.Fatalf("held time leaked into TTFT: %v simulated seconds: %+v", d, ts[0])
			}
		})
	}
}

func TestHoldExpiresAndRejectsBadTimeouts(t *testing.T) {
	s := startServer(t, Config{Speed: 0, Engine: sim.Config{StepBase: 0.01}})
	for _, q := range []string{"0", "-1", "abc", "601", "NaN"} {
		if code, b := post(t, s.URL()+"/sim/hold?timeout_s="+q, ""); code != 400 {
			t.Fatalf("timeout_s=%s: %d %s", q, code, b)
		}
	}
	if code, b := post(t, s.URL()+"/sim/hold?timeout_s=0.2", ""); code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	start := time.Now()
	// The request is served once the hold expires, without a release.
	if code, b := post(t, s.URL()+"/v1/completions", `{"prompt":[1,2,3],"max_tokens":3}`); code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	if el := time.Since(start); el < 150*time.Millisecond {
		t.Fatalf("served after %v, inside the 200 ms hold", el)
	}
	if _, b := get(t, s.URL()+"/sim/hold"); !strings.Contains(string(b), `"held":false`) {
		t.Fatalf("hold did not expire: %s", b)
	}
}

// Issue 29 row 19: timeout_s=inf (also 1e300, 1e18, 0x1p1000) overflowed
// the Duration conversion, returned 200 and did not hold; and re-posting
// extended a hold forever. Now they are 400s, and a re-post while held
// keeps the running hold's deadline.
func TestHoldTimeoutParseAndRepost(t *testing.T) {
	s := startServer(t, Config{Speed: 0, Engine: sim.Config{StepBase: 0.01}})
	for _, q := range []string{"inf", "+Inf", "Infinity", "-inf", "1e300", "1e18", "0x1p1000", "600.001"} {
		if code, b := post(t, s.URL()+"/sim/hold?timeout_s="+q, ""); code != 400 {
			t.Fatalf("timeout_s=%s: %d %s", q, code, b)
		}
	}
	if _, b := get(t, s.URL()+"/sim/hold"); !strings.Contains(string(b), `"held":false`) {
		t.Fatalf("a rejected timeout held the engine: %s", b)
	}
	if code, b := post(t, s.URL()+"/sim/hold?timeout_s=0.3", ""); code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	if code, b := post(t, s.URL()+"/sim/hold?timeout_s=600", ""); code != 200 { // re-post while held
		t.Fatalf("%d %s", code, b)
	}
	start := time.Now()
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Post(s.URL()+"/v1/completions", "application/json", strings.NewReader(`{"prompt":[1,2,3],"max_tokens":3}`))
	if err != nil {
		t.Fatalf("request not served after the first hold's deadline (re-post extended it): %v", err)
	}
	resp.Body.Close()
	if el := time.Since(start); resp.StatusCode != 200 || el > 3*time.Second {
		t.Fatalf("status %d after %v", resp.StatusCode, el)
	}
}

// TestHoldOrdersBurstByHeader: a burst sent during a hold in an order that
// is not its numbering (here reversed) queues, at release, in the order of
// its X-Sim-Order numbers; without numbers it stays in arrival order. With
// one running slot the finish order is the queue order.
func TestHoldOrdersBurstByHeader(t *testing.T) {
	const n = 4
	for _, tc := range []struct {
		name     string
		numbered bool
		want     []int // prompt lengths in finish order
	}{
		{"numbered", true, []int{1, 2, 3, 4}},
		{"unnumbered", false, []int{4, 3, 2, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startServer(t, Config{Speed: 0, Engine: sim.Config{StepBase: 0.01, MaxNumSeqs: 1}})
			if code, b := post(t, s.URL()+"/sim/hold?timeout_s=30", ""); code != 200 {
				t.Fatalf("hold: %d %s", code, b)
			}
			var wg sync.WaitGroup
			for k := n; k >= 1; k-- { // arrival order: k = 4, 3, 2, 1
				req, err := http.NewRequest("POST", s.URL()+"/v1/completions", strings.NewReader(
					fmt.Sprintf(`{"prompt":%s,"max_tokens":2}`, idsJSON(100*k, k))))
				if err != nil {
					t.Fatal(err)
				}
				if tc.numbered {
					req.Header.Set(OrderHeader, fmt.Sprint(k))
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					resp, err := http.DefaultClient.Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					resp.Body.Close()
					if resp.StatusCode != 200 {
						t.Errorf("status %d", resp.StatusCode)
					}
				}()
				// The next request is sent once this one is queued.
				want := fmt.Sprintf(`"requests":%d`, n-k+1)
				for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
					if _, b := get(t, s.URL()+"/sim/hold"); strings.Contains(string(b), want) {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("request %d never queued", k)
					}
				}
			}
			if code, b := post(t, s.URL()+"/sim/release", ""); code != 200 {
				t.Fatalf("release: %d %s", code, b)
			}
			wg.Wait()
			_, b := get(t, s.URL()+"/sim/requests")
			var ts []RequestTiming
			if err := json.Unmarshal(b, &ts); err != nil || len(ts) != n {
				t.Fatalf("%v: %s", err, b)
			}
			var got []int
			for _, r := range ts { // recorded in finish order
				got = append(got, r.PromptTokens)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("finish order %v, want %v", got, tc.want)
			}
		})
	}
}

func TestOrderHeaderMustBeAnInteger(t *testing.T) {
	s := startServer(t, Config{Speed: 0, Engine: sim.Config{StepBase: 0.01}})
	for _, v := range []string{"x", "1.5", "", "-9223372036854775808", "99999999999999999999"} {
		req, _ := http.NewRequest("POST", s.URL()+"/v1/completions", strings.NewReader(`{"prompt":[1,2,3],"max_tokens":2}`))
		req.Header.Set(OrderHeader, v)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if want := map[bool]int{true: 200, false: 400}[v == ""]; resp.StatusCode != want {
			t.Fatalf("%s=%q: status %d, want %d", OrderHeader, v, resp.StatusCode, want)
		}
	}
}
