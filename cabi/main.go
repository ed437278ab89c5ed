// Command cabi is the C ABI of kvc-router, built with
// `go build -buildmode=c-shared` into libkvcrouter.so. The hand-written
// header kvcrouter.h documents every function; kvcrouter.map is the linker
// version script that keeps every symbol but the kvr_* exports local.
//
// Rules every export follows:
//   - it returns an int32 status code (KVR_OK = 0) and, when the caller passes
//     a non-NULL char** err, a message the caller frees with kvr_free;
//   - a Go panic is recovered, reported as KVR_INTERNAL, and poisons the
//     handle involved (later calls on it return KVR_POISONED); an error
//     codeOf cannot classify is KVR_INTERNAL too (a library bug), never
//     blamed on the caller's input;
//   - configuration errors (kvr_router_new, kvr_validate_config) start with
//     the key path at fault ("router.strategies[0].params.alpha: ...");
//   - borrowed inputs (ids, JSON, metrics text, event payloads) are copied
//     before use; the token array is only read during kvr_acquire; no Go
//     pointer is ever handed to C, and every returned string is C memory;
//   - nothing blocks on network I/O and nothing calls back into the host;
//   - the library never calls signal.Notify.
//
// A handle (runtime/cgo.Handle, 0 never valid) owns one router and its
// collector manager; kvr_router_close stops both. kvr_validate_config needs
// no handle: it reports on a configuration, status-style, and starts nothing.
// kvr_debug_panic exists only in the kvrdebug test build (debugpanic.go).
package main

/*
#include <stdint.h>
#include <stdlib.h>
*/
import "C"

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"runtime/cgo"
	"unicode/utf8"
	"unsafe"

	json "github.com/goccy/go-json"

	"github.com/kvc-router/kvc-router/core/kvcrouter"
)

func main() {}

// goString copies a borrowed (pointer, length) string, validating it.
func goString(p *C.char, n C.int64_t, what string, limit int64) (string, error) {
	switch {
	case n < 0:
		return "", errf(codeInvalidArgument, "%s length is negative (%d)", what, int64(n))
	case int64(n) > limit:
		return "", errf(codeInvalidArgument, "%s is %d bytes, more than the limit of %d", what, int64(n), limit)
	case n > 0 && p == nil:
		return "", errf(codeInvalidArgument, "%s is NULL with length %d", what, int64(n))
	case n == 0:
		return "", nil
	}
	// Copied through a Go slice, not C.GoStringN: its C.int length cuts
	// lengths of 2^31 and more (negative -> panic, 2^32+k -> k bytes).
	s := string(unsafe.Slice((*byte)(unsafe.Pointer(p)), int(n)))
	if !utf8.ValidString(s) {
		return "", errf(codeInvalidArgument, "%s is not valid UTF-8", what)
	}
	return s, nil
}

// goBytes copies a borrowed byte buffer.
func goBytes(p unsafe.Pointer, n C.int64_t, what string, limit int64) ([]byte, error) {
	switch {
	case n < 0:
		return nil, errf(codeInvalidArgument, "%s length is negative (%d)", what, int64(n))
	case int64(n) > limit:
		return nil, errf(codeInvalidArgument, "%s is %d bytes, more than the limit of %d", what, int64(n), limit)
	case n > 0 && p == nil:
		return nil, errf(codeInvalidArgument, "%s is NULL with length %d", what, int64(n))
	case n == 0:
		return []byte{}, nil
	}
	// Not C.GoBytes: its C.int length panics at 2^31 (poisoning the
	// handle) and silently cuts 2^32+16 to 16 bytes.
	return bytes.Clone(unsafe.Slice((*byte)(p), int(n))), nil
}

// cJSON marshals v into C memory at *out.
func cJSON(out **C.char, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding JSON: %w", err)
	}
	*out = C.CString(string(b))
	return nil
}

// reader runs fn on a usable instance under its read lock.
func reader(h C.uint64_t, fn func(inst *instance) error) error {
	inst, err := lookup(uint64(h))
	if err != nil {
		return err
	}
	inst.mu.RLock()
	defer inst.mu.RUnlock()
	if err := inst.usable(); err != nil {
		return err
	}
	return fn(inst)
}

