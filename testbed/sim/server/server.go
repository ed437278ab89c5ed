// Package server runs simulated vLLM engines (package sim) behind vLLM's
// HTTP API (/v1/completions, /v1/models, /health, /metrics,
// /reset_prefix_cache) and publishes KV-cache events over ZMQ exactly as
// vLLM does. Servers can be started in-process (tests, launchers) or from
// cmd/vllm-sim.
package server

import (
	"context"
	"errors"
	"fmt"
	"github.com/kvc-router/kvc-router/core/kvcrouter"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvc-router/kvc-router/testbed/sim"
)

// Config configures one simulated vLLM API server.
type Config struct {
	// Engine is the engine model (one per data-parallel rank).
	Engine sim.Config
	// DataParallelSize runs this many engines, labelled engine="0".."N-1"
	// in /metrics, each with its own event publisher (ports offset by rank,
	// as vLLM does). Default 1.
	DataParallelSize int
	// Addr is the HTTP listen address, e.g. "127.0.0.1:8000" (":0" picks).
	Addr string
	// Speed scales simulated time to wall time: each step sleeps
	// Duration/Speed. 0, negative or +Inf runs as fast as possible
	// (simulated time then advances only by step durations).
	Speed float64
	// PacedClock (with Speed > 0): steps are still paced at Speed, but a
	// busy engine's clock advances only by its step durations, and catches
	// up with wall time x Speed only while the engine is idle. A stall of
	// the host (a shared machine's other jobs) then no longer adds
	// simulated time to the requests being served; idle gaps (a client's
	// think or tool time) still count as wall time. Without it the clock
	// is wall time x Speed throughout.
	PacedClock bool

	// KVEventsEndpoint enables KV events on this PUB endpoint (bound).
	KVEventsEndpoint string
	// KVEventsReplayEndpoint enables the ROUTER replay socket.
	KVEventsReplayEndpoint string
	KVEventsTopic          string
	KVEventsLayout         kvcrouter.EventLayout
	KVEventsBufferSteps    int
	KVEventsReplayLayout   int
	KVEventsDropEvery      int

	// PrefixCachingHashAlgo is reported in vllm:cache_config_info
	// (default "xxhash"; the simulator's own chained xxhash64).
	PrefixCachingHashAlgo string
	Logger                *slog.Logger
}

// Server is a running simulated vLLM API server.
type Server struct {
	cfg     Config
	log     *slog.Logger
	cores   []*core
	ln      net.Listener
	httpSrv *http.Server
	created float64
	reqSeq  atomic.Uint64
	idBase  string
	wg      sync.WaitGroup
	closeMu sync.Mutex
	closed  bool
}

// New validates the config, binds the HTTP listener and the ZMQ sockets, and
// starts serving.
func New(cfg Config) (*Server, error) {
	if cfg.DataParallelSize <= 0 {
		cfg.DataParallelSize = 1
	}
	if cfg.PrefixCachingHashAlgo == "" {
		cfg.PrefixCachingHashAlgo = "xxhash"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	s := &Server{cfg: cfg, log: cfg.Logger, created: float64(time.Now().UnixNano()) / 1e9}
	s.idBase = strconv.FormatUint(uint64(time.Now().UnixNano())&0xffffff, 16)
	ok := false
	defer func() {
		if !ok {
			s.shutdownCores()
		}
	}()
	for r := 0; r < cfg.DataParallelSize; r++ {
		ec := cfg.Engine
		if r > 0 {
			ec.Seed = cfg.Engine.Seed + uint64(r)
			if cfg.Engine.HashSalt != 0 {
				ec.HashSalt = cfg.Engine.HashSalt + uint64(r)
			}
		}
		eng, err := sim.New(ec)
		if err != nil {
			return nil, err
		}
		c := newCore(r, eng, cfg.Speed, s.created)
		c.paced = cfg.PacedClock && c.speed > 0
		if cfg.KVEventsEndpoint != "" {
			pc := PublisherConfig{
				Endpoint: offsetEndpoint(cfg.KVEventsEndpoint, r), Topic: cfg.KVEventsTopic,
				Layout: cfg.KVEventsLayout, BufferSteps: cfg.KVEventsBufferSteps,
				ReplayLayout: cfg.KVEventsReplayLayout, DropEvery: cfg.KVEventsDropEvery,
				DPRank: r, Logger: cfg.Logger,
			}
			if cfg.KVEventsReplayEndpoint != "" {
				pc.ReplayEndpoint = offsetEndpoint(cfg.KVEventsReplayEndpoint, r)
			}
			pub, err := NewPublisher(pc)
			if err != nil {
				return nil, err
			}
			c.pub = pub
		}
		s.cores = append(s.cores, c)
		s.wg.Add(1)
		go func() { defer s.wg.Done(); c.loop() }()
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, err
	}
	s.ln = ln
	s.httpSrv = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("http serve", "err", err)
		}
	}()
	ok = true
	return s, nil
}

