package collector

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvc-router/kvc-router/core/internal/collector/internal/scrape"
	"github.com/kvc-router/kvc-router/core/internal/load"
	"github.com/kvc-router/kvc-router/core/internal/metrics"
	"github.com/kvc-router/kvc-router/core/internal/sink"
)

// PollerConfig tunes a metrics poller.
type PollerConfig struct {
	Flavor metrics.Flavor
	// Interval between scrapes of one server (default 100 ms).
	Interval time.Duration
	// Timeout bounds one scrape (default 1 s).
	Timeout time.Duration
	// MaxBytes bounds one response body (default 8 MiB).
	MaxBytes int64
	// BackoffMax caps the retry delay of a failing server (default 5 s).
	BackoffMax time.Duration
	// URLs overrides the metrics URL per server; otherwise
	// http://<server id>/metrics (or <server id>/metrics when the id
	// already carries a scheme).
	URLs map[string]string
	// Client, when set, fetches every URL through net/http. Left nil,
	// plain http:// URLs use the poller's own HTTP/1.1 client
	// (internal/scrape) and the rest (https, credentials in the URL) a
	// default net/http client.
	Client *http.Client
	// Logger receives health changes and scrape failures; nil means
	// slog.Default().
	Logger *slog.Logger
	// LogEvery rate-limits the failure log of one server: its first failed
	// scrape is logged (URL and reason), then at most one line per LogEvery
	// while it keeps failing, carrying the count of failures in between
	// (default 1 min). A server failing every scrape at the default
	// interval would otherwise write ten lines a second.
	LogEvery time.Duration
}

func (c PollerConfig) withDefaults() PollerConfig {
	if c.Interval <= 0 {
		c.Interval = 100 * time.Millisecond
	}
	if c.Timeout <= 0 {
		c.Timeout = time.Second
	}
	if c.MaxBytes <= 0 {
		c.MaxBytes = metrics.DefaultLimit
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = 5 * time.Second
	}
	if c.Client == nil {
		// No Client.Timeout: fetch bounds each scrape (body included) by
		// its context already, and a second deadline costs a timer and a
		// request clone per scrape.
		c.Client = &http.Client{
			Transport: &http.Transport{
				// One kept-alive connection per server (the key is the
				// host), so every scrape after the first reuses it.
				MaxIdleConnsPerHost: 2,
				ReadBufferSize:      64 << 10,
				IdleConnTimeout:     30 * time.Second,
				// No gzip: prometheus_client compresses /metrics when
				// asked, and inflating ~45 KB per scrape costs more CPU
				// than the loopback bytes it saves.
				DisableCompression: true,
			},
			// Collectors only talk to configured endpoints: no redirects.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.LogEvery <= 0 {
		c.LogEvery = time.Minute
	}
	return c
}

// MetricsURL is the URL scraped for a server id.
func MetricsURL(server string) string {
	if strings.Contains(server, "://") {
		return strings.TrimRight(server, "/") + "/metrics"
	}
	return "http://" + server + "/metrics"
}

type target struct {
	// url is resolved once; kick wakes the target's worker for one scrape
	// (buffered 1, sent only when not running), closed when the target
	// leaves the pool. sc, used only by the worker, is the target's own
	// client; nil means net/http.
	url       string
	sc        *scrape.Conn
	kick      chan struct{}
	failures  int
	nextAt    time.Time
	running   bool
	unhealthy bool
	scrapes   uint64
	errors    uint64
	malformed uint64
	lastErr   string
	panics    uint64
	streak    int  // consecutive panics
	failed    bool // a scrape panicked; cleared by the next good scrape
	// The failure log: when it last wrote a line for this target (zero:
	// not since the last good scrape) and the failures not logged since.
	loggedAt time.Time
	unlogged int
}

// TargetStatus reports one server's scrape state.
type TargetStatus struct {
	Server    string `json:"server"`
	URL       string `json:"url"`
	Scrapes   uint64 `json:"scrapes"`
	Errors    uint64 `json:"errors"`
	Malformed uint64 `json:"malformed"`
	Failures  int    `json:"consecutive_failures"`
	Unhealthy bool   `json:"unhealthy"`
	LastError string `json:"last_error,omitempty"`
	// Panics counts scrapes of this target that panicked (recovered);
	// Failed is set by one and cleared by the next good scrape.
	Panics uint64 `json:"panics"`
	Failed bool   `json:"failed"`
}

// Poller scrapes every pool member's /metrics on an interval. It follows the
// router's pool as servers come and go.
type Poller struct {
	r   sink.Load
	cfg PollerConfig
	// ownClient: no Client was configured, so plain http URLs use
	// scrape.Conn.
	ownClient bool
	mu        sync.Mutex
	tgts      map[string]*target
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	// now is the clock of scrape scheduling (backoff) and of the failure
	// log's rate limit (tests replace it).
	now func() time.Time
}

// NewPoller prepares a poller; Start begins it.
func NewPoller(r sink.Load, cfg PollerConfig) *Poller {
	return &Poller{r: r, cfg: cfg.withDefaults(), ownClient: cfg.Client == nil, tgts: make(map[string]*target),
		now: time.Now}
}

// Start runs the poller until Close.
func (p *Poller) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	p.wg.Add(1)
	go p.loop(ctx)
}