// writer runs fn on a usable instance under its write lock.
func writer(h C.uint64_t, fn func(inst *instance) error) error {
	inst, err := lookup(uint64(h))
	if err != nil {
		return err
	}
	inst.mu.Lock()
	defer inst.mu.Unlock()
	if err := inst.usable(); err != nil {
		return err
	}
	return fn(inst)
}

func result(errOut **C.char, err error) C.int32_t {
	if err != nil {
		return fail(errOut, err)
	}
	return codeOK
}

//export kvr_abi_version
func kvr_abi_version() C.int32_t { return abiVersion }

//export kvr_free
func kvr_free(p unsafe.Pointer) {
	if p != nil {
		C.free(p)
	}
}

//export kvr_router_new
func kvr_router_new(cfg *C.char, cfgLen C.int64_t, outHandle *C.uint64_t, errOut **C.char) (code C.int32_t) {
	defer recoverExport("kvr_router_new", 0, &code, errOut)
	clearOut(errOut)
	if outHandle == nil {
		return fail(errOut, errf(codeInvalidArgument, "out_handle is NULL"))
	}
	*outHandle = 0
	data, err := goBytes(unsafe.Pointer(cfg), cfgLen, "config JSON", maxJSONBytes)
	if err != nil {
		return fail(errOut, err)
	}
	inst, err := newInstance(data)
	if err != nil {
		return fail(errOut, err)
	}
	inst.mu.Lock()
	inst.poolChanged()
	inst.handle = cgo.NewHandle(inst)
	inst.mu.Unlock()
	*outHandle = C.uint64_t(inst.handle)
	return codeOK
}

//export kvr_validate_config
func kvr_validate_config(cfg *C.char, cfgLen C.int64_t, outJSON **C.char, errOut **C.char) (code C.int32_t) {
	defer recoverExport("kvr_validate_config", 0, &code, errOut)
	clearOut(errOut)
	clearOut(outJSON)
	data, err := goBytes(unsafe.Pointer(cfg), cfgLen, "config JSON", maxJSONBytes)
	if err != nil {
		return fail(errOut, err)
	}
	c, err := kvcrouter.Parse(data)
	if err == nil {
		c, err = c.Effective()
	}
	if err != nil {
		// ABI 1.1: the error as {"key", "reason"} too.
		var fe *kvcrouter.FieldError
		if outJSON != nil && errors.As(err, &fe) {
			if jerr := cJSON(outJSON, fe); jerr != nil {
				return fail(errOut, jerr)
			}
		}
		return fail(errOut, err)
	}
	doc := c
	if outJSON == nil {
		return codeOK
	}
	return result(errOut, cJSON(outJSON, doc))
}

//export kvr_router_close
func kvr_router_close(h C.uint64_t, errOut **C.char) (code C.int32_t) {
	defer recoverExport("kvr_router_close", h, &code, errOut)
	clearOut(errOut)
	inst, err := lookup(uint64(h))
	if err != nil {
		return fail(errOut, err)
	}
	inst.mu.Lock()
	defer inst.mu.Unlock()
	return result(errOut, inst.close())
}

//export kvr_acquire
func kvr_acquire(h C.uint64_t, reqID *C.char, reqIDLen C.int64_t, tokens *C.int32_t, nTokens C.int64_t,
	pin C.int64_t, lora *C.char, loraLen C.int64_t, knownGen C.int64_t,
	outIndex *C.int32_t, outGen *C.int64_t, outServer **C.char, outDecision **C.char, errOut **C.char,
) (code C.int32_t) {
	defer recoverExport("kvr_acquire", h, &code, errOut)
	return acquire(h, reqID, reqIDLen, tokens, nTokens, pin, lora, loraLen, knownGen, nil,
		outIndex, outGen, outServer, outDecision, errOut)
}

// submission asks acquire to go through admission (kvr_acquire_with with
// submit set): the request may be held under ticket instead of routed.
type submission struct{ ticket uint64 }

