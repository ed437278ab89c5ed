package main

import (
	"runtime/cgo"
	"sync"
	"sync/atomic"

	"github.com/kvc-router/kvc-router/core/kvcrouter"
)

// Limits on borrowed inputs, checked before any copy.
const (
	maxIDBytes   = kvcrouter.MaxServerIDBytes
	maxJSONBytes = 64 << 20
)

// instance is what a handle points to: one library (router and collectors,
// assembled by core/kvcrouter) and the C-side state around it.
type instance struct {
	// mu: readers are every operation; writers are pool changes and close.
	mu        sync.RWMutex
	lib       *kvcrouter.Library
	r         *kvcrouter.Router
	closed    bool
	handle    cgo.Handle
	maxTokens int
	push      kvcrouter.PushConfig

	// gen counts pool membership changes (under mu.Lock). kvr_acquire
	// answers with the server's index in the router's pool and this
	// generation, and a caller that knows the generation may skip the
	// server string. The router's pool is the one copy: this shell keeps
	// none (docs/performance.md, "The pool has one copy").
	gen int64

	poisoned atomic.Pointer[string]
	// ignoredIDs counts lookups of ids no server can have (see lookupID).
	ignoredIDs atomic.Uint64
}

func newInstance(data []byte) (*instance, error) {
	cfg, err := kvcrouter.Parse(data)
	if err != nil {
		return nil, err
	}
	out, asJSON := logOutput()
	lib, err := kvcrouter.New(cfg, kvcrouter.Options{LogOutput: out, LogJSON: asJSON})
	if err != nil {
		return nil, err
	}
	cfg = lib.Config()
	return &instance{lib: lib, r: lib.Router(), maxTokens: cfg.Router.MaxPromptTokens, push: cfg.Push}, nil
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

// poolChanged counts a membership change; callers hold mu.Lock.
func (inst *instance) poolChanged() { inst.gen++ }

// index is server's position in the router's pool (-1: not a member);
// callers hold mu (read), so no membership change runs meanwhile.
func (inst *instance) index(server string) int32 { return int32(inst.r.Position(server)) }

// close stops the collectors and releases the handle; callers hold mu.Lock.
func (inst *instance) close() error {
	if inst.closed {
		return errf(codeInvalidState, "router handle is already closed")
	}
	inst.closed = true
	inst.handle.Delete()
	return inst.lib.Close()
}
