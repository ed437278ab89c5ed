package collector

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvc-router/kvc-router/core/internal/collector/internal/zmtp"
	"github.com/kvc-router/kvc-router/core/internal/kvevents"
	"github.com/kvc-router/kvc-router/core/internal/memtrim"
	"github.com/kvc-router/kvc-router/core/internal/sink"
)

// maxRetainedBatch bounds the decode buffers a subscriber keeps between
// batches (a typical batch needs a few KiB).
const maxRetainedBatch = 1 << 20

// endSeq marks the end of a replay (-1 as a signed 8-byte big-endian value).
const endSeq = ^uint64(0)

// Endpoint is one KV-event publisher of a server (one per data-parallel rank).
type Endpoint struct {
	// Endpoint is the PUB address to dial, e.g. tcp://10.0.0.7:5557.
	Endpoint string `json:"endpoint"`
	// Replay is the ROUTER replay address; empty disables replay.
	Replay string `json:"replay,omitempty"`
	// Topic filters by byte prefix; empty receives every topic.
	Topic string `json:"topic,omitempty"`
}

// SubscriberConfig tunes a vllm_zmq subscriber.
type SubscriberConfig struct {
	// ReplayTimeout bounds one replay exchange.
	ReplayTimeout time.Duration
	// IdleRedial re-dials a publisher that has been silent this long:
	// go-zeromq does not reconnect by itself, and an engine restarted on
	// the same port is only seen through a new connection.
	IdleRedial time.Duration
	// RetryInterval is the wait between failed dials.
	RetryInterval time.Duration
	// DialTimeout bounds one dial.
	DialTimeout time.Duration
	// Limits bound payload decoding.
	Limits kvevents.Limits
	// Logger receives state changes; nil means slog.Default().
	Logger *slog.Logger
}