// acquire is kvr_acquire and kvr_acquire_with; the export's deferred
// recoverExport covers it. With sub, a held request returns codeHeld with
// every output unset.
func acquire(h C.uint64_t, reqID *C.char, reqIDLen C.int64_t, tokens *C.int32_t, nTokens C.int64_t,
	pin C.int64_t, lora *C.char, loraLen C.int64_t, knownGen C.int64_t, sub *submission,
	outIndex *C.int32_t, outGen *C.int64_t, outServer **C.char, outDecision **C.char, errOut **C.char,
) C.int32_t {
	clearOut(errOut)
	clearOut(outServer)
	clearOut(outDecision)
	if outIndex != nil {
		*outIndex = -1
	}
	inst, err := lookup(uint64(h))
	if err != nil {
		return fail(errOut, err)
	}
	id, err := goString(reqID, reqIDLen, "request_id", maxIDBytes)
	if err != nil {
		return fail(errOut, err)
	}
	adapter, err := goString(lora, loraLen, "lora", maxIDBytes)
	if err != nil {
		return fail(errOut, err)
	}
	switch {
	case nTokens < 0:
		return fail(errOut, errf(codeInvalidArgument, "prompt length is negative (%d)", int64(nTokens)))
	case int64(nTokens) > int64(inst.maxTokens):
		return fail(errOut, errf(codeInvalidArgument, "prompt has %d tokens, more than max_prompt_tokens (%d)", int64(nTokens), inst.maxTokens))
	case nTokens > 0 && tokens == nil:
		return fail(errOut, errf(codeInvalidArgument, "prompt token array is NULL with length %d", int64(nTokens)))
	case pin < -1:
		return fail(errOut, errf(codeInvalidArgument, "pin must be -1 (none) or a non-negative index, got %d", int64(pin)))
	}
	var toks []int32
	if nTokens > 0 {
		// Borrowed: read during the call only (the router keeps block keys,
		// and a held request a copy, never the caller's array).
		toks = unsafe.Slice((*int32)(unsafe.Pointer(tokens)), int(nTokens))
	}
	inst.mu.RLock()
	defer inst.mu.RUnlock()
	if err := inst.usable(); err != nil {
		return fail(errOut, err)
	}
	req := kvcrouter.Request{ID: id, Tokens: toks, Pin: int(pin), Lora: adapter}
	var d kvcrouter.Decision
	if sub != nil {
		var queued bool
		d, queued, err = inst.lib.Submit(req, sub.ticket)
		if err == nil && queued {
			return codeHeld
		}
	} else {
		d, err = inst.r.Acquire(req)
	}
	if err != nil {
		return fail(errOut, err)
	}
	if outIndex != nil {
		*outIndex = C.int32_t(inst.index(d.Server))
	}
	if outGen != nil {
		*outGen = C.int64_t(inst.gen)
	}
	if outServer != nil && (knownGen < 0 || int64(knownGen) != inst.gen) {
		*outServer = C.CString(d.Server)
	}
	if outDecision != nil {
		if err := cJSON(outDecision, d); err != nil {
			return fail(errOut, err)
		}
	}
	return codeOK
}

//export kvr_release
func kvr_release(h C.uint64_t, server *C.char, serverLen C.int64_t, outReleased *C.int32_t, errOut **C.char) (code C.int32_t) {
	defer recoverExport("kvr_release", h, &code, errOut)
	clearOut(errOut)
	id, valid, err := lookupID(server, serverLen)
	if err != nil {
		return fail(errOut, err)
	}
	return result(errOut, reader(h, func(inst *instance) error {
		ok := false
		if valid {
			ok = inst.r.Release(id)
		} else {
			inst.ignoredIDs.Add(1) // no pool member has it: a no-op, counted
		}
		if outReleased != nil {
			*outReleased = 0
			if ok {
				*outReleased = 1
			}
		}
		return nil
	}))
}

//export kvr_add_servers
func kvr_add_servers(h C.uint64_t, idsJSON *C.char, n C.int64_t, outGen *C.int64_t, errOut **C.char) (code C.int32_t) {
	defer recoverExport("kvr_add_servers", h, &code, errOut)
	clearOut(errOut)
	ids, err := parseIDs(idsJSON, n)
	if err != nil {
		return fail(errOut, err)
	}
	return result(errOut, writer(h, func(inst *instance) error {
		err := inst.r.AddServers(ids)
		inst.poolChanged()
		if outGen != nil {
			*outGen = C.int64_t(inst.gen)
		}
		return err
	}))
}