// offsetEndpoint adds rank to the port of tcp://host:port (port 0 stays 0).
func offsetEndpoint(ep string, rank int) string {
	if rank == 0 {
		return ep
	}
	i := strings.LastIndexByte(ep, ':')
	if i < 0 {
		return ep
	}
	port, err := strconv.Atoi(ep[i+1:])
	if err != nil || port == 0 {
		return ep
	}
	return ep[:i+1] + strconv.Itoa(port+rank)
}

// URL is the server's base URL, e.g. http://127.0.0.1:8000.
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// Config returns the server configuration.
func (s *Server) Config() Config { return s.cfg }

// NumEngines is the data-parallel size.
func (s *Server) NumEngines() int { return len(s.cores) }

// KVEventsEndpoints returns the bound PUB endpoints, one per rank.
func (s *Server) KVEventsEndpoints() []string {
	var out []string
	for _, c := range s.cores {
		if c.pub != nil {
			out = append(out, c.pub.Endpoint())
		}
	}
	return out
}

// ReplayEndpoints returns the bound ROUTER endpoints, one per rank.
func (s *Server) ReplayEndpoints() []string {
	var out []string
	for _, c := range s.cores {
		if c.pub != nil && c.pub.ReplayEndpoint() != "" {
			out = append(out, c.pub.ReplayEndpoint())
		}
	}
	return out
}

// FlushEvents waits until every KV event batch the engines have produced
// so far has been numbered and sent.
func (s *Server) FlushEvents() {
	for _, c := range s.cores {
		if c.pub != nil {
			_ = c.do(func(*sim.Engine) {}) // the engine has queued what it produced
			c.pub.Flush()
		}
	}
}

// Publisher returns rank's publisher (nil when events are off).
func (s *Server) Publisher(rank int) *Publisher { return s.cores[rank].pub }

// Do runs f on rank's engine goroutine and waits for it. f must not retain
// the engine.
func (s *Server) Do(rank int, f func(e *sim.Engine)) error {
	return s.cores[rank].do(f)
}

// Close stops the HTTP server, the engines and the publishers.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	return s.Shutdown(ctx)
}

// Shutdown stops the engines (in-flight requests fail with 503), lets
// handlers finish within ctx, then closes remaining connections and the
// publishers.
func (s *Server) Shutdown(ctx context.Context) error {
	s.closeMu.Lock()
	if s.closed {
		s.closeMu.Unlock()
		return nil
	}
	s.closed = true
	s.closeMu.Unlock()
	// Engines stop first so that streaming handlers see their requests end.
	for _, c := range s.cores {
		c.stop()
	}
	// Connections a client dialled but never used stay "new" and would hold
	// Shutdown for 5 s; past the grace period they are simply closed.
	err := s.httpSrv.Shutdown(ctx)
	if err != nil {
		_ = s.httpSrv.Close()
		if errors.Is(err, context.DeadlineExceeded) {
			err = nil
		}
	}
	s.shutdownCores()
	s.wg.Wait()
	return err
}

func (s *Server) shutdownCores() {
	for _, c := range s.cores {
		c.stop()
		<-c.exited
		if c.pub != nil {
			_ = c.pub.Close()
		}
	}
}

// pending is a request in flight as seen by its HTTP handler.
type pending struct {
	mu       sync.Mutex
	tokens   []int32
	cached   int
	done     bool
	err      error
	comp     sim.Completion
	notify   chan struct{}
	enqueued time.Time
}

func (p *pending) signal() {
	select {
	case p.notify <- struct{}{}:
	default:
	}
}

// core owns one engine; only its goroutine touches the engine.
type core struct {
	rank     int
	eng      *sim.Engine
	speed    float64
	paced    bool
	cmds     chan func()
	quit     chan struct{}
	exited   chan struct{}
	stopOnce sync.Once
	pub      *Publisher
	inflight atomic.Int64

	// owned by the loop goroutine
	pend  map[string]*pending
	virt  float64
	wall0 time.Time
	// A hold (POST /sim/hold) stops the engine from stepping and freezes its
	// clock, so requests submitted "at once" by a client that needs wall
	// time to send them all (a GRPO step's 1,024 samples) arrive at the same
	// simulated instant, as they would on a real fleet where sending takes
	// milliseconds and a step tens of them. Released by POST /sim/release or
	// at holdUntil, whichever comes first.
	held      bool
	heldAt    time.Time
	heldVirt  float64
	holdUntil time.Time
	// heldOrder: the order keys (X-Sim-Order) of the requests that arrived
	// during the hold; at release they queue in key order, not in the order
	// the client's threads happened to deliver them.
	heldOrder map[string]int64
	metrics   engineMetrics
	timings   []RequestTiming // ring of the last maxTimings finished requests
	nTimed    int64           // finished requests ever recorded
}