func (c SubscriberConfig) withDefaults() SubscriberConfig {
	if c.ReplayTimeout <= 0 {
		c.ReplayTimeout = 2 * time.Second
	}
	if c.IdleRedial <= 0 {
		c.IdleRedial = 3 * time.Second
	}
	if c.RetryInterval <= 0 {
		c.RetryInterval = 500 * time.Millisecond
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = time.Second
	}
	if c.Limits.MaxPayloadBytes <= 0 { // the other limits default in DecodeInto
		c.Limits.MaxPayloadBytes = kvevents.DefaultLimits.MaxPayloadBytes
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// PublisherStatus describes one subscription.
type PublisherStatus struct {
	Server    string `json:"server"`
	Endpoint  string `json:"endpoint"`
	Replay    string `json:"replay,omitempty"`
	Connected bool   `json:"connected"`
	// LastSeq is the last batch's sequence number, meaningful when
	// SeqSeen (sequence numbers are unsigned 64-bit, as vLLM sends them).
	LastSeq      uint64 `json:"last_seq"`
	SeqSeen      bool   `json:"seq_seen"`
	Gaps         uint64 `json:"gaps"`
	Replays      uint64 `json:"replays"`
	ReplayFailed uint64 `json:"replay_failures"`
	Restarts     uint64 `json:"restarts"`
	Dials        uint64 `json:"dials"`
	BadFrames    uint64 `json:"bad_frames"`
	// StartupUnreplayed counts batches of the publisher's current run,
	// before the first one applied, that were never applied: published
	// before the subscription took effect (ZMQ's slow joiner) with no
	// replay endpoint, or already evicted from the replay buffer. Nonzero
	// means the index may lack blocks the engine holds.
	StartupUnreplayed uint64 `json:"startup_unreplayed"`
	// Duplicates counts live batches skipped because a replay in the same
	// connection had already applied them.
	Duplicates uint64 `json:"duplicates"`
	// Panics counts panics this subscription recovered from; Failed is
	// set by one and cleared by the next batch applied after the restart.
	Panics uint64 `json:"panics"`
	// ReplayPanics counts panics in the replay reader (also in Panics).
	ReplayPanics uint64 `json:"replay_panics"`
	// OversizedFrames counts connections dropped because a frame or
	// message exceeded max_payload_bytes plus framing (checked before the
	// frame is allocated); ProtocolErrors those dropped for any other
	// ZMTP violation.
	OversizedFrames uint64 `json:"oversized_frames"`
	ProtocolErrors  uint64 `json:"protocol_errors"`
	// ReplaySkipped counts replays not attempted because the endpoint
	// failed recently (ReplayBreakerOpen while that lasts).
	ReplaySkipped     uint64      `json:"replay_skipped"`
	ReplayBreakerOpen bool        `json:"replay_breaker_open"`
	Failed            bool        `json:"failed"`
	LastPanic         string      `json:"last_panic,omitempty"`
	LastEventUnix     float64     `json:"last_event_unix"`
	EventsPerSec      float64     `json:"events_per_sec"`
	Events            EventCounts `json:"events"`
}

// Subscriber follows one publisher: SUB socket, sequence tracking, replay
// on gaps, index clearing on engine restart, re-dial on silence.
type Subscriber struct {
	r      sink.Events
	server string
	ep     Endpoint
	cfg    SubscriberConfig
	stats  EventStats
	// now is the replay breaker's clock (tests replace it before Start).
	now func() time.Time

	mu          sync.Mutex
	connected   bool
	lastSeq     uint64
	seqSeen     bool // false before the first message (and after resetSeq)
	lastHash    uint64
	lastEvent   time.Time
	rateEvents  uint64
	rateStart   time.Time
	rate        float64
	gaps        uint64
	replays     uint64
	replayFails uint64
	restarts    uint64
	dials       uint64
	badFrames   uint64
	unreplayed  uint64
	duplicates  uint64
	panics      uint64
	panicStreak int // consecutive panics without a batch applied between
	// oversized and protocolErrs count connections (live or replay)
	// dropped for a frame over the limits or a protocol violation.
	oversized    uint64
	protocolErrs uint64
	// The replay breaker (replayRange).
	replayFailStreak int
	replayOpenUntil  time.Time
	replaySkipped    uint64
	replayPanics     uint64
	// sessionMsgs counts messages the current session read (run goroutine
	// only): a session that read one resets the reconnect backoff.
	sessionMsgs int
	failed      bool
	lastPanic   string

	// replayed maps seq -> payload hash for batches this connection
	// applied through an open-ended replay (at connect, or a probe) that
	// live messages may still deliver: the SUB socket queues them while
	// the replay runs. Only the run goroutine touches it.
	replayed    map[uint64]uint64
	replayedMax uint64

	cancel context.CancelFunc
	done   chan struct{}
	batch  kvevents.Batch
}

// NewSubscriber prepares a subscription; Start begins it.
func NewSubscriber(r sink.Events, server string, ep Endpoint, cfg SubscriberConfig) *Subscriber {
	return &Subscriber{r: r, server: server, ep: ep, cfg: cfg.withDefaults(), now: time.Now}
}

// Start runs the subscription until Close.
func (s *Subscriber) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.done = make(chan struct{})
	go s.run(ctx)
}

// Close stops the subscription and waits for it.
func (s *Subscriber) Close() error {
	if s.cancel != nil {
		s.cancel()
		<-s.done
	}
	return nil
}

// Status reports the subscription's counters.
func (s *Subscriber) Status() PublisherStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := PublisherStatus{
		Server: s.server, Endpoint: s.ep.Endpoint, Replay: s.ep.Replay, Connected: s.connected,
		LastSeq: s.lastSeq, SeqSeen: s.seqSeen, Gaps: s.gaps, Replays: s.replays, ReplayFailed: s.replayFails,
		Restarts: s.restarts, Dials: s.dials, BadFrames: s.badFrames, EventsPerSec: s.rate,
		StartupUnreplayed: s.unreplayed, Duplicates: s.duplicates,
		Panics: s.panics, Failed: s.failed, LastPanic: s.lastPanic, ReplayPanics: s.replayPanics,
		OversizedFrames: s.oversized, ProtocolErrors: s.protocolErrs, ReplaySkipped: s.replaySkipped,
		ReplayBreakerOpen: s.now().Before(s.replayOpenUntil),
		Events:            s.stats.Snapshot(),
	}
	if !s.lastEvent.IsZero() {
		st.LastEventUnix = float64(s.lastEvent.UnixNano()) / 1e9
	}
	return st
}

func (s *Subscriber) setConnected(on bool) {
	s.mu.Lock()
	changed := s.connected != on
	s.connected = on
	s.mu.Unlock()
	if changed {
		s.cfg.Logger.Info("kv events subscription", "server", s.server, "endpoint", s.ep.Endpoint, "connected", on)
	}
}

