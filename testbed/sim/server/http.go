package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/kvc-router/kvc-router/testbed/sim"
)

// CompletionRequest is the parsed subset of OpenAI/vLLM CompletionRequest
// the simulator honours.
type CompletionRequest struct {
	Model string
	// Prompt holds token ids; a text prompt is tokenised with sim.Tokenize.
	Prompt         []int32
	PromptIsText   bool
	MaxTokens      int
	Stream         bool
	IncludeUsage   bool
	ReturnTokenIDs bool
	Seed           uint64
}

type rawCompletionRequest struct {
	Model          string          `json:"model"`
	Prompt         json.RawMessage `json:"prompt"`
	MaxTokens      *int64          `json:"max_tokens"`
	N              *int            `json:"n"`
	Stream         bool            `json:"stream"`
	ReturnTokenIDs *bool           `json:"return_token_ids"`
	Seed           *int64          `json:"seed"`
	StreamOptions  *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// DefaultMaxTokens is vLLM's completions default.
const DefaultMaxTokens = 16

// ParseCompletionRequest decodes a /v1/completions body. prompt may be a
// list of token ids, a string, or a one-element list of either (batched
// prompts are rejected); text is tokenised with sim.Tokenize(text, vocab).
func ParseCompletionRequest(body []byte, vocab int) (*CompletionRequest, error) {
	var raw rawCompletionRequest
	if err := json.Unmarshal(body, &raw); err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	req := &CompletionRequest{Model: raw.Model, Stream: raw.Stream, MaxTokens: DefaultMaxTokens}
	if raw.N != nil && *raw.N != 1 {
		return nil, errors.New("only n=1 is supported")
	}
	if raw.MaxTokens != nil {
		if *raw.MaxTokens < 1 || *raw.MaxTokens > math.MaxInt32 {
			return nil, fmt.Errorf("max_tokens must be at least 1, got %d", *raw.MaxTokens)
		}
		req.MaxTokens = int(*raw.MaxTokens)
	}
	if raw.ReturnTokenIDs != nil {
		req.ReturnTokenIDs = *raw.ReturnTokenIDs
	}
	if raw.Seed != nil {
		req.Seed = uint64(*raw.Seed)
	}
	if raw.StreamOptions != nil {
		req.IncludeUsage = raw.StreamOptions.IncludeUsage
	}
	if len(raw.Prompt) == 0 || string(raw.Prompt) == "null" {
		return nil, errors.New("prompt is required")
	}
	var text string
	var ids []int64
	var texts []string
	var idss [][]int64
	switch {
	case json.Unmarshal(raw.Prompt, &text) == nil:
		req.PromptIsText = true
	case json.Unmarshal(raw.Prompt, &ids) == nil:
	case json.Unmarshal(raw.Prompt, &texts) == nil:
		if len(texts) != 1 {
			return nil, errors.New("batched prompts are not supported")
		}
		text, req.PromptIsText = texts[0], true
	case json.Unmarshal(raw.Prompt, &idss) == nil:
		if len(idss) != 1 {
			return nil, errors.New("batched prompts are not supported")
		}
		ids = idss[0]
	default:
		return nil, errors.New("prompt must be a string or a list of token ids")
	}
	if req.PromptIsText {
		req.Prompt = sim.Tokenize(text, vocab)
	} else {
		req.Prompt = make([]int32, len(ids))
		for i, id := range ids {
			if id < 0 || id >= int64(vocab) {
				return nil, fmt.Errorf("token id %d out of vocabulary [0, %d)", id, vocab)
			}
			req.Prompt[i] = int32(id)
		}
	}
	if len(req.Prompt) == 0 {
		return nil, errors.New("prompt is empty")
	}
	return req, nil
}

// Handler returns the HTTP routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", s.handleCompletions)
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /metrics", s.handleMetrics)
	mux.HandleFunc("POST /reset_prefix_cache", s.handleReset)
	mux.HandleFunc("GET /sim/cached_blocks", s.handleCachedBlocks)
	mux.HandleFunc("GET /sim/stats", s.handleStats)
	mux.HandleFunc("POST /sim/drop_kv_events", s.handleDrop)
	mux.HandleFunc("GET /sim/requests", s.handleTimings)
	mux.HandleFunc("POST /sim/hold", s.handleHold)
	mux.HandleFunc("POST /sim/release", s.handleRelease)
	mux.HandleFunc("GET /sim/hold", s.handleHoldState)
	mux.HandleFunc("POST /tokenize", s.handleTokenize)
	mux.HandleFunc("POST /detokenize", s.handleDetokenize)
	mux.HandleFunc("POST /v1/completions/render", s.handleRender)
	mux.HandleFunc("GET /version", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"version": "vllm-sim"})
	})
	for _, p := range []string{"/server_info", "/get_server_info"} {
		mux.HandleFunc("GET "+p, s.handleServerInfo)
	}
	for _, p := range []string{"/model_info", "/get_model_info"} {
		mux.HandleFunc("GET "+p, s.handleModelInfo)
	}
	return mux
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	typ := "BadRequestError"
	if code >= 500 {
		typ = "InternalServerError"
	}
	writeJSON(w, code, map[string]any{"object": "error", "message": msg, "type": typ, "param": nil, "code": code})
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type choice struct {
	Index          int     `json:"index"`
	Text           string  `json:"text"`
	Logprobs       any     `json:"logprobs"`
	FinishReason   *string `json:"finish_reason"`
	StopReason     any     `json:"stop_reason"`
	TokenIDs       []int32 `json:"token_ids"`
	PromptTokenIDs []int32 `json:"prompt_token_ids,omitempty"`
}