// RequestTiming is one finished request on the simulated clock, served by
// GET /sim/requests: exact engine-side latencies for benchmarks, free of
// client and proxy overhead.
type RequestTiming struct {
	Engine       int     `json:"engine"`
	ID           string  `json:"id"`
	PromptTokens int     `json:"prompt_tokens"`
	CachedTokens int     `json:"cached_tokens"`
	Arrival      float64 `json:"arrival"`
	FirstToken   float64 `json:"first_token"`
	Finish       float64 `json:"finish"`
}

const maxTimings = 1 << 16

func (c *core) recordTiming(f sim.Completion) {
	t := RequestTiming{Engine: c.rank, ID: f.ID, PromptTokens: f.PromptTokens, CachedTokens: f.CachedTokens,
		Arrival: f.Arrival, FirstToken: f.FirstTokenTime, Finish: f.FinishTime}
	if len(c.timings) < maxTimings {
		c.timings = append(c.timings, t)
	} else {
		c.timings[c.nTimed%maxTimings] = t
	}
	c.nTimed++
}

func newCore(rank int, eng *sim.Engine, speed float64, created float64) *core {
	if speed <= 0 || math.IsInf(speed, 1) {
		speed = 0
	}
	c := &core{rank: rank, eng: eng, speed: speed, cmds: make(chan func(), 1024), quit: make(chan struct{}),
		exited: make(chan struct{}), pend: map[string]*pending{}, wall0: time.Now()}
	c.metrics.init(created)
	return c
}

func (c *core) stop() { c.stopOnce.Do(func() { close(c.quit) }) }

var errStopped = errors.New("engine stopped")

// do runs f on the loop goroutine and waits. It returns only once f has
// run or can no longer run: callers read what f wrote as soon as do
// returns, even with an error.
func (c *core) do(f func(*sim.Engine)) error {
	done := make(chan struct{})
	select {
	case c.cmds <- func() { f(c.eng); close(done) }:
	case <-c.quit:
		return errStopped
	}
	select {
	case <-done:
		return nil
	case <-c.quit:
		// Stopping: the loop may be running f right now, or pick it up
		// before it notices quit (select chooses at random). Once it has
		// exited, f has finished or never will.
		<-c.exited
		select {
		case <-done:
			return nil
		default:
			return errStopped
		}
	}
}

// now is the simulated clock.
func (c *core) now() float64 {
	if c.held {
		return c.heldVirt
	}
	if c.speed == 0 || c.paced {
		return c.virt
	}
	return time.Since(c.wall0).Seconds() * c.speed
}

// syncIdle lets a paced clock catch up with wall time while the engine has
// nothing to do (never while held: the clock is frozen).
func (c *core) syncIdle() {
	if c.paced && !c.held && !c.eng.HasWork() {
		c.virt = max(c.virt, time.Since(c.wall0).Seconds()*c.speed)
	}
}

// hold freezes the clock and stops stepping until release or the deadline.
// Loop goroutine only.
func (c *core) hold(until time.Time) {
	if c.held {
		return // the running hold keeps its deadline: a re-post cannot extend it
	}
	c.syncIdle()
	c.heldVirt, c.heldAt, c.held = c.now(), time.Now(), true
	c.holdUntil = until
}

// release resumes stepping; the held wall time is taken out of the clock
// (wall0 moves forward by it), so the clock resumes where it froze.
// Loop goroutine only. Returns how long the hold lasted.
func (c *core) release() time.Duration {
	if !c.held {
		return 0
	}
	d := time.Since(c.heldAt)
	c.held = false
	c.eng.SortWaiting(c.heldOrder)
	c.heldOrder = nil
	c.wall0 = c.wall0.Add(d)
	if c.speed == 0 || c.paced {
		c.virt = c.heldVirt
	}
	return d
}

// stepping reports whether the loop should run engine steps.
func (c *core) stepping() bool { return !c.held && c.eng.HasWork() }