func (s *Subscriber) run(ctx context.Context) {
	defer close(s.done)
	defer s.setConnected(false)
	fails := 0
	for ctx.Err() == nil {
		var err error
		s.sessionMsgs = 0
		if perr := guard(func() { err = s.session(ctx) }); perr != nil {
			err = perr
		}
		var perr *PanicError
		if errors.As(err, &perr) {
			sleepCtx(ctx, s.recovered(perr))
			continue
		}
		if err != nil && ctx.Err() == nil {
			s.cfg.Logger.Debug("kv events session ended", "server", s.server, "err", err)
			// Back off from a peer that keeps failing (refused, hostile):
			// RetryInterval doubling up to 8x, reset by a session that
			// received a message or ended idle. The wait ends with ctx.
			if s.sessionMsgs > 0 || errors.Is(err, errIdle) {
				fails = 0
			} else {
				fails++
			}
			sleepCtx(ctx, s.cfg.RetryInterval<<min(max(fails-1, 0), 3))
		}
	}
}

// errIdle ends a session whose publisher went silent (not a failure).
var errIdle = errors.New("idle")

// frameLimits are the wire limits of this subscription's connections:
// max_payload_bytes plus the framing of vLLM's messages (topic, seq).
func (s *Subscriber) frameLimits() zmtp.Limits {
	return zmtp.ForPayload(s.cfg.Limits.MaxPayloadBytes, maxTopicBytes)
}

// noteConnErr counts a connection dropped for a hostile or broken peer.
func (s *Subscriber) noteConnErr(err error) {
	tooLarge, proto := errors.Is(err, zmtp.ErrTooLarge), errors.Is(err, zmtp.ErrProtocol)
	if !tooLarge && !proto {
		return
	}
	s.mu.Lock()
	if tooLarge {
		s.oversized++
	} else {
		s.protocolErrs++
	}
	s.mu.Unlock()
	s.cfg.Logger.Warn("kv events: publisher connection dropped", "server", s.server, "endpoint", s.ep.Endpoint, "err", err)
}

// session holds one SUB connection until it goes idle, fails or ctx ends.
// Messages are read on this goroutine through the bounded ZMTP reader, one
// at a time: a subscription holds at most one message (bounded by
// max_payload_bytes plus framing) in memory. Cancelling ctx closes the
// connection under a blocked read.
func (s *Subscriber) session(ctx context.Context) error {
	s.mu.Lock()
	s.dials++
	s.mu.Unlock()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	conn, err := zmtp.Dial(sctx, s.ep.Endpoint, zmtp.Options{Type: zmtp.Sub, DialTimeout: s.cfg.DialTimeout, Limits: s.frameLimits()})
	if err != nil {
		s.setConnected(false)
		s.noteConnErr(err)
		return err
	}
	defer conn.Close()
	if err := conn.Subscribe(s.ep.Topic); err != nil {
		return err
	}
	s.setConnected(true)
	s.r.SetEventFeed(s.server, true)
	s.replayed, s.replayedMax = nil, 0
	// A new connection may be to a restarted publisher on the same port;
	// and a first connection recovers what the publisher buffered,
	// including what it sends before our subscription reaches it.
	s.probe(ctx)

	var frames [][]byte
	for {
		// The read deadline is the idle timer: it spans a whole message,
		// so a peer dribbling a frame byte by byte is idle too.
		_ = conn.SetReadDeadline(time.Now().Add(s.cfg.IdleRedial))
		frames, err = conn.ReadMsg(frames)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				// Silence. A lost final batch would go unnoticed until
				// the next event, so ask the replay buffer for anything
				// after the last seq (or for everything, when nothing
				// arrived yet: batches published while the subscription
				// propagated); then reconnect, so that a publisher
				// restarted on the same port is seen (its sequence
				// restarts at 0).
				s.probe(ctx)
				return errIdle
			}
			s.noteConnErr(err)
			return err
		}
		s.sessionMsgs++
		if len(frames) > 0 && !bytes.HasPrefix(frames[0], []byte(s.ep.Topic)) {
			continue // a publisher that ignores subscriptions
		}
		s.handle(ctx, frames)
	}
}