//export kvr_remove_servers
func kvr_remove_servers(h C.uint64_t, idsJSON *C.char, n C.int64_t, outGen *C.int64_t, errOut **C.char) (code C.int32_t) {
	defer recoverExport("kvr_remove_servers", h, &code, errOut)
	clearOut(errOut)
	ids, err := parseIDs(idsJSON, n)
	if err != nil {
		return fail(errOut, err)
	}
	return result(errOut, writer(h, func(inst *instance) error {
		inst.lib.RemoveServers(ids)
		inst.poolChanged()
		if outGen != nil {
			*outGen = C.int64_t(inst.gen)
		}
		return nil
	}))
}

//export kvr_servers
func kvr_servers(h C.uint64_t, outJSON **C.char, outGen *C.int64_t, errOut **C.char) (code C.int32_t) {
	defer recoverExport("kvr_servers", h, &code, errOut)
	clearOut(errOut)
	clearOut(outJSON)
	if outJSON == nil {
		return fail(errOut, errf(codeInvalidArgument, "out_json is NULL"))
	}
	return result(errOut, reader(h, func(inst *instance) error {
		if outGen != nil {
			*outGen = C.int64_t(inst.gen)
		}
		pool := inst.r.Servers()
		if pool == nil {
			pool = []string{}
		}
		return cJSON(outJSON, pool)
	}))
}

//export kvr_inflight
func kvr_inflight(h C.uint64_t, server *C.char, serverLen C.int64_t, out *C.int64_t, errOut **C.char) (code C.int32_t) {
	defer recoverExport("kvr_inflight", h, &code, errOut)
	clearOut(errOut)
	if out == nil {
		return fail(errOut, errf(codeInvalidArgument, "out is NULL"))
	}
	id, valid, err := lookupID(server, serverLen)
	if err != nil {
		return fail(errOut, err)
	}
	return result(errOut, reader(h, func(inst *instance) error {
		*out = 0
		if !valid {
			inst.ignoredIDs.Add(1)
			return nil
		}
		*out = C.int64_t(inst.r.Inflight(id))
		return nil
	}))
}

//export kvr_total_inflight
func kvr_total_inflight(h C.uint64_t, out *C.int64_t, errOut **C.char) (code C.int32_t) {
	defer recoverExport("kvr_total_inflight", h, &code, errOut)
	clearOut(errOut)
	if out == nil {
		return fail(errOut, errf(codeInvalidArgument, "out is NULL"))
	}
	return result(errOut, reader(h, func(inst *instance) error {
		*out = C.int64_t(inst.r.TotalInflight())
		return nil
	}))
}

//export kvr_update_metrics
func kvr_update_metrics(h C.uint64_t, server *C.char, serverLen C.int64_t, text *C.char, textLen C.int64_t,
	flavor C.int32_t, errOut **C.char,
) (code C.int32_t) {
	defer recoverExport("kvr_update_metrics", h, &code, errOut)
	clearOut(errOut)
	id, err := serverID(server, serverLen)
	if err != nil {
		return fail(errOut, err)
	}
	var fl kvcrouter.MetricsFlavor
	switch flavor {
	case 0:
		fl = kvcrouter.MetricsVLLM
	case 1:
		fl = kvcrouter.MetricsSGLang
	default:
		return fail(errOut, errf(codeInvalidArgument, "metrics flavor %d (allowed: 0 = vllm, 1 = sglang)", int32(flavor)))
	}
	return result(errOut, reader(h, func(inst *instance) error {
		body, err := goBytes(unsafe.Pointer(text), textLen, "metrics text", inst.push.MaxMetricsBytes)
		if err != nil {
			return err
		}
		return inst.lib.PushMetrics(id, body, fl)
	}))
}

