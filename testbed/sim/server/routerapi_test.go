package server

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/kvc-router/kvc-router/testbed/sim"
)

func TestTokenize(t *testing.T) {
	s := startServer(t, Config{})
	vocab := sim.DefaultVocabSize
	tests := []struct {
		name string
		body string
		code int
		want []int32 // checked when code == 200
	}{
		{"text", `{"model":"test/model","prompt":"alpha beta gamma"}`, 200, sim.Tokenize("alpha beta gamma", vocab)},
		{"no model means served model", `{"prompt":"alpha"}`, 200, sim.Tokenize("alpha", vocab)},
		{"empty text", `{"prompt":""}`, 200, []int32{}},
		{"wrong model", `{"model":"other","prompt":"alpha"}`, 404, nil},
		{"no prompt", `{"model":"test/model"}`, 400, nil},
		{"chat messages", `{"messages":[{"role":"user","content":"hi"}]}`, 400, nil},
		{"bad json", `{"prompt":`, 400, nil},
		{"prompt not a string", `{"prompt":[1,2]}`, 400, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, b := post(t, s.URL()+"/tokenize", tc.body)
			if code != tc.code {
				t.Fatalf("status %d want %d: %s", code, tc.code, b)
			}
			if code != 200 {
				if !strings.Contains(string(b), `"object":"error"`) {
					t.Fatalf("error body %s", b)
				}
				return
			}
			var r tokenizeResponse
			if err := json.Unmarshal(b, &r); err != nil {
				t.Fatal(err)
			}
			if r.Count != len(tc.want) || !reflect.DeepEqual(append([]int32{}, r.Tokens...), tc.want) {
				t.Fatalf("got %+v want %v", r, tc.want)
			}
			if r.MaxModelLen != 256*sim.DefaultBlockSize {
				t.Fatalf("max_model_len %d", r.MaxModelLen)
			}
		})
	}
}

// A text prefix tokenises to a token prefix, and /tokenize agrees with what
// /v1/completions charges as prompt tokens: the property the arena's
// kvc_aware client relies on.
func TestTokenizeMatchesCompletions(t *testing.T) {
	s := startServer(t, Config{})
	_, b1 := post(t, s.URL()+"/tokenize", `{"prompt":"a b c d e"}`)
	_, b2 := post(t, s.URL()+"/tokenize", `{"prompt":"a b c d e f g","return_token_strs":true}`)
	var r1, r2 tokenizeResponse
	if err := json.Unmarshal(b1, &r1); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b2, &r2); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(r1.Tokens, r2.Tokens[:5]) || len(r2.TokenStrs) != 7 {
		t.Fatalf("%v is not a prefix of %v (strs %v)", r1.Tokens, r2.Tokens, r2.TokenStrs)
	}
	code, b := post(t, s.URL()+"/v1/completions", `{"prompt":"a b c d e f g","max_tokens":1,"return_token_ids":true}`)
	if code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	var c respJSON
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.Choices[0].PromptTokenIDs, r2.Tokens) {
		t.Fatalf("completions prompt ids %v, tokenize %v", c.Choices[0].PromptTokenIDs, r2.Tokens)
	}
}

func TestDetokenize(t *testing.T) {
	s := startServer(t, Config{})
	tests := []struct {
		name, body string
		code       int
		want       string
	}{
		{"ids", `{"tokens":[1,2]}`, 200, " t1 t2"},
		{"empty", `{"tokens":[]}`, 200, ""},
		{"out of vocab", `{"tokens":[32000]}`, 400, ""},
		{"wrong model", `{"model":"x","tokens":[1]}`, 404, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, b := post(t, s.URL()+"/detokenize", tc.body)
			if code != tc.code {
				t.Fatalf("status %d want %d: %s", code, tc.code, b)
			}
			if code == 200 {
				var r struct{ Prompt string }
				if err := json.Unmarshal(b, &r); err != nil || r.Prompt != tc.want {
					t.Fatalf("%s (%v)", b, err)
				}
			}
		})
	}
}

func TestRender(t *testing.T) {
	s := startServer(t, Config{})
	vocab := sim.DefaultVocabSize
	tests := []struct {
		name      string
		body      string
		code      int
		want      []int32
		maxTokens int
	}{
		{"text", `{"model":"test/model","prompt":"x y z","max_tokens":7}`, 200, sim.Tokenize("x y z", vocab), 7},
		{"ids", `{"prompt":[5,6,7]}`, 200, []int32{5, 6, 7}, DefaultMaxTokens},
		{"one-element text list", `{"prompt":["x y"],"stream":true}`, 200, sim.Tokenize("x y", vocab), DefaultMaxTokens},
		{"wrong model", `{"model":"nope","prompt":"x"}`, 404, nil, 0},
		{"empty text", `{"prompt":""}`, 400, nil, 0},
		{"batch", `{"prompt":["a","b"]}`, 400, nil, 0},
		{"bad json", `[`, 400, nil, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, b := post(t, s.URL()+"/v1/completions/render", tc.body)
			if code != tc.code {
				t.Fatalf("status %d want %d: %s", code, tc.code, b)
			}
			if code != 200 {
				return
			}
			var out []struct {
				RequestID      string         `json:"request_id"`
				TokenIDs       []int32        `json:"token_ids"`
				Model          string         `json:"model"`
				SamplingParams map[string]any `json:"sampling_params"`
			}
			if err := json.Unmarshal(b, &out); err != nil {
				t.Fatal(err)
			}
			if len(out) != 1 || !reflect.DeepEqual(out[0].TokenIDs, tc.want) || out[0].Model != "test/model" ||
				!strings.HasPrefix(out[0].RequestID, "cmpl-") || out[0].SamplingParams["max_tokens"] != float64(tc.maxTokens) {
				t.Fatalf("render %s", b)
			}
		})
	}
}

func TestInfoProbes(t *testing.T) {
	s := startServer(t, Config{Engine: sim.Config{BlockSize: 32}})
	tests := []struct {
		path, key string
		want      any
	}{
		{"/server_info", "kv_block_size", float64(32)},
		{"/get_server_info", "model_path", "test/model"},
		{"/model_info", "is_generation", true},
		{"/get_model_info", "model_path", "test/model"},
		{"/version", "version", "vllm-sim"},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			code, b := get(t, s.URL()+tc.path)
			if code != 200 {
				t.Fatalf("%d %s", code, b)
			}
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			if m[tc.key] != tc.want {
				t.Fatalf("%s = %v want %v", tc.key, m[tc.key], tc.want)
			}
		})
	}
}

func TestSimRequestTimings(t *testing.T) {
	s := startServer(t, Config{})
	for i, body := range []string{`{"prompt":"a b c","max_tokens":2}`, `{"prompt":"a b c d","max_tokens":3}`} {
		if code, b := post(t, s.URL()+"/v1/completions", body); code != 200 {
			t.Fatalf("request %d: %d %s", i, code, b)
		}
	}
	code, b := get(t, s.URL()+"/sim/requests")
	if code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	var ts []RequestTiming
	if err := json.Unmarshal(b, &ts); err != nil {
		t.Fatal(err)
	}
	if len(ts) != 2 || ts[0].PromptTokens != 3 || ts[1].PromptTokens != 4 {
		t.Fatalf("timings %+v", ts)
	}
	for _, x := range ts {
		if !(x.Arrival <= x.FirstToken && x.FirstToken <= x.Finish) || x.ID == "" {
			t.Fatalf("timing out of order %+v", x)
		}
	}
}