// handle processes one live message [topic, seq, payload].
func (s *Subscriber) handle(ctx context.Context, frames [][]byte) {
	if len(frames) != 3 || len(frames[1]) != 8 {
		s.mu.Lock()
		s.badFrames++
		s.mu.Unlock()
		return
	}
	seq := binary.BigEndian.Uint64(frames[1])
	if s.replayed != nil {
		if seq > s.replayedMax {
			s.replayed = nil // live has overtaken the replay
		} else if h, ok := s.replayed[seq]; ok && h == xxhash.Sum64(frames[2]) {
			// Already applied from the replay buffer (byte-identical):
			// applying it again would double its blocks' copies, and its
			// lower seq would read as an engine restart.
			delete(s.replayed, seq)
			s.mu.Lock()
			s.duplicates++
			s.mu.Unlock()
			return
		}
	}
	s.mu.Lock()
	last, seen := s.lastSeq, s.seqSeen
	s.mu.Unlock()
	// Unsigned throughout: a seq >= 2^63 is just a later batch. After
	// 2^64-1 every seq is <= last, so a wrap to 0 reads as a restart (and
	// last+1 below cannot overflow: seq > last implies last < 2^64-1).
	switch {
	case !seen:
		// First message of this subscriber: recover the publisher's
		// buffered history before it, when replay is available.
		if seq > 0 {
			s.replay(ctx, 0, seq)
		}
	case seq <= last:
		if seq == last {
			return // duplicate
		}
		// The sequence went backwards: a new publisher process.
		s.mu.Lock()
		s.restarts++
		s.mu.Unlock()
		s.cfg.Logger.Warn("kv events: engine restart detected, clearing its index", "server", s.server, "last_seq", last, "seq", seq)
		s.clear()
		s.resetSeq() // the new run's batches before seq count as unreplayed if lost
		if seq > 0 {
			s.replay(ctx, 0, seq)
		}
	case seq > last+1:
		s.mu.Lock()
		s.gaps++
		s.mu.Unlock()
		if !s.replay(ctx, last+1, seq) {
			s.cfg.Logger.Warn("kv events: gap not recoverable, clearing index", "server", s.server, "from", last+1, "to", seq)
			s.clear()
		}
	}
	s.apply(seq, frames[2])
}

// probe asks the replay endpoint for every buffered batch from the last one
// seen. The publisher that sent that batch still buffers it, byte for byte;
// anything else means the engine restarted (clear, then take the new
// publisher's whole buffer) or batches were lost beyond the buffer (clear).
// Batches after the last one seen are applied: a lost final batch is
// recovered without waiting for the next event.
func (s *Subscriber) probe(ctx context.Context) {
	s.mu.Lock()
	last, lastHash, seen := s.lastSeq, s.lastHash, s.seqSeen
	s.mu.Unlock()
	if s.ep.Replay == "" {
		return
	}
	if !seen {
		s.recoverStart(ctx)
		return
	}
	var (
		verdict = "" // "same", "restart" or "lost"
		missed  int
	)
	_, err := s.replayRange(ctx, last, endSeq, true,
		func(seq uint64, payload []byte) {
			switch {
			case verdict == "" && seq == last && xxhash.Sum64(payload) == lastHash:
				verdict = "same"
			case verdict == "" && seq == last:
				verdict = "restart"
			case verdict == "":
				verdict = "lost"
			case verdict == "same":
				if missed++; missed == 1 {
					// Counted before the batch shows in the index (as in
					// recoverStart and the live gap path): whoever sees
					// the recovered blocks also sees the gap and replay.
					s.mu.Lock()
					s.gaps++
					s.replays++
					s.mu.Unlock()
				}
				s.applyReplayed(seq, payload)
			}
		})
	if err != nil {
		return // replay unreachable: the next live batch decides
	}
	switch verdict {
	case "same":
	case "lost":
		s.cfg.Logger.Warn("kv events: batches lost beyond the replay buffer, clearing index", "server", s.server, "after", last)
		s.clear()
		s.resetSeq()
	default: // "restart", or nothing at all from `last` on
		s.mu.Lock()
		s.restarts++
		s.mu.Unlock()
		s.cfg.Logger.Warn("kv events: engine restart detected, clearing its index", "server", s.server, "last_seq", last)
		s.clear()
		s.resetSeq()
		s.mu.Lock()
		s.replays++ // before the new run's batches show in the index
		s.mu.Unlock()
		_, _ = s.replayRange(ctx, 0, endSeq, true, s.applyReplayed)
	}
}