//export kvr_update_events
func kvr_update_events(h C.uint64_t, server *C.char, serverLen C.int64_t, payload unsafe.Pointer, payloadLen C.int64_t,
	errOut **C.char,
) (code C.int32_t) {
	defer recoverExport("kvr_update_events", h, &code, errOut)
	clearOut(errOut)
	id, err := serverID(server, serverLen)
	if err != nil {
		return fail(errOut, err)
	}
	return result(errOut, reader(h, func(inst *instance) error {
		body, err := goBytes(payload, payloadLen, "KV-event payload", inst.push.MaxEventBytes)
		if err != nil {
			return err
		}
		return inst.lib.PushEvents(id, body)
	}))
}

//export kvr_set_kv_endpoints
func kvr_set_kv_endpoints(h C.uint64_t, server *C.char, serverLen C.int64_t, epsJSON *C.char, n C.int64_t,
	errOut **C.char,
) (code C.int32_t) {
	defer recoverExport("kvr_set_kv_endpoints", h, &code, errOut)
	clearOut(errOut)
	id, err := serverID(server, serverLen)
	if err != nil {
		return fail(errOut, err)
	}
	data, err := goBytes(unsafe.Pointer(epsJSON), n, "endpoint list JSON", maxJSONBytes)
	if err != nil {
		return fail(errOut, err)
	}
	var eps []kvcrouter.EventEndpoint
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&eps); err != nil {
		return fail(errOut, errf(codeInvalidArgument,
			"endpoint list must be a JSON array of {\"endpoint\", \"replay\", \"topic\"}: %v", err))
	}
	return result(errOut, reader(h, func(inst *instance) error {
		return inst.lib.SetEndpoints(id, eps)
	}))
}

// statusDoc is the JSON written by kvr_status.
type statusDoc struct {
	ABIVersion int                       `json:"abi_version"`
	Generation int64                     `json:"generation"`
	Pool       []string                  `json:"pool"`
	Router     kvcrouter.RouterStatus    `json:"router"`
	Collectors kvcrouter.CollectorStatus `json:"collectors"`
	Panics     uint64                    `json:"panics"`
	// IgnoredIDs counts releases and in-flight lookups of ids no server
	// can have (over the length limit, invalid UTF-8, NUL): no-ops.
	IgnoredIDs uint64 `json:"ignored_invalid_ids"`
	// Goroutines is the process's goroutine count (leak checks).
	Goroutines int `json:"goroutines"`
}

//export kvr_status
func kvr_status(h C.uint64_t, outJSON **C.char, errOut **C.char) (code C.int32_t) {
	defer recoverExport("kvr_status", h, &code, errOut)
	clearOut(errOut)
	clearOut(outJSON)
	if outJSON == nil {
		return fail(errOut, errf(codeInvalidArgument, "out_json is NULL"))
	}
	return result(errOut, reader(h, func(inst *instance) error {
		st := inst.lib.Status()
		doc := statusDoc{
			ABIVersion: abiVersion, Generation: inst.gen, Pool: inst.r.Servers(),
			Router: st.Router, Collectors: st.Collectors, Panics: panics.Load(), IgnoredIDs: inst.ignoredIDs.Load(),
			Goroutines: runtime.NumGoroutine(),
		}
		if doc.Pool == nil {
			doc.Pool = []string{}
		}
		return cJSON(outJSON, doc)
	}))
}

//export kvr_clear_sticky
func kvr_clear_sticky(h C.uint64_t, outJSON **C.char, errOut **C.char) (code C.int32_t) {
	defer recoverExport("kvr_clear_sticky", h, &code, errOut)
	clearOut(errOut)
	clearOut(outJSON)
	return result(errOut, reader(h, func(inst *instance) error {
		n, loads := inst.r.ClearSticky()
		if outJSON == nil {
			return nil
		}
		if loads == nil {
			loads = []kvcrouter.ServerLoad{}
		}
		return cJSON(outJSON, struct {
			Cleared int                    `json:"cleared_entries"`
			Loads   []kvcrouter.ServerLoad `json:"server_loads"`
		}{n, loads})
	}))
}

//export kvr_reset_cache
func kvr_reset_cache(h C.uint64_t, errOut **C.char) (code C.int32_t) {
	defer recoverExport("kvr_reset_cache", h, &code, errOut)
	clearOut(errOut)
	return result(errOut, reader(h, func(inst *instance) error {
		inst.r.ResetCache()
		return nil
	}))
}
