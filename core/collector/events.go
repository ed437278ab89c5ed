package collector

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/go-zeromq/zmq4"

	"github.com/kvc-router/kvc-router/core/collector/internal/zmtp"
	"github.com/kvc-router/kvc-router/core/kvevents"
	"github.com/kvc-router/kvc-router/core/memtrim"
	"github.com/kvc-router/kvc-router/core/sink"
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
	Panics        uint64      `json:"panics"`
	Failed        bool        `json:"failed"`
	LastPanic     string      `json:"last_panic,omitempty"`
	LastEventUnix float64     `json:"last_event_unix"`
	EventsPerSec  float64     `json:"events_per_sec"`
	Events        EventCounts `json:"events"`
}

// Subscriber follows one publisher: SUB socket, sequence tracking, replay
// on gaps, index clearing on engine restart, re-dial on silence.
type Subscriber struct {
	r      sink.Events
	server string
	ep     Endpoint
	cfg    SubscriberConfig
	stats  EventStats

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
	return &Subscriber{r: r, server: server, ep: ep, cfg: cfg.withDefaults()}
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
		Panics: s.panics, Failed: s.failed, LastPanic: s.lastPanic,
		Events: s.stats.Snapshot(),
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
	for ctx.Err() == nil {
		var err error
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
			select {
			case <-ctx.Done():
			case <-time.After(s.cfg.RetryInterval):
			}
		}
	}
}

// session holds one SUB connection until it goes idle, fails or ctx ends.
func (s *Subscriber) session(ctx context.Context) error {
	s.mu.Lock()
	s.dials++
	s.mu.Unlock()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sub := zmq4.NewSub(sctx, zmq4.WithDialerMaxRetries(1), zmq4.WithDialerTimeout(s.cfg.DialTimeout),
		zmq4.WithDialerRetry(s.cfg.RetryInterval))
	defer zmtp.CloseDrained(sub)
	if err := sub.SetOption(zmq4.OptionSubscribe, s.ep.Topic); err != nil {
		return err
	}
	if err := sub.Dial(zmtp.DialEndpoint(s.ep.Endpoint)); err != nil {
		s.setConnected(false)
		return err
	}
	s.setConnected(true)
	s.r.SetEventFeed(s.server, true)
	s.replayed, s.replayedMax = nil, 0
	// A new connection may be to a restarted publisher on the same port;
	// and a first connection recovers what the publisher buffered,
	// including what it sends before our subscription reaches it.
	s.probe(ctx)

	msgs := make(chan zmq4.Msg, 64)
	errc := make(chan error, 1)
	go func() {
		if perr := guard(func() {
			for {
				m, err := sub.Recv()
				if err != nil {
					errc <- err
					return
				}
				select {
				case msgs <- m:
				case <-sctx.Done():
					return
				}
			}
		}); perr != nil {
			errc <- perr // the session ends; run restarts it
		}
	}()
	idle := time.NewTimer(s.cfg.IdleRedial)
	defer idle.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errc:
			return err
		case <-idle.C:
			// Silence. A lost final batch would go unnoticed until the
			// next event, so ask the replay buffer for anything after
			// the last seq (or for everything, when nothing arrived yet:
			// batches published while the subscription propagated); then
			// reconnect, so that a publisher restarted on the same port
			// is seen (its sequence restarts at 0).
			s.probe(ctx)
			return errors.New("idle")
		case m := <-msgs:
			if !idle.Stop() {
				select {
				case <-idle.C:
				default:
				}
			}
			idle.Reset(s.cfg.IdleRedial)
			s.handle(ctx, m.Frames)
		}
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
	_, bad, err := Replay(ctx, s.ep.Replay, last, endSeq, s.cfg.ReplayTimeout, s.cfg.DialTimeout, true,
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
	s.mu.Lock()
	s.badFrames += uint64(bad)
	s.mu.Unlock()
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
		_, bad, _ := Replay(ctx, s.ep.Replay, 0, endSeq, s.cfg.ReplayTimeout, s.cfg.DialTimeout, true, s.applyReplayed)
		s.mu.Lock()
		s.badFrames += uint64(bad)
		s.mu.Unlock()
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
	_, bad, err := Replay(ctx, s.ep.Replay, 0, endSeq, s.cfg.ReplayTimeout, s.cfg.DialTimeout, true,
		func(seq uint64, payload []byte) {
			if n++; n == 1 { // counted before its batches show in the index
				s.mu.Lock()
				s.replays++
				s.mu.Unlock()
			}
			s.applyReplayed(seq, payload)
		})
	s.mu.Lock()
	s.badFrames += uint64(bad)
	s.mu.Unlock()
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

func (s *Subscriber) clear() {
	if w, ok := s.r.EventWriter(s.server); ok {
		_ = w.Cleared()
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
	complete, bad, err := Replay(ctx, s.ep.Replay, from, to, s.cfg.ReplayTimeout, s.cfg.DialTimeout, partial, s.apply)
	if bad > 0 {
		s.mu.Lock()
		s.badFrames += uint64(bad)
		s.mu.Unlock()
	}
	return complete, err
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
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	d := zmq4.NewDealer(rctx, zmq4.WithDialerMaxRetries(1), zmq4.WithDialerTimeout(dialTimeout))
	defer zmtp.CloseDrained(d)
	if err := d.Dial(zmtp.DialEndpoint(endpoint)); err != nil {
		return false, 0, err
	}
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], from)
	if err := d.Send(zmq4.NewMsgFrom([]byte{}, start[:])); err != nil {
		return false, 0, err
	}
	type reply struct {
		m   zmq4.Msg
		err error
	}
	replies := make(chan reply, 16)
	go func() {
		if perr := guard(func() {
			for {
				m, err := d.Recv()
				select {
				case replies <- reply{m, err}:
				case <-rctx.Done():
					return
				}
				if err != nil {
					return
				}
			}
		}); perr != nil {
			select {
			case replies <- reply{err: perr}:
			case <-rctx.Done():
			}
		}
	}()
	next, bad := from, 0
	for {
		var rp reply
		select {
		case <-rctx.Done():
			return false, bad, fmt.Errorf("replay timed out at seq %d: %w", next, rctx.Err())
		case rp = <-replies:
		}
		if rp.err != nil {
			return false, bad, rp.err
		}
		seq, payload, ok := parseReplay(rp.m.Frames)
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
		if sq > next && !partial {
			return false, bad, fmt.Errorf("replay buffer starts at %d, needed %d", sq, next)
		}
		fn(sq, payload)
		next = sq + 1
	}
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