// recoverStart applies everything the publisher's replay buffer holds
// before the first batch this subscriber received. A SUB socket receives
// nothing until its subscription has reached the publisher (ZMQ's slow
// joiner, ~1-2 s here), so batches published right after we connected are
// dropped, and if the publisher then goes quiet no live batch ever reveals
// the gap. Live batches that also arrive are deduplicated in handle.
func (s *Subscriber) recoverStart(ctx context.Context) {
	n := 0
	_, err := s.replayRange(ctx, 0, endSeq, true,
		func(seq uint64, payload []byte) {
			if n++; n == 1 { // counted before its batches show in the index
				s.mu.Lock()
				s.replays++
				s.mu.Unlock()
			}
			s.applyReplayed(seq, payload)
		})
	if err != nil {
		// Unreachable or timed out: the first live batch asks again.
		s.cfg.Logger.Debug("kv events start-up replay failed", "server", s.server, "applied", n, "err", err)
	}
}

// applyReplayed applies a batch from an open-ended replay and remembers it,
// so that the same batch arriving live on this connection is skipped.
func (s *Subscriber) applyReplayed(seq uint64, payload []byte) {
	if s.replayed == nil {
		s.replayed = map[uint64]uint64{}
	}
	s.replayed[seq] = xxhash.Sum64(payload)
	if seq > s.replayedMax {
		s.replayedMax = seq
	}
	s.apply(seq, payload)
}

// resetSeq forgets the sequence position, as for a new publisher.
func (s *Subscriber) resetSeq() {
	s.mu.Lock()
	s.lastSeq, s.lastHash, s.seqSeen = 0, 0, false
	s.mu.Unlock()
	s.replayed, s.replayedMax = nil, 0
}

// clear drops the server's index for a reason of the subscriber's own (a
// gap, a restart, a panic); a weight sync's pending engine reset stays
// pending where the writer can tell the two (sink.Forgetter).
func (s *Subscriber) clear() {
	if w, ok := s.r.EventWriter(s.server); ok {
		if f, ok := w.(sink.Forgetter); ok {
			_ = f.Forget()
		} else {
			_ = w.Cleared()
		}
		s.stats.Cleared.Add(1)
	}
}

// recovered handles a panic that ended a session: counted, marked failed,
// logged with its stack; the server's index is cleared and the sequence
// forgotten (the batch may have been half applied). It returns the backoff
// before the next session.
func (s *Subscriber) recovered(perr *PanicError) time.Duration {
	s.mu.Lock()
	s.panics++
	s.panicStreak++
	s.failed, s.lastPanic = true, perr.Error()
	s.connected = false // the session's socket is closed
	n := s.panicStreak
	s.mu.Unlock()
	wait := panicBackoff(s.cfg.RetryInterval, n)
	s.cfg.Logger.Error("kv events: subscriber panicked; index cleared, restarting", "server", s.server,
		"endpoint", s.ep.Endpoint, "panic", perr.Value, "restart_in", wait, "stack", perr.Stack)
	if p2 := guard(func() { s.clear(); s.resetSeq() }); p2 != nil {
		s.cfg.Logger.Error("kv events: clearing after a panic panicked", "server", s.server, "panic", p2.Value)
	}
	return wait
}

func (s *Subscriber) apply(seq uint64, payload []byte) {
	debugPanic(PanicEvents)
	if len(payload) > s.cfg.Limits.MaxPayloadBytes {
		s.stats.DecodeErrors.Add(1)
	} else if err := s.cfg.Limits.DecodeInto(payload, &s.batch); err != nil {
		s.stats.DecodeErrors.Add(1)
	} else if err := Apply(s.r, s.server, &s.batch, &s.stats); err != nil {
		s.stats.ApplyErrors.Add(1)
	}
	events := len(s.batch.Events)
	if s.batch.Retained() > maxRetainedBatch {
		// Do not pin one giant batch's buffers for the connection's life.
		s.batch = kvevents.Batch{}
	}
	memtrim.Note(len(payload))
	now := time.Now()
	s.mu.Lock()
	if !s.seqSeen {
		// Batches 0..seq-1 of this publisher run were never applied.
		s.unreplayed += seq
	}
	s.lastSeq, s.seqSeen = seq, true
	s.failed, s.panicStreak = false, 0
	s.lastHash = xxhash.Sum64(payload)
	s.lastEvent = now
	s.rateEvents += uint64(events)
	if s.rateStart.IsZero() {
		s.rateStart = now
	}
	if d := now.Sub(s.rateStart); d >= time.Second {
		s.rate = float64(s.rateEvents) / d.Seconds()
		s.rateEvents, s.rateStart = 0, now
	}
	s.mu.Unlock()
}

