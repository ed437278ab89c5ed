package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/kvc-router/kvc-router/testbed/sim"
)

// The endpoints below are what request routers (sglang-router, vllm-router)
// call on a worker besides /v1/completions: vLLM's /tokenize, /detokenize and
// /v1/completions/render, /version, and the SGLang-style server/model info
// probes (vLLM itself answers those with 404; a router then only logs a
// warning, but serving them lets the routers start without noise and learn the
// block size). Text is tokenised by sim.Tokenize, the one tokenizer the
// simulator uses for text prompts, so /tokenize and /v1/completions agree.

// tokenizeRequest is vLLM's TokenizeCompletionRequest (the chat form with
// "messages" is not served: the arena sends completions only).
type tokenizeRequest struct {
	Model            string          `json:"model"`
	Prompt           *string         `json:"prompt"`
	Messages         json.RawMessage `json:"messages"`
	AddSpecialTokens *bool           `json:"add_special_tokens"`
	ReturnTokenStrs  *bool           `json:"return_token_strs"`
}

// tokenizeResponse is vLLM's TokenizeResponse.
type tokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []int32  `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}

func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return nil, false
	}
	return body, true
}

// readCompletion reads and parses a /v1/completions-shaped body and checks
// its model, answering the error itself when it returns false.
func (s *Server) readCompletion(w http.ResponseWriter, r *http.Request) (*CompletionRequest, bool) {
	body, ok := s.readBody(w, r)
	if !ok {
		return nil, false
	}
	req, err := ParseCompletionRequest(body, s.cores[0].eng.Config().VocabSize)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return nil, false
	}
	return req, s.checkModel(w, req.Model)
}

// checkModel mirrors vLLM's _check_model: an absent or empty model means the
// served one; any other name is 404 NotFoundError.
func (s *Server) checkModel(w http.ResponseWriter, model string) bool {
	served := s.cores[0].eng.Config().ModelName
	if model != "" && model != served {
		writeErrorTyped(w, http.StatusNotFound, "NotFoundError", fmt.Sprintf("The model `%s` does not exist.", model))
		return false
	}
	return true
}

func (s *Server) maxModelLen() int {
	cfg := s.cores[0].eng.Config()
	return cfg.NumGPUBlocks * cfg.BlockSize
}

func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	var req tokenizeRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON: "+err.Error())
		return
	}
	if !s.checkModel(w, req.Model) {
		return
	}
	if req.Prompt == nil {
		if len(req.Messages) > 0 {
			writeError(w, http.StatusBadRequest, "chat tokenization (messages) is not supported by the simulator")
		} else {
			writeError(w, http.StatusBadRequest, "prompt is required")
		}
		return
	}
	ids := sim.Tokenize(*req.Prompt, s.cores[0].eng.Config().VocabSize)
	resp := tokenizeResponse{Count: len(ids), MaxModelLen: s.maxModelLen(), Tokens: ids}
	if req.ReturnTokenStrs != nil && *req.ReturnTokenStrs {
		resp.TokenStrs = make([]string, len(ids))
		for i := range ids {
			resp.TokenStrs[i] = sim.Detokenize(ids[i : i+1])
		}
	}
	writeJSON(w, http.StatusOK, resp)
}

func (s *Server) handleDetokenize(w http.ResponseWriter, r *http.Request) {
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	var req struct {
		Model  string  `json:"model"`
		Tokens []int64 `json:"tokens"`
	}
	if err := json.Unmarshal(body, &req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON: "+err.Error())
		return
	}
	if !s.checkModel(w, req.Model) {
		return
	}
	vocab := int64(s.cores[0].eng.Config().VocabSize)
	ids := make([]int32, len(req.Tokens))
	for i, t := range req.Tokens {
		if t < 0 || t >= vocab {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("token id %d out of vocabulary [0, %d)", t, vocab))
			return
		}
		ids[i] = int32(t)
	}
	writeJSON(w, http.StatusOK, map[string]any{"prompt": sim.Detokenize(ids)})
}

// renderedRequest is one element of vLLM's /v1/completions/render reply: a
// token-in GenerateRequest (the shape of vLLM's disaggregated render server).
type renderedRequest struct {
	RequestID      string         `json:"request_id"`
	TokenIDs       []int32        `json:"token_ids"`
	Features       any            `json:"features"`
	SamplingParams map[string]any `json:"sampling_params"`
	Model          string         `json:"model"`
	Stream         bool           `json:"stream"`
	StreamOptions  any            `json:"stream_options"`
	CacheSalt      any            `json:"cache_salt"`
	Priority       int            `json:"priority"`
}

// handleRender is POST /v1/completions/render: the completion request parsed
// and tokenised exactly as /v1/completions would, without generating.
func (s *Server) handleRender(w http.ResponseWriter, r *http.Request) {
	req, ok := s.readCompletion(w, r)
	if !ok {
		return
	}
	var opts any
	if req.Stream {
		opts = map[string]any{"include_usage": req.IncludeUsage}
	}
	model := req.Model
	if model == "" {
		model = s.cores[0].eng.Config().ModelName
	}
	writeJSON(w, http.StatusOK, []renderedRequest{{
		RequestID: "cmpl-" + s.newRequestID(),
		TokenIDs:  req.Prompt,
		SamplingParams: map[string]any{
			"max_tokens": req.MaxTokens, "seed": req.Seed, "n": 1,
		},
		Model: model, Stream: req.Stream, StreamOptions: opts,
	}})
}

// handleServerInfo answers the SGLang-style /server_info and
// /get_server_info probes with the fields routers read.
func (s *Server) handleServerInfo(w http.ResponseWriter, r *http.Request) {
	cfg := s.cores[0].eng.Config()
	writeJSON(w, http.StatusOK, map[string]any{
		"model_path":                     cfg.ModelName,
		"served_model_name":              cfg.ModelName,
		"page_size":                      cfg.BlockSize,
		"kv_block_size":                  cfg.BlockSize,
		"effective_attention_block_size": cfg.BlockSize,
		"max_total_num_tokens":           cfg.NumGPUBlocks * cfg.BlockSize,
		"max_running_requests":           cfg.MaxNumSeqs,
		"dp_size":                        len(s.cores),
		"version":                        "vllm-sim",
	})
}

// handleModelInfo answers /model_info and /get_model_info.
func (s *Server) handleModelInfo(w http.ResponseWriter, r *http.Request) {
	cfg := s.cores[0].eng.Config()
	writeJSON(w, http.StatusOK, map[string]any{
		"model_path": cfg.ModelName, "tokenizer_path": cfg.ModelName, "is_generation": true,
	})
}

func writeErrorTyped(w http.ResponseWriter, code int, typ, msg string) {
	writeJSON(w, code, map[string]any{"object": "error", "message": msg, "type": typ, "param": nil, "code": code})
}