type completionResponse struct {
	ID      string   `json:"id"`
	Object  string   `json:"object"`
	Created int64    `json:"created"`
	Model   string   `json:"model"`
	Choices []choice `json:"choices"`
	Usage   *usage   `json:"usage,omitempty"`
}

func mkUsage(prompt, completion, cached int) *usage {
	u := &usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion}
	u.PromptTokensDetails.CachedTokens = cached
	return u
}

// OrderHeader (simulator-only) numbers a request within a burst sent during
// a hold (POST /sim/hold): at release, the burst's requests queue in the
// order of their numbers (ties and unnumbered requests keep arrival order),
// so a client whose threads deliver a burst in a different order every run
// still gets the same engine schedule. Outside a hold it is ignored; real
// vLLM ignores it too.
const OrderHeader = "X-Sim-Order"

func (s *Server) handleCompletions(w http.ResponseWriter, r *http.Request) {
	model := s.cores[0].eng.Config().ModelName // immutable after New
	req, ok := s.readCompletion(w, r)
	if !ok {
		return
	}
	order := int64(noOrder)
	if v := r.Header.Get(OrderHeader); v != "" {
		k, err := strconv.ParseInt(v, 10, 64)
		if err != nil || k == noOrder {
			writeError(w, http.StatusBadRequest, OrderHeader+" must be an integer")
			return
		}
		order = k
	}
	c := s.pickCore()
	id := s.newRequestID()
	p, err := c.submit(sim.Request{ID: id, Prompt: req.Prompt, MaxTokens: req.MaxTokens, SamplingSeed: req.Seed}, order)
	if err != nil {
		code := http.StatusBadRequest
		if errors.Is(err, errStopped) {
			code = http.StatusServiceUnavailable
		}
		writeError(w, code, err.Error())
		return
	}
	created := time.Now().Unix()
	var flusher http.Flusher
	if req.Stream {
		flusher, _ = w.(http.Flusher)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
	}
	sent := 0
	for {
		select {
		case <-p.notify:
		case <-r.Context().Done():
			c.abort(id)
			return
		}
		p.mu.Lock()
		toks := p.tokens
		done, perr, comp, cached := p.done, p.err, p.comp, p.cached
		p.mu.Unlock()
		if perr != nil {
			if req.Stream {
				writeSSE(w, map[string]any{"object": "error", "message": perr.Error(), "code": 503})
				flush(flusher)
			} else {
				writeError(w, http.StatusServiceUnavailable, perr.Error())
			}
			return
		}
		if req.Stream {
			for sent < len(toks) {
				ch := choice{Text: sim.Detokenize(toks[sent : sent+1]), TokenIDs: toks[sent : sent+1]}
				if sent == 0 && req.ReturnTokenIDs {
					ch.PromptTokenIDs = req.Prompt
				}
				if done && sent == len(toks)-1 {
					fr := comp.FinishReason
					ch.FinishReason = &fr
				}
				writeSSE(w, completionResponse{ID: id, Object: "text_completion", Created: created, Model: model, Choices: []choice{ch}})
				sent++
			}
			if done && req.IncludeUsage {
				writeSSE(w, completionResponse{ID: id, Object: "text_completion", Created: created, Model: model,
					Choices: []choice{}, Usage: mkUsage(len(req.Prompt), len(comp.OutputTokens), cached)})
			}
			if done {
				_, _ = io.WriteString(w, "data: [DONE]\n\n")
			}
			flush(flusher)
		}
		if done {
			if !req.Stream {
				fr := comp.FinishReason
				ch := choice{Text: sim.Detokenize(comp.OutputTokens), TokenIDs: comp.OutputTokens, FinishReason: &fr}
				if req.ReturnTokenIDs {
					ch.PromptTokenIDs = req.Prompt
				}
				writeJSON(w, http.StatusOK, completionResponse{ID: id, Object: "text_completion", Created: created,
					Model: model, Choices: []choice{ch}, Usage: mkUsage(len(req.Prompt), len(comp.OutputTokens), comp.CachedTokens)})
			}
			return
		}
	}
}

