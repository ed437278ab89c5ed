package server

import (
	"context"
	"encoding/binary"
	"fmt"
	"github.com/kvc-router/kvc-router/core/kvcrouter"
	"log/slog"
	"strings"
	"sync"

	"github.com/go-zeromq/zmq4"
)

// EndSeq is the replay end marker's sequence number.
const EndSeq = ^uint64(0)

// PublisherConfig configures one vLLM-style KV event publisher.
type PublisherConfig struct {
	// Endpoint is the PUB endpoint to bind (tcp://host:port; port 0 picks one).
	Endpoint string
	// ReplayEndpoint is the ROUTER endpoint to bind; "" disables replay.
	ReplayEndpoint string
	Topic          string
	Layout         kvcrouter.EventLayout
	// BufferSteps bounds the replay ring (default 10000).
	BufferSteps int
	// ReplayLayout is 2 (vLLM <= 0.25: [seq, payload]) or 3 (>= 0.26:
	// [topic, seq, payload]); default 3.
	ReplayLayout int
	// DropEvery withholds every N-th batch (seq % N == N-1) from the live
	// stream (it stays replayable); 0 = off. A test hook to force gaps.
	DropEvery int
	// DPRank is written into every batch.
	DPRank int
	Logger *slog.Logger
}

// pubItem is a batch to publish, or (b == nil) a flush marker.
type pubItem struct {
	b    *kvcrouter.EventBatch
	done chan struct{}
}

type ringEntry struct {
	seq     uint64
	payload []byte
}

// Publisher sends KV event batches on a ZMQ PUB socket, keeps the last
// BufferSteps of them and answers replay requests on a ROUTER socket. One
// goroutine owns the PUB socket and one the ROUTER socket.
type Publisher struct {
	cfg    PublisherConfig
	topic  []byte
	pub    zmq4.Socket
	router zmq4.Socket
	in     chan pubItem
	log    *slog.Logger
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	ring    []ringEntry // circular, len <= BufferSteps
	start   int
	next    uint64
	drop    map[uint64]bool
	dropN   int
	dropped uint64
	closed  bool
}

// NewPublisher binds the sockets and starts the goroutines.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	if cfg.BufferSteps <= 0 {
		cfg.BufferSteps = 10000
	}
	if cfg.ReplayLayout == 0 {
		cfg.ReplayLayout = 3
	}
	if cfg.ReplayLayout != 2 && cfg.ReplayLayout != 3 {
		return nil, fmt.Errorf("replay layout %d: want 2 or 3", cfg.ReplayLayout)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Publisher{cfg: cfg, topic: []byte(cfg.Topic), in: make(chan pubItem, 4096), log: cfg.Logger,
		cancel: cancel, drop: map[uint64]bool{}}
	p.pub = zmq4.NewPub(ctx)
	if err := p.pub.Listen(cfg.Endpoint); err != nil {
		cancel()
		p.pub.Close()
		return nil, fmt.Errorf("kv events pub: %w", err)
	}
	if cfg.ReplayEndpoint != "" {
		p.router = zmq4.NewRouter(ctx)
		if err := p.router.Listen(cfg.ReplayEndpoint); err != nil {
			cancel()
			p.pub.Close()
			p.router.Close()
			return nil, fmt.Errorf("kv events replay: %w", err)
		}
		p.wg.Add(1)
		go p.serveReplay()
	}
	p.wg.Add(1)
	go p.run()
	return p, nil
}

// Endpoint returns the bound PUB endpoint (with the real port).
func (p *Publisher) Endpoint() string { return boundEndpoint(p.cfg.Endpoint, p.pub) }

// ReplayEndpoint returns the bound ROUTER endpoint, or "".
func (p *Publisher) ReplayEndpoint() string {
	if p.router == nil {
		return ""
	}
	return boundEndpoint(p.cfg.ReplayEndpoint, p.router)
}

func boundEndpoint(ep string, s zmq4.Socket) string {
	a := s.Addr()
	if a == nil {
		return ep
	}
	scheme, _, _ := strings.Cut(ep, "://")
	return scheme + "://" + a.String()
}

// Publish queues a batch; it blocks only when 4096 batches are pending.
func (p *Publisher) Publish(b *kvcrouter.EventBatch) { p.in <- pubItem{b: b} }

// Flush waits until every batch published before the call has been
// numbered, buffered and handed to the PUB socket.
func (p *Publisher) Flush() {
	done := make(chan struct{})
	p.in <- pubItem{done: done}
	<-done
}

// DropSeqs withholds the given sequence numbers from the live stream.
func (p *Publisher) DropSeqs(seqs ...uint64) {
	p.mu.Lock()
	for _, s := range seqs {
		p.drop[s] = true
	}
	p.mu.Unlock()
}

