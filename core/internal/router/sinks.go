package router

import (
	"sync"
	"sync/atomic"

	"github.com/kvc-router/kvc-router/core/internal/blockhash"
	"github.com/kvc-router/kvc-router/core/internal/index"
	"github.com/kvc-router/kvc-router/core/internal/sink"
)

// The router is the collectors' sink (package sink): they write events and
// metrics through these methods and never reach the index or the load
// store themselves.
var (
	_ sink.Events = (*Router)(nil)
	_ sink.Load   = (*Router)(nil)
)

// eventWriter applies one pool member's events to the index, keyed in the
// namespace of the router's model. It is made once per server (on first
// use) so that handing it out per batch does not allocate.
type eventWriter struct {
	ix    *index.Index
	id    index.ServerID
	model string
	ns    uint64        // namespace of the model without a lora
	bs    *atomic.Int32 // the server's evBlock
	prog  *progress     // in-flight requests' output (nil: lengths off)

	mu     sync.Mutex
	groups map[int]string // KV-cache group index -> kind (hybrid models)
}

var _ sink.HybridWriter = (*eventWriter)(nil)

func (w *eventWriter) Stored(tier index.Tier, hasParent bool, parent uint64, engineHashes []uint64, tokens []int32, blockSize int, lora string) error {
	if tier == index.GPU && len(tokens) > 0 && blockSize > 0 && blockSize <= 1<<16 {
		// The largest size seen: an engine that ends a run on a partial
		// block (LMCache chunks) reports a smaller one for that block only.
		for cur := w.bs.Load(); int32(blockSize) > cur && !w.bs.CompareAndSwap(cur, int32(blockSize)); cur = w.bs.Load() {
		}
	}
	ns := w.ns
	if lora != "" {
		ns = blockhash.Namespace(w.model, lora)
	}
	err := w.ix.Stored(w.id, tier, hasParent, parent, engineHashes, tokens, blockSize, ns)
	if err == nil && w.prog != nil && hasParent && tier == index.GPU {
		w.prog.stored(w.ix, w.id, parent, tokens, blockSize)
	}
	return err
}

func (w *eventWriter) Removed(tier index.Tier, engineHashes []uint64) error {
	return w.ix.Removed(w.id, tier, engineHashes)
}

func (w *eventWriter) Cleared() error { return w.ix.Cleared(w.id) }

func (w *eventWriter) Forget() error { return w.ix.Forget(w.id) }

func (w *eventWriter) SetGroup(idx int, kind string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.groups == nil {
		w.groups = make(map[int]string)
	}
	if len(w.groups) < maxGroups || w.groups[idx] != "" {
		w.groups[idx] = kind
	}
}

// maxGroups bounds the group table against a hostile publisher (real
// models have a handful of KV-cache groups).
const maxGroups = 64

func (w *eventWriter) Group(idx int) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.groups[idx]
}

func (w *eventWriter) WindowStored(engineHashes []uint64, need int) error {
	return w.ix.WindowStored(w.id, engineHashes, need)
}

func (w *eventWriter) WindowRemoved(engineHashes []uint64) error {
	return w.ix.WindowRemoved(w.id, engineHashes)
}

// EventWriter implements sink.Events.
func (r *Router) EventWriter(id string) (sink.EventWriter, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.byID[id]
	if !ok {
		return nil, false
	}
	if s.writer == nil {
		s.writer = &eventWriter{ix: r.ix, id: s.ix, model: r.cfg.Model, ns: blockhash.Namespace(r.cfg.Model, ""), bs: &s.evBlock}
		if r.lens != nil {
			s.writer.prog = r.lens.prog // nil for a correlation-only learner
		}
	}
	return s.writer, true
}

// MetricsFailed implements sink.Load: a refused connection marks the
// server down at once, other failures after Load.UnhealthyAfter in a row.
func (r *Router) MetricsFailed(id string, err error, refused bool) bool {
	if refused {
		return r.ld.Down(id, err)
	}
	return r.ld.Fail(id, err)
}

// Residency lists what the index holds for a pool member (diagnostics and
// tests); nil for a server not in the pool.
func (r *Router) Residency(id string) []index.Residency {
	r.mu.Lock()
	s, ok := r.byID[id]
	r.mu.Unlock()
	if !ok {
		return nil
	}
	return r.ix.Snapshot(s.ix)
}