func writeSSE(w io.Writer, v any) {
	b, _ := json.Marshal(v)
	_, _ = io.WriteString(w, "data: ")
	_, _ = w.Write(b)
	_, _ = io.WriteString(w, "\n\n")
}

func flush(f http.Flusher) {
	if f != nil {
		f.Flush()
	}
}

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	cfg := s.cores[0].eng.Config()
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list",
		"data": []map[string]any{{
			"id": cfg.ModelName, "object": "model", "created": int64(s.created), "owned_by": "vllm",
			"root": cfg.ModelName, "parent": nil, "max_model_len": cfg.NumGPUBlocks * cfg.BlockSize,
		}},
	})
}

func (s *Server) snapshots() ([]engineSnapshot, error) {
	snaps := make([]engineSnapshot, 0, len(s.cores))
	for _, c := range s.cores {
		snap, err := c.snapshot()
		if err != nil {
			return nil, err
		}
		snaps = append(snaps, snap)
	}
	return snaps, nil
}

func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	snaps, err := s.snapshots()
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = io.WriteString(w, renderMetrics(s.cores[0].eng.Config().ModelName, s.cfg.PrefixCachingHashAlgo, snaps))
}

// handleReset is POST /reset_prefix_cache. Like vLLM it fails while requests
// hold blocks (409 here) unless ?reset_running_requests=true, which
// preempts them first. Success emits AllBlocksCleared on every rank.
func (s *Server) handleReset(w http.ResponseWriter, r *http.Request) {
	force, _ := strconv.ParseBool(r.URL.Query().Get("reset_running_requests"))
	allOK := true
	for _, c := range s.cores {
		var ok bool
		err := c.do(func(e *sim.Engine) {
			events, done := e.ResetPrefixCache(force)
			ok = done
			if done && len(events) > 0 && c.pub != nil {
				c.pub.Publish(newBatch(events, c.rank))
			}
		})
		if err != nil {
			writeError(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		allOK = allOK && ok
	}
	if !allOK {
		writeError(w, http.StatusConflict, "prefix cache not reset: requests are running (use ?reset_running_requests=true)")
		return
	}
	w.WriteHeader(http.StatusOK)
}

type cachedBlockJSON struct {
	Engine int    `json:"engine"`
	Hash   uint64 `json:"hash"`
	Medium string `json:"medium"`
	Count  int    `json:"count"`
}

// handleCachedBlocks is GET /sim/cached_blocks: the engines' true resident
// block set (engine hash, medium, copies), for end-to-end checks.
func (s *Server) handleCachedBlocks(w http.ResponseWriter, r *http.Request) {
	out := []cachedBlockJSON{}
	for _, c := range s.cores {
		var m map[sim.CachedBlock]int
		if err := c.do(func(e *sim.Engine) { m = e.CachedBlocks() }); err != nil {
			writeError(w, http.StatusServiceUnavailable, err.Error())
			return
		}
		start := len(out)
		for k, v := range m {
			out = append(out, cachedBlockJSON{c.rank, k.Hash, k.Medium, v})
		}
		part := out[start:]
		sort.Slice(part, func(i, j int) bool {
			if part[i].Medium != part[j].Medium {
				return part[i].Medium < part[j].Medium
			}
			return part[i].Hash < part[j].Hash
		})
	}
	writeJSON(w, http.StatusOK, out)
}

// handleStats is GET /sim/stats: sim.Stats per engine.
func (s *Server) handleStats(w http.ResponseWriter, r *http.Request) {
	snaps, err := s.snapshots()
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	out := make([]sim.Stats, len(snaps))
	for i, sn := range snaps {
		out[i] = sn.stats
	}
	writeJSON(w, http.StatusOK, out)
}

// handleDrop is POST /sim/drop_kv_events?next=N or ?seq=S (repeatable)
// [&engine=R]: withhold batches from the live stream (they stay replayable).
func (s *Server) handleDrop(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	rank, _ := strconv.Atoi(q.Get("engine"))
	if rank < 0 || rank >= len(s.cores) || s.cores[rank].pub == nil {
		writeError(w, http.StatusBadRequest, "no KV event publisher for that engine")
		return
	}
	pub := s.cores[rank].pub
	// Validate everything first: a rejected request changes nothing.
	next := 0
	if n := q.Get("next"); n != "" {
		k, err := strconv.Atoi(n)
		if err != nil || k < 0 {
			writeError(w, http.StatusBadRequest, "bad next")
			return
		}
		next = k
	}
	var seqs []uint64
	for _, v := range q["seq"] {
		seq, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, "bad seq")
			return
		}
		seqs = append(seqs, seq)
	}
	pub.DropNext(next)
	pub.DropSeqs(seqs...)
	writeJSON(w, http.StatusOK, map[string]any{"next_seq": pub.NextSeq(), "dropped": pub.Dropped()})
}

