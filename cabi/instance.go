package main

import (
	"runtime/cgo"
	"sync"
	"sync/atomic"

	"github.com/kvc-router/kvc-router/core/kvcrouter"
	"github.com/kvc-router/kvc-router/core/router"
)

// Limits on borrowed inputs, checked before any copy.
const (
	maxIDBytes   = router.MaxServerIDBytes
	maxJSONBytes = 64 << 20
)

// instance is what a handle points to: one library (router and collectors,
// assembled by core/kvcrouter) and the C-side state around it.
type instance struct {
	// mu: readers are every operation; writers are pool changes and close.
	mu        sync.RWMutex
	lib       *kvcrouter.Library
	r         *router.Router
	closed    bool
	handle    cgo.Handle
	maxTokens int
	push      kvcrouter.PushConfig

	// Pool mirror in router order, refreshed under mu.Lock after every
	// membership change; gen counts the changes. kvr_acquire answers with
	// an index into it, and a caller that knows the generation skips the
	// server string.
	gen  int64
	pool []string
	pos  map[string]int32

	poisoned atomic.Pointer[string]
	// ignoredIDs counts lookups of ids no server can have (see lookupID).
	ignoredIDs atomic.Uint64
}

func newInstance(data []byte) (*instance, error) {
	cfg, err := kvcrouter.Parse(data)
	if err != nil {
		return nil, err
	}
	lib, err := kvcrouter.New(cfg, kvcrouter.Options{})
	if err != nil {
		return nil, err
	}
	cfg = lib.Config()
	return &instance{lib: lib, r: lib.Router(), maxTokens: cfg.Router.MaxPromptTokens, push: cfg.Push, pos: map[string]int32{}}, nil
}

// lookup resolves a handle without letting a stale one panic.
func lookup(h uint64) (inst *instance, err error) {
	if h == 0 {
		return nil, errf(codeInvalidArgument, "invalid handle 0 (never valid)")
	}
	defer func() {
		if recover() != nil {
			inst, err = nil, errf(codeInvalidState, "invalid or closed router handle %d", uint64(h))
		}
	}()
	v, ok := cgo.Handle(h).Value().(*instance)
	if !ok {
		return nil, errf(codeInvalidState, "handle %d is not a router handle", uint64(h))
	}
	return v, nil
}

// usable checks an instance under (at least) its read lock.
func (inst *instance) usable() error {
	if inst.closed {
		return errf(codeInvalidState, "router handle is closed")
	}
	if p := inst.poisoned.Load(); p != nil {
		return errf(codePoisoned, "router handle is poisoned by an earlier panic (%s); close it and create a new one", *p)
	}
	return nil
}

func (inst *instance) poison(msg string) { inst.poisoned.CompareAndSwap(nil, &msg) }

// refreshPool re-reads the router's pool order; callers hold mu.Lock.
func (inst *instance) refreshPool() {
	inst.pool = inst.r.Servers()
	inst.pos = make(map[string]int32, len(inst.pool))
	for i, id := range inst.pool {
		inst.pos[id] = int32(i)
	}
	inst.gen++
}

// close stops the collectors and releases the handle; callers hold mu.Lock.
func (inst *instance) close() error {
	if inst.closed {
		return errf(codeInvalidState, "router handle is already closed")
	}
	inst.closed = true
	inst.handle.Delete()
	return inst.lib.Close()
}