// DropNext withholds the next n batches from the live stream.
func (p *Publisher) DropNext(n int) {
	p.mu.Lock()
	p.dropN += n
	p.mu.Unlock()
}

// NextSeq is the sequence number the next batch will get.
func (p *Publisher) NextSeq() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.next
}

// Dropped counts batches withheld from the live stream.
func (p *Publisher) Dropped() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dropped
}

// Close stops publishing (queued batches are dropped) and closes the sockets.
// The caller must not Publish after Close.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	close(p.in)
	err := p.pub.Close()
	if p.router != nil {
		if e := p.router.Close(); err == nil {
			err = e
		}
	}
	p.cancel()
	p.wg.Wait()
	return err
}

func seqBytes(seq uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, seq)
	return b
}

func (p *Publisher) run() {
	defer p.wg.Done()
	for it := range p.in {
		if it.b == nil {
			close(it.done)
			continue
		}
		b := it.b
		if p.cfg.Layout == kvcrouter.EventLayoutMap {
			b = dressMap(b)
		}
		payload, err := kvcrouter.EncodeEvents(b, p.cfg.Layout)
		if err != nil {
			p.log.Error("kv events encode", "err", err)
			continue
		}
		p.mu.Lock()
		seq := p.next
		p.next++
		if len(p.ring) < p.cfg.BufferSteps {
			p.ring = append(p.ring, ringEntry{seq, payload})
		} else {
			p.ring[p.start] = ringEntry{seq, payload}
			p.start = (p.start + 1) % len(p.ring)
		}
		skip := p.drop[seq] || (p.cfg.DropEvery > 0 && seq%uint64(p.cfg.DropEvery) == uint64(p.cfg.DropEvery-1))
		if !skip && p.dropN > 0 {
			p.dropN--
			skip = true
		}
		delete(p.drop, seq)
		if skip {
			p.dropped++
		}
		closed := p.closed
		p.mu.Unlock()
		if skip || closed {
			continue
		}
		if err := p.pub.Send(zmq4.NewMsgFrom(p.topic, seqBytes(seq), payload)); err != nil {
			p.log.Warn("kv events send", "seq", seq, "err", err)
		}
	}
}

// dressMap adds the fields vLLM >= 0.24 (map layout) sends on GPU
// BlockStored events: extra_keys [None]*blocks, group_idx 0 and
// kv_cache_spec_kind "full_attention". The array layout mirrors the older
// 7-field BlockStored. The engine's events are not modified.
func dressMap(b *kvcrouter.EventBatch) *kvcrouter.EventBatch {
	out := *b
	out.Events = make([]kvcrouter.Event, len(b.Events))
	for i, e := range b.Events {
		if e.Kind == kvcrouter.EventStored && e.Medium == "GPU" {
			e.ExtraKeys = kvcrouter.NoneExtraKeys(len(e.BlockHashes))
			e.GroupIdx = 0
			e.KVCacheSpecKind = "full_attention"
		}
		out.Events[i] = e
	}
	return &out
}

// snapshot returns buffered entries with seq >= from, in order.
func (p *Publisher) snapshot(from uint64) []ringEntry {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []ringEntry
	for i := 0; i < len(p.ring); i++ {
		e := p.ring[(p.start+i)%len(p.ring)]
		if e.seq >= from {
			out = append(out, e)
		}
	}
	return out
}

func (p *Publisher) serveReplay() {
	defer p.wg.Done()
	for {
		msg, err := p.router.Recv()
		if err != nil {
			p.mu.Lock()
			closed := p.closed
			p.mu.Unlock()
			if closed {
				return
			}
			p.log.Debug("kv events replay recv", "err", err)
			continue
		}
		f := msg.Frames
		if len(f) != 3 || len(f[1]) != 0 || len(f[2]) != 8 {
			p.log.Warn("kv events replay: invalid request", "frames", len(f))
			continue
		}
		id := f[0]
		start := binary.BigEndian.Uint64(f[2])
		for _, e := range p.snapshot(start) {
			var m zmq4.Msg
			if p.cfg.ReplayLayout == 3 {
				m = zmq4.NewMsgFrom(id, nil, p.topic, seqBytes(e.seq), e.payload)
			} else {
				m = zmq4.NewMsgFrom(id, nil, seqBytes(e.seq), e.payload)
			}
			if err := p.router.SendMulti(m); err != nil {
				p.log.Warn("kv events replay send", "err", err)
				break
			}
		}
		var end zmq4.Msg
		if p.cfg.ReplayLayout == 3 {
			end = zmq4.NewMsgFrom(id, nil, nil, seqBytes(EndSeq), nil)
		} else {
			end = zmq4.NewMsgFrom(id, nil, seqBytes(EndSeq), nil)
		}
		if err := p.router.SendMulti(end); err != nil {
			p.log.Warn("kv events replay end", "err", err)
		}
	}
}
