// Package load keeps what the router knows about each server's busyness:
// the engine's own metrics (scraped or pushed) and the router's local
// in-flight counts, and turns them into one load figure per server.
//
// # Load formula
//
// C is the server's running-set capacity (max_num_seqs: from its metrics when
// reported, else Config.MaxNumSeqs). With fresh metrics (younger than
// Config.StaleAfter):
//
//	queue = max(running + waiting, inflight)
//	over  = max(waiting, queue - C)
//	load  = 0.4 * kv_usage + 0.3 * min(1, queue / C) + 0.3 * min(1, over / C)
//
// Using max with the local in-flight count matters because a GRPO burst sends
// hundreds of requests between two scrapes: the router's own count is the
// only up-to-date signal. Without fresh metrics (never scraped, scrape failed,
// or older than StaleAfter) the router fails open on its own counts:
//
//	load = 0.7 * min(1, inflight / C) + 0.3 * min(1, max(0, inflight - C) / C)
//
// Either way load lies in [0, 1]; 1 means saturated with a full queue.
package load

import (
	"fmt"
	"sync"
	"time"
)

// Config tunes the store.
type Config struct {
	// StaleAfter is how old metrics may be and still be trusted.
	StaleAfter time.Duration
	// MaxNumSeqs is the capacity assumed when a server reports none
	// (vLLM's default max_num_seqs, as verl configures it, is 256).
	MaxNumSeqs int
	// UnhealthyAfter is how many consecutive failures mark a server
	// unhealthy.
	UnhealthyAfter int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Defaults for Config fields left zero.
const (
	DefaultStaleAfter     = 2 * time.Second
	DefaultMaxNumSeqs     = 256
	DefaultUnhealthyAfter = 3
)

// Store is safe for concurrent use.
type Store struct {
	mu      sync.Mutex
	cfg     Config
	servers map[string]*entry
}

type entry struct {
	m          Metrics
	has        bool
	failures   int
	unhealthy  bool
	lastError  string
	inflight   int
	inflightTk int64
	acquired   uint64
	released   uint64
	// acquired and released at the last Update: what the router sent and
	// saw finish since that scrape.
	acqAtScrape, relAtScrape uint64
	scrapes                  uint64
	errors                   uint64
}

// WithDefaults fills the fields left zero with their defaults.
func (cfg Config) WithDefaults() Config {
	if cfg.StaleAfter <= 0 {
		cfg.StaleAfter = DefaultStaleAfter
	}
	if cfg.MaxNumSeqs <= 0 {
		cfg.MaxNumSeqs = DefaultMaxNumSeqs
	}
	if cfg.UnhealthyAfter <= 0 {
		cfg.UnhealthyAfter = DefaultUnhealthyAfter
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return cfg
}

// New returns an empty store.
func New(cfg Config) *Store {
	return &Store{cfg: cfg.WithDefaults(), servers: make(map[string]*entry)}
}

// Add registers a server with zero in-flight requests. Re-adding resets the
// in-flight count to zero (verl's add_servers semantics) but keeps metrics.
func (s *Store) Add(server string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.servers[server]; ok {
		e.inflight, e.inflightTk = 0, 0
		return
	}
	s.servers[server] = &entry{}
}

// Remove forgets a server.
func (s *Store) Remove(server string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.servers, server)
}

// Acquire counts one request of promptTokens tokens sent to server.
func (s *Store) Acquire(server string, promptTokens int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.servers[server]; ok {
		e.inflight++
		e.inflightTk += int64(promptTokens)
		e.acquired++
	}
}

// Release counts one request finished on server. Unknown servers and zero
// counts are ignored (verl's release_server semantics). Release carries no
// request identity, so in-flight tokens drop by the mean per request.
func (s *Store) Release(server string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.servers[server]
	if !ok || e.inflight == 0 {
		return false
	}
	e.inflightTk -= e.inflightTk / int64(e.inflight)
	e.inflight--
	if e.inflight == 0 {
		e.inflightTk = 0
	}
	e.released++
	return true
}

// Inflight returns the local in-flight count (0 for unknown servers).
func (s *Store) Inflight(server string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.servers[server]; ok {
		return e.inflight
	}
	return 0
}

// Update records a successful scrape or push, and marks the server healthy.
// Metrics that fail Check are not stored: they count as a failed scrape
// (the previous metrics age out as usual) and their reason becomes the
// server's last error. It returns false for an unknown server.
func (s *Store) Update(server string, m Metrics) bool {
	if err := m.Check(); err != nil {
		s.fail(server, fmt.Errorf("impossible metrics: %w", err), s.cfg.UnhealthyAfter)
		_, ok := s.Get(server)
		return ok
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.servers[server]
	if !ok {
		return false
	}
	if m.At.IsZero() {
		m.At = s.cfg.Now()
	}
	e.m, e.has = m, true
	e.acqAtScrape, e.relAtScrape = e.acquired, e.released
	e.failures, e.unhealthy = 0, false
	e.scrapes++
	return true
}

// Fail records a failed scrape. It returns true when this failure turned
// the server unhealthy (after UnhealthyAfter consecutive failures).
func (s *Store) Fail(server string, err error) bool {
	return s.fail(server, err, s.cfg.UnhealthyAfter)
}

// Down records a failed scrape that shows the server is not serving at all
// (its port refuses connections, as after a crash): the server turns
// unhealthy at once rather than after UnhealthyAfter failures. It returns
// true when this call turned it unhealthy.
func (s *Store) Down(server string, err error) bool {
	return s.fail(server, err, 1)
}

func (s *Store) fail(server string, err error, threshold int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.servers[server]
	if !ok {
		return false
	}
	e.failures++
	e.errors++
	if err != nil {
		e.lastError = err.Error()
	}
	if !e.unhealthy && e.failures >= threshold {
		e.unhealthy = true
		return true
	}
	return false
}

// Snapshot is a point-in-time view of one server.
type Snapshot struct {
	Inflight       int     `json:"inflight"`
	InflightTokens int64   `json:"inflight_tokens"`
	Load           float64 `json:"load"`
	Fresh          bool    `json:"fresh"`
	Healthy        bool    `json:"healthy"`
	Capacity       int     `json:"capacity"`
	// Metrics is the last scrape; zero when none.
	Metrics   Metrics `json:"-"`
	HasMetric bool    `json:"has_metrics"`
	AgeMS     int64   `json:"metrics_age_ms"`
	Failures  int     `json:"consecutive_failures"`
	Errors    uint64  `json:"errors"`
	Scrapes   uint64  `json:"scrapes"`
	LastError string  `json:"last_error,omitempty"`
	// SentSince and FinishedSince count the requests the router sent to
	// the server, and saw finish there, since its last scrape (all of them
	// before the first).
	SentSince     int `json:"-"`
	FinishedSince int `json:"-"`
}

// Get returns a server's snapshot, computing its load at the current time.
func (s *Store) Get(server string) (Snapshot, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.servers[server]
	if !ok {
		return Snapshot{}, false
	}
	var sn Snapshot
	s.snapshot(&sn, e, s.cfg.Now())
	return sn, true
}

// GetMany fills out[i] for servers[i] under one lock; unknown servers get a
// zero snapshot with Healthy false.
func (s *Store) GetMany(servers []string, out []Snapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	for i, name := range servers {
		if e, ok := s.servers[name]; ok {
			s.snapshot(&out[i], e, now)
		} else {
			out[i] = Snapshot{}
		}
	}
}

// snapshot fills *sn in place: GetMany writes 64 of these per routing
// decision, and building each on the stack then copying it cost as much
// again.
func (s *Store) snapshot(sn *Snapshot, e *entry, now time.Time) {
	*sn = Snapshot{
		Inflight: e.inflight, InflightTokens: e.inflightTk, Healthy: !e.unhealthy,
		Metrics: e.m, HasMetric: e.has, Failures: e.failures, Errors: e.errors,
		Scrapes: e.scrapes, LastError: e.lastError,
		SentSince: int(e.acquired - e.acqAtScrape), FinishedSince: int(e.released - e.relAtScrape),
	}
	c := s.cfg.MaxNumSeqs
	if e.has && e.m.MaxNumSeqs > 0 {
		c = e.m.MaxNumSeqs
	}
	sn.Capacity = c
	if e.has {
		sn.AgeMS = now.Sub(e.m.At).Milliseconds()
		sn.Fresh = now.Sub(e.m.At) <= s.cfg.StaleAfter
	}
	sn.Load = compute(&e.m, sn.Fresh, e.inflight, c)
}

// Compute applies the package's load formula (see the package comment).
func Compute(m Metrics, fresh bool, inflight, capacity int) float64 {
	return compute(&m, fresh, inflight, capacity)
}

// compute is Compute without copying the metrics (a snapshot computes
// one per server per routing decision).
func compute(m *Metrics, fresh bool, inflight, capacity int) float64 {
	if capacity <= 0 {
		capacity = DefaultMaxNumSeqs
	}
	c := float64(capacity)
	in := float64(inflight)
	// The min and max builtins follow math.Min and math.Max exactly (NaN,
	// signed zeros) but compile inline; the math functions were a third
	// of the router's per-server load snapshot.
	if !fresh {
		return 0.7*min(1, in/c) + 0.3*min(1, max(0, in-c)/c)
	}
	// Update refuses metrics that fail Check; the clamps keep a Metrics
	// built by hand (Compute) from turning NaN or negative into a load.
	running, waiting := nonNeg(m.Running), nonNeg(m.Waiting)
	queue := max(running+waiting, in)
	over := max(waiting, queue-c)
	kv := 0.0
	if m.HasKVUsage {
		kv = min(1, nonNeg(m.KVUsage))
	}
	return 0.4*kv + 0.3*min(1, queue/c) + 0.3*min(1, max(0, over)/c)
}

// nonNeg is v, or 0 for a negative v or NaN.
func nonNeg(v float64) float64 {
	if v >= 0 {
		return v
	}
	return 0
}