func (c *core) loop() {
	defer close(c.exited)
	defer c.failAll(errStopped)
	for {
		if !c.stepping() {
			var expire <-chan time.Time
			var timer *time.Timer
			if c.held {
				timer = time.NewTimer(time.Until(c.holdUntil))
				expire = timer.C
			}
			select {
			case f := <-c.cmds:
				c.syncIdle()
				f()
			case <-expire:
				c.release()
			case <-c.quit:
				return
			}
			if timer != nil {
				timer.Stop()
			}
			continue
		}
		// Requests added since the last step join this one.
		for drained := false; !drained; {
			select {
			case f := <-c.cmds:
				f()
			case <-c.quit:
				return
			default:
				drained = true
			}
		}
		if !c.stepping() {
			continue
		}
		start := time.Now()
		now := c.now()
		res := c.eng.Step(now)
		if len(res.Events) > 0 && c.pub != nil {
			c.pub.Publish(newBatch(res.Events, c.rank))
		}
		if res.Scheduled == 0 {
			// Nothing schedulable (cannot happen for admitted requests);
			// wait for a command instead of spinning.
			select {
			case f := <-c.cmds:
				f()
			case <-c.quit:
				return
			}
			continue
		}
		// Copy what the handlers need before the next Step reuses it.
		toks := append([]sim.TokenOut(nil), res.Tokens...)
		fins := append([]sim.Completion(nil), res.Finished...)
		if c.speed == 0 || c.paced {
			c.virt += res.Duration
		}
		if c.speed > 0 && res.Duration > 0 {
			deadline := start.Add(time.Duration(res.Duration / c.speed * float64(time.Second)))
			if !c.sleepServing(deadline) {
				return
			}
		}
		c.deliver(toks, fins)
	}
}

// sleepServing waits until deadline while still running commands.
func (c *core) sleepServing(deadline time.Time) bool {
	d := time.Until(deadline)
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			return true
		case f := <-c.cmds:
			f()
		case <-c.quit:
			return false
		}
	}
}

func (c *core) deliver(toks []sim.TokenOut, fins []sim.Completion) {
	var finByID map[string]*sim.Completion
	if len(fins) > 0 {
		finByID = make(map[string]*sim.Completion, len(fins))
		for i := range fins {
			finByID[fins[i].ID] = &fins[i]
		}
	}
	for _, t := range toks {
		p := c.pend[t.ID]
		if p == nil {
			continue
		}
		// The last token and the completion become visible together.
		p.mu.Lock()
		p.tokens = append(p.tokens, t.Token)
		p.cached = t.CachedTokens
		if f := finByID[t.ID]; t.Finished && f != nil {
			p.done, p.comp = true, *f
		}
		p.mu.Unlock()
		p.signal()
	}
	for _, f := range fins {
		c.metrics.observe(f)
		c.recordTiming(f)
		if _, ok := c.pend[f.ID]; ok {
			delete(c.pend, f.ID)
			c.inflight.Add(-1)
		}
	}
}

func (c *core) failAll(err error) {
	for id, p := range c.pend {
		p.mu.Lock()
		p.done, p.err = true, err
		p.mu.Unlock()
		p.signal()
		delete(c.pend, id)
	}
}

// noOrder is submit's order key for a request that has none.
const noOrder = math.MinInt64

// submit queues a request on the engine. A request with an order key (not
// noOrder) that arrives while the engine is held takes its place in the
// queue by that key when the hold ends.
func (c *core) submit(req sim.Request, order int64) (*pending, error) {
	p := &pending{notify: make(chan struct{}, 1), enqueued: time.Now()}
	errc := make(chan error, 1)
	f := func() {
		req.Arrival = c.now()
		if err := c.eng.Submit(req); err != nil {
			errc <- err
			return
		}
		if c.held && order != noOrder {
			if c.heldOrder == nil {
				c.heldOrder = map[string]int64{}
			}
			c.heldOrder[req.ID] = order
		}
		c.pend[req.ID] = p
		c.inflight.Add(1)
		errc <- nil
	}
	select {
	case c.cmds <- f:
	case <-c.quit:
		return nil, errStopped
	}
	select {
	case err := <-errc:
		if err != nil {
			return nil, err
		}
		return p, nil
	case <-c.quit:
		return nil, errStopped
	}
}

// abort drops a request whose client went away (fire and forget).
func (c *core) abort(id string) {
	f := func() {
		if _, ok := c.pend[id]; !ok {
			return
		}
		delete(c.pend, id)
		c.inflight.Add(-1)
		if c.eng.Abort(id) {
			c.metrics.aborted++
		}
	}
	select {
	case c.cmds <- f:
	case <-c.quit:
	}
}

func newBatch(evs []kvcrouter.Event, rank int) *kvcrouter.EventBatch {
	return &kvcrouter.EventBatch{TS: float64(time.Now().UnixNano()) / 1e9, Events: evs, DPRank: rank}
}

// pickCore chooses the least-loaded engine (vLLM's DP balancing in spirit).
func (s *Server) pickCore() *core {
	best := s.cores[0]
	for _, c := range s.cores[1:] {
		if c.inflight.Load() < best.inflight.Load() {
			best = c
		}
	}
	return best
}

func (s *Server) newRequestID() string {
	return fmt.Sprintf("cmpl-%s-%d", s.idBase, s.reqSeq.Add(1))
}