// replay asks the publisher's replay socket for batches [from, to) and
// applies them in order. It reports whether the whole range arrived.
func (s *Subscriber) replay(ctx context.Context, from, to uint64) bool {
	if s.ep.Replay == "" {
		return false
	}
	s.mu.Lock()
	if s.now().Before(s.replayOpenUntil) {
		// The breaker is open: not a replay, not a failure.
		s.replaySkipped++
		s.mu.Unlock()
		return false
	}
	s.replays++
	s.mu.Unlock()
	ok, err := s.doReplay(ctx, from, to)
	if err != nil || !ok {
		s.mu.Lock()
		s.replayFails++
		s.mu.Unlock()
		s.cfg.Logger.Debug("kv events replay incomplete", "server", s.server, "from", from, "to", to, "err", err)
	}
	return ok && err == nil
}

func (s *Subscriber) doReplay(ctx context.Context, from, to uint64) (bool, error) {
	// History before the first message may be partly evicted from the
	// publisher's buffer; take what is there. A gap must close fully.
	partial := from == 0 && s.Status().Events.Batches == 0
	return s.replayRange(ctx, from, to, partial, s.apply)
}

// maxReplayBackoff caps how long the replay breaker stays open.
const maxReplayBackoff = 30 * time.Second

// errBreakerOpen: a replay was not attempted, the endpoint failed lately.
var errBreakerOpen = errors.New("replay endpoint failed recently; not asked (breaker open)")

// errEvicted: the replay endpoint answered, without the needed batches.
var errEvicted = errors.New("replay incomplete")

// replayRange runs one replay exchange for this subscription, behind a
// breaker: an endpoint that failed (unreachable, silent, hostile) is not
// asked again for ReplayTimeout, doubling per consecutive failure up to
// maxReplayBackoff. Without it every gapped batch from a publisher whose
// replay endpoint is silent blocked the subscription for the replay
// timeout, and it fell behind the publisher without bound. A panic in the
// replay reader is re-raised as the *PanicError it was recovered as: the
// session ends through recovered() (counted, subscription marked failed,
// index cleared), not as a plain replay error.
func (s *Subscriber) replayRange(ctx context.Context, from, to uint64, partial bool, fn func(uint64, []byte)) (bool, error) {
	now := s.now()
	s.mu.Lock()
	if now.Before(s.replayOpenUntil) {
		s.replaySkipped++
		s.mu.Unlock()
		return false, errBreakerOpen
	}
	s.mu.Unlock()
	complete, bad, err := ReplayWith(ctx, s.ep.Replay, from, to, ReplayOptions{Timeout: s.cfg.ReplayTimeout,
		DialTimeout: s.cfg.DialTimeout, Partial: partial, MaxPayloadBytes: s.cfg.Limits.MaxPayloadBytes}, fn)
	var perr *PanicError
	if errors.As(err, &perr) {
		s.mu.Lock()
		s.replayPanics++
		s.mu.Unlock()
		panic(&PanicError{Value: fmt.Sprintf("replay reader: %v", perr.Value), Stack: perr.Stack})
	}
	s.noteConnErr(err)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.badFrames += uint64(bad)
	switch {
	case err == nil || errors.Is(err, errEvicted):
		s.replayFailStreak, s.replayOpenUntil = 0, time.Time{}
	case ctx.Err() != nil:
		// Our own shutdown, not the endpoint's failure.
	default:
		s.replayFailStreak++
		wait := min(s.cfg.ReplayTimeout<<min(s.replayFailStreak-1, 16), maxReplayBackoff)
		s.replayOpenUntil = s.now().Add(wait)
	}
	return complete, err
}

// ReplayOptions tune one replay exchange.
type ReplayOptions struct {
	// Timeout bounds the whole exchange (dial, request, every reply).
	Timeout time.Duration
	// DialTimeout bounds the TCP connect.
	DialTimeout time.Duration
	// Partial skips batches already evicted from the publisher's buffer;
	// otherwise a missing one ends the replay incomplete.
	Partial bool
	// MaxPayloadBytes bounds one replayed batch (the default limit when 0);
	// a larger frame ends the replay with zmtp.ErrTooLarge before it is read.
	MaxPayloadBytes int
}