// Close stops the poller and waits for in-flight scrapes.
func (p *Poller) Close() error {
	if p.cancel != nil {
		p.cancel()
	}
	p.wg.Wait()
	return nil
}

func (p *Poller) url(server string) string {
	if u, ok := p.cfg.URLs[server]; ok {
		return u
	}
	return MetricsURL(server)
}

func (p *Poller) loop(ctx context.Context) {
	defer p.wg.Done()
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	for {
		if perr := guard(func() { p.tick(ctx, p.now()) }); perr != nil {
			p.cfg.Logger.Error("metrics: poller tick panicked; continuing", "panic", perr.Value, "stack", perr.Stack)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// tick starts a scrape for every pool member that is due and not already
// being scraped; a slow server never delays the others. Each target has a
// long-lived worker goroutine rather than one goroutine per scrape: a
// fresh goroutine regrows its stack through the HTTP client and parser on
// every scrape, which showed in the polling profile.
func (p *Poller) tick(ctx context.Context, now time.Time) {
	servers := p.r.Servers()
	p.mu.Lock()
	defer p.mu.Unlock()
	seen := make(map[string]bool, len(servers))
	for _, s := range servers {
		seen[s] = true
		tg, ok := p.tgts[s]
		if !ok {
			tg = &target{url: p.url(s), kick: make(chan struct{}, 1)}
			if p.ownClient {
				tg.sc, _ = scrape.New(tg.url, p.cfg.Timeout, p.cfg.MaxBytes)
			}
			p.tgts[s] = tg
			p.wg.Add(1)
			go p.worker(ctx, s, tg)
		}
		if tg.running || now.Before(tg.nextAt) {
			continue
		}
		tg.running = true
		tg.kick <- struct{}{} // never blocks: the worker drained it before running went false
	}
	for s, tg := range p.tgts {
		if !seen[s] && !tg.running {
			close(tg.kick)
			delete(p.tgts, s)
		}
	}
}

// worker scrapes its target once per kick until the target leaves the pool
// or the poller closes.
func (p *Poller) worker(ctx context.Context, server string, tg *target) {
	defer p.wg.Done()
	if tg.sc != nil {
		defer tg.sc.Close()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-tg.kick:
			if !ok {
				return
			}
			if perr := guard(func() { p.scrape(ctx, server, tg) }); perr != nil {
				p.recovered(server, tg, perr)
			}
		}
	}
}

// recovered handles a scrape that panicked: a failed scrape (the target is
// scheduled again after a backoff that grows with consecutive panics),
// counted and marked failed in status, logged with its stack.
func (p *Poller) recovered(server string, tg *target, perr *PanicError) {
	p.mu.Lock()
	tg.running = false
	tg.scrapes++
	tg.errors++
	tg.failures++
	tg.panics++
	tg.streak++
	tg.failed, tg.lastErr = true, perr.Error()
	wait := max(panicBackoff(p.cfg.Interval, tg.streak), min(p.cfg.Interval<<min(tg.failures, 16), p.cfg.BackoffMax))
	tg.nextAt = p.now().Add(wait)
	p.mu.Unlock()
	p.cfg.Logger.Error("metrics: scrape panicked; restarting", "server", server, "panic", perr.Value,
		"restart_in", wait, "stack", perr.Stack)
	if p2 := guard(func() { p.r.MetricsFailed(server, perr, false) }); p2 != nil {
		p.cfg.Logger.Error("metrics: recording a panicked scrape panicked", "server", server, "panic", p2.Value)
	}
}

func (p *Poller) scrape(ctx context.Context, server string, tg *target) {
	debugPanic(PanicScrape)
	m, err := p.fetch(ctx, tg)
	if ctx.Err() != nil {
		p.mu.Lock()
		tg.running = false
		p.mu.Unlock()
		return
	}
	now := p.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	tg.running = false
	tg.scrapes++
	if err != nil {
		tg.errors++
		if errors.Is(err, metrics.ErrMalformed) || errors.Is(err, metrics.ErrNoMetrics) || errors.Is(err, metrics.ErrTooLarge) ||
			errors.Is(err, scrape.ErrBadResponse) {
			tg.malformed++
		}
		tg.failures++
		tg.lastErr = err.Error()
		backoff := p.cfg.Interval << min(tg.failures, 16)
		tg.nextAt = now.Add(min(backoff, p.cfg.BackoffMax))
		// A refused connection means nothing listens there any more (a
		// killed engine): avoid it now, not after UnhealthyAfter scrapes
		// spaced by the backoff (7 intervals with the defaults).
		if p.r.MetricsFailed(server, err, errors.Is(err, syscall.ECONNREFUSED)) && !tg.unhealthy {
			tg.unhealthy = true
		}
		p.logFailure(server, tg, err)
		return
	}
	if tg.unhealthy || !tg.loggedAt.IsZero() {
		p.cfg.Logger.Warn("metrics: server answers again", "server", server, "url", tg.url,
			"failures", tg.failures)
	}
	tg.loggedAt, tg.unlogged = time.Time{}, 0
	tg.failures, tg.unhealthy, tg.lastErr = 0, false, ""
	tg.failed, tg.streak = false, 0
	tg.nextAt = time.Time{} // due again at the next tick
	p.r.UpdateMetrics(server, m)
}

// logFailure writes a failed scrape to the log, rate-limited per target:
// the first failure after a good scrape (or at start), then at most one line
// per LogEvery, each with the URL, the reason and the failures skipped
// since the previous line. Turning unhealthy does not bypass the limit: the
// line already said the server cannot be scraped. Called with p.mu held.
func (p *Poller) logFailure(server string, tg *target, err error) {
	now := p.now()
	if !tg.loggedAt.IsZero() && now.Sub(tg.loggedAt) < p.cfg.LogEvery {
		tg.unlogged++
		return
	}
	attrs := []any{"server", server, "url", tg.url, "err", err, "consecutive_failures", tg.failures,
		"unhealthy", tg.unhealthy}
	if tg.unlogged > 0 {
		attrs = append(attrs, "failures_not_logged", tg.unlogged)
	}
	attrs = append(attrs, "next_line_after", p.cfg.LogEvery.String())
	p.cfg.Logger.Warn("metrics: cannot scrape server", attrs...)
	tg.loggedAt, tg.unlogged = now, 0
}

func (p *Poller) fetch(ctx context.Context, tg *target) (load.Metrics, error) {
	if tg.sc != nil {
		body, err := tg.sc.Get(ctx)
		if err != nil {
			return load.Metrics{}, err
		}
		return metrics.ParseBytes(body, p.cfg.Flavor, p.cfg.MaxBytes)
	}
	url := tg.url
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return load.Metrics{}, err
	}
	// No OpenMetrics Accept header: vLLM then serves the classic text format.
	resp, err := p.cfg.Client.Do(req)
	if err != nil {
		return load.Metrics{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return load.Metrics{}, fmt.Errorf("metrics: %s answered %s", url, resp.Status)
	}
	return metrics.Parse(resp.Body, p.cfg.Flavor, p.cfg.MaxBytes)
}

// Status reports every target.
func (p *Poller) Status() []TargetStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]TargetStatus, 0, len(p.tgts))
	for _, s := range p.r.Servers() {
		tg, ok := p.tgts[s]
		if !ok {
			continue
		}
		out = append(out, TargetStatus{
			Server: s, URL: p.url(s), Scrapes: tg.scrapes, Errors: tg.errors, Malformed: tg.malformed,
			Failures: tg.failures, Unhealthy: tg.unhealthy, LastError: tg.lastErr,
			Panics: tg.panics, Failed: tg.failed,
		})
	}
	return out
}

// PushMetrics parses Prometheus text for a server and stores it: the push
// path for callers without HTTP access. Malformed text is an error and the
// previous snapshot is kept. The text is already in memory: bounding its
// size is the caller's (the C ABI's push.max_metrics_bytes), so a limit
// configured above metrics.DefaultLimit is honoured.
func PushMetrics(r sink.Load, server string, text []byte, flavor metrics.Flavor) error {
	m, err := metrics.ParseBytes(text, flavor, int64(len(text)))
	if errors.Is(err, metrics.ErrImpossible) {
		// As for a scrape: the reason shows in the server's status and its
		// last good metrics age out (the caller gets the error too).
		r.MetricsFailed(server, err, false)
	}
	if err != nil {
		return err
	}
	if !r.UpdateMetrics(server, m) {
		return fmt.Errorf("%w: %q", ErrUnknownServer, server)
	}
	return nil
}