// handleTimings is GET /sim/requests: the simulated-clock timings of the last
// finished requests of every engine (oldest first per engine).
func (s *Server) handleTimings(w http.ResponseWriter, r *http.Request) {
	out := []RequestTiming{}
	for _, c := range s.cores {
		err := c.do(func(*sim.Engine) {
			if c.nTimed > int64(len(c.timings)) { // wrapped: oldest entry is at nTimed mod cap
				k := int(c.nTimed % int64(len(c.timings)))
				out = append(out, c.timings[k:]...)
				out = append(out, c.timings[:k]...)
			} else {
				out = append(out, c.timings...)
			}
		})
		if err != nil {
			writeError(w, http.StatusServiceUnavailable, err.Error())
			return
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// maxHold bounds a hold: a client that dies while holding must not stop
// the fleet for good.
const maxHold = 10 * time.Minute

// handleHold is POST /sim/hold[?timeout_s=T]: every engine of this server
// stops stepping and freezes its clock until POST /sim/release or T wall
// seconds (default 60, at most 600). Requests still queue. Posting again
// while held does not move the deadline (a client re-posting in a loop
// could otherwise hold the fleet forever). Simulator-only.
func (s *Server) handleHold(w http.ResponseWriter, r *http.Request) {
	d := time.Minute
	if v := r.URL.Query().Get("timeout_s"); v != "" {
		// Compared as a float: converting inf, 1e300 or 0x1p1000 seconds
		// to a Duration overflowed (to a negative hold that never held).
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f > 0 && f <= maxHold.Seconds()) {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("timeout_s must be in (0, %.0f]", maxHold.Seconds()))
			return
		}
		d = time.Duration(f * float64(time.Second))
	}
	until := time.Now().Add(d)
	for _, c := range s.cores {
		if err := c.do(func(*sim.Engine) { c.hold(until) }); err != nil {
			writeError(w, http.StatusServiceUnavailable, err.Error())
			return
		}
	}
	s.handleHoldState(w, r)
}

// handleRelease is POST /sim/release: the engines step again, their clocks
// resuming where they froze.
func (s *Server) handleRelease(w http.ResponseWriter, r *http.Request) {
	held := 0.0
	for _, c := range s.cores {
		if err := c.do(func(*sim.Engine) { held = max(held, c.release().Seconds()) }); err != nil {
			writeError(w, http.StatusServiceUnavailable, err.Error())
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"held": false, "held_wall_s": held})
}

// handleHoldState is GET /sim/hold: whether any engine is held and how many
// requests the engines hold (waiting or running), so a client can release
// once everything it sent has arrived.
func (s *Server) handleHoldState(w http.ResponseWriter, r *http.Request) {
	held, queued := false, 0
	for _, c := range s.cores {
		if err := c.do(func(e *sim.Engine) {
			held = held || c.held
			queued += len(c.pend)
		}); err != nil {
			writeError(w, http.StatusServiceUnavailable, err.Error())
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"held": held, "requests": queued})
}