// Replay asks a publisher's replay endpoint (vLLM's ROUTER protocol: send
// ["", start_seq]) for the batches with seq in [from, to), and calls fn for
// each in order. With partial, batches already evicted from the publisher's
// buffer are skipped; otherwise a missing one ends the replay incomplete.
// It returns whether the range arrived whole and how many frames were bad.
// Sequence numbers are unsigned 64-bit; 2^64-1 is the end marker, so
// to = 2^64-1 (endSeq) asks for everything from `from` on.
func Replay(ctx context.Context, endpoint string, from, to uint64, timeout, dialTimeout time.Duration, partial bool,
	fn func(seq uint64, payload []byte)) (bool, int, error) {
	return ReplayWith(ctx, endpoint, from, to, ReplayOptions{Timeout: timeout, DialTimeout: dialTimeout, Partial: partial}, fn)
}

// replayHook, when set (tests), runs on every reply the replay reader
// receives, before it is parsed.
var replayHook func(frames [][]byte)

// ReplayWith is Replay with every option. Replies are read through the
// bounded ZMTP reader on the calling goroutine: nothing outlives the call,
// and at most one reply (MaxPayloadBytes plus framing) is held at a time.
// A panic in the reader is recovered and returned as a *PanicError (the
// caller decides what it means for its subscription); a panic in fn is
// fn's own and propagates.
func ReplayWith(ctx context.Context, endpoint string, from, to uint64, o ReplayOptions,
	fn func(seq uint64, payload []byte)) (complete bool, bad int, err error) {
	if o.MaxPayloadBytes <= 0 {
		o.MaxPayloadBytes = kvevents.DefaultLimits.MaxPayloadBytes
	}
	rctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	d, err := zmtp.Dial(rctx, endpoint, zmtp.Options{Type: zmtp.Dealer, DialTimeout: o.DialTimeout,
		Limits: zmtp.ForPayload(o.MaxPayloadBytes, maxTopicBytes)})
	if err != nil {
		if rctx.Err() != nil && ctx.Err() == nil {
			return false, 0, fmt.Errorf("replay timed out dialling %s: %w", endpoint, err)
		}
		return false, 0, err
	}
	defer d.Close()
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], from)
	if err := d.Send([]byte{}, start[:]); err != nil {
		return false, 0, err
	}
	if dl, ok := rctx.Deadline(); ok {
		_ = d.SetReadDeadline(dl)
	}
	next := from
	var frames [][]byte
	for {
		var rerr error
		if perr := guard(func() {
			frames, rerr = d.ReadMsg(frames)
			if rerr == nil && replayHook != nil {
				replayHook(frames)
			}
		}); perr != nil {
			return false, bad, perr
		}
		if rerr != nil {
			if rctx.Err() != nil || isTimeout(rerr) {
				return false, bad, fmt.Errorf("replay timed out at seq %d: %w", next, context.DeadlineExceeded)
			}
			return false, bad, rerr
		}
		seq, payload, ok := parseReplay(frames)
		if !ok {
			bad++
			continue
		}
		if seq == endSeq {
			return next >= to, bad, nil
		}
		sq := seq
		if sq < next || sq >= to {
			continue // before the range, or already live
		}
		if sq > next && !o.Partial {
			return false, bad, fmt.Errorf("%w: replay buffer starts at %d, needed %d", errEvicted, sq, next)
		}
		fn(sq, payload)
		next = sq + 1
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// parseReplay accepts both reply layouts, with or without the empty
// delimiter frame a DEALER may see first: [seq, payload] (vLLM <= 0.25) and
// [topic, seq, payload] (>= 0.26). With the delimiter they are 3 and 4
// frames; a 3-frame message reads the same either way (frame 1 is the seq).
// The end marker carries seq 0xffffffffffffffff.
func parseReplay(frames [][]byte) (uint64, []byte, bool) {
	if len(frames) == 4 && len(frames[0]) == 0 {
		frames = frames[1:]
	}
	switch {
	case len(frames) == 3 && len(frames[1]) == 8:
		return binary.BigEndian.Uint64(frames[1]), frames[2], true
	case len(frames) == 2 && len(frames[0]) == 8:
		return binary.BigEndian.Uint64(frames[0]), frames[1], true
	}
	return 0, nil, false
}

// normaliseEndpoint turns a bind-style endpoint (tcp://*:5557) into one a
// subscriber can dial on a host.
func normaliseEndpoint(ep, host string) string {
	if strings.Contains(ep, "://*:") && host != "" {
		return strings.Replace(ep, "://*:", "://"+host+":", 1)
	}
	return ep
}
