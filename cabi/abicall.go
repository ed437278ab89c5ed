package main

/*
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
*/
import "C"

import "unsafe"

// Go-typed callers of the exports, for cabi's tests and fuzz targets (test
// files cannot use cgo). Each copies its inputs into C memory exactly as a C
// caller would pass them, calls the export, and converts and frees every
// returned string. They are unexported and unused by the library itself, so
// the linker drops them from libkvcrouter.so.
//
// A buffer argument of nil is passed as a NULL pointer; otherwise the export
// receives a C copy of it together with the declared length n, which the
// caller keeps <= len(buf) unless n is negative or above every limit (the
// exports reject those before reading, which is what is being tested).

// abiResult is one export's status code and messages.
type abiResult struct {
	Code int32
	Err  string
	Out  string // out_json / out_server / out_decision, when the call has one
}

func cBuf(b []byte) unsafe.Pointer {
	if b == nil {
		return nil
	}
	p := C.malloc(C.size_t(len(b) + 1))
	if len(b) > 0 {
		copy(unsafe.Slice((*byte)(p), len(b)), b)
	}
	*(*byte)(unsafe.Add(p, len(b))) = 0
	return p
}

func takeC(p *C.char) string {
	if p == nil {
		return ""
	}
	s := C.GoString(p)
	C.free(unsafe.Pointer(p))
	return s
}

func freeC(p unsafe.Pointer) {
	if p != nil {
		C.free(p)
	}
}

func abiNew(cfg []byte, n int64, nullOut bool) (uint64, abiResult) {
	p := cBuf(cfg)
	defer freeC(p)
	var h C.uint64_t
	var e *C.char
	out := &h
	if nullOut {
		out = nil
	}
	code := kvr_router_new((*C.char)(p), C.int64_t(n), out, &e)
	return uint64(h), abiResult{Code: int32(code), Err: takeC(e)}
}

func abiClose(h uint64) abiResult {
	var e *C.char
	code := kvr_router_close(C.uint64_t(h), &e)
	return abiResult{Code: int32(code), Err: takeC(e)}
}

func abiAcquire(h uint64, id []byte, idLen int64, toks []int32, nTok, pin int64, lora []byte, loraLen, known int64) (int32, abiResult) {
	pid, plora := cBuf(id), cBuf(lora)
	defer freeC(pid)
	defer freeC(plora)
	var ptok unsafe.Pointer
	if toks != nil {
		ptok = C.malloc(C.size_t(4*len(toks) + 4))
		copy(unsafe.Slice((*int32)(ptok), len(toks)), toks)
		defer C.free(ptok)
	}
	var (
		idx       C.int32_t
		gen       C.int64_t
		srv, d, e *C.char
	)
	code := kvr_acquire(C.uint64_t(h), (*C.char)(pid), C.int64_t(idLen), (*C.int32_t)(ptok), C.int64_t(nTok), C.int64_t(pin),
		(*C.char)(plora), C.int64_t(loraLen), C.int64_t(known), &idx, &gen, &srv, &d, &e)
	_ = takeC(srv)
	return int32(idx), abiResult{Code: int32(code), Err: takeC(e), Out: takeC(d)}
}

// abiString calls an export of the shape f(h, ptr, len, ..., err).
func abiString(h uint64, which string, s []byte, n int64, extra []byte, extraLen int64, flavor int32) abiResult {
	p, px := cBuf(s), cBuf(extra)
	defer freeC(p)
	defer freeC(px)
	var (
		e    *C.char
		code C.int32_t
		rel  C.int32_t
		gen  C.int64_t
		cnt  C.int64_t
	)
	hh, cp, cn := C.uint64_t(h), (*C.char)(p), C.int64_t(n)
	switch which {
	case "release":
		code = kvr_release(hh, cp, cn, &rel, &e)
	case "add":
		code = kvr_add_servers(hh, cp, cn, &gen, &e)
	case "remove":
		code = kvr_remove_servers(hh, cp, cn, &gen, &e)
	case "inflight":
		code = kvr_inflight(hh, cp, cn, &cnt, &e)
	case "metrics":
		code = kvr_update_metrics(hh, cp, cn, (*C.char)(px), C.int64_t(extraLen), C.int32_t(flavor), &e)
	case "events":
		code = kvr_update_events(hh, cp, cn, px, C.int64_t(extraLen), &e)
	case "endpoints":
		code = kvr_set_kv_endpoints(hh, cp, cn, (*C.char)(px), C.int64_t(extraLen), &e)
	default:
		panic("abiString: unknown export " + which)
	}
	return abiResult{Code: int32(code), Err: takeC(e)}
}

// abiPlain calls the exports that take only a handle and outputs; nullOut
// passes NULL for every output pointer.
func abiPlain(h uint64, which string, nullOut bool) abiResult {
	var (
		e, js *C.char
		code  C.int32_t
		gen   C.int64_t
		n     C.int64_t
	)
	pjs, pgen, pn := &js, &gen, &n
	if nullOut {
		pjs, pgen, pn = nil, nil, nil
	}
	hh := C.uint64_t(h)
	switch which {
	case "servers":
		code = kvr_servers(hh, pjs, pgen, &e)
	case "total":
		code = kvr_total_inflight(hh, pn, &e)
	case "status":
		code = kvr_status(hh, pjs, &e)
	case "clear_sticky":
		code = kvr_clear_sticky(hh, pjs, &e)
	case "reset":
		code = kvr_reset_cache(hh, &e)
	default:
		panic("abiPlain: unknown export " + which)
	}
	return abiResult{Code: int32(code), Err: takeC(e), Out: takeC(js)}
}

func abiValidate(cfg []byte, n int64, nullOut bool) abiResult {
	p := cBuf(cfg)
	defer freeC(p)
	var e, js *C.char
	out := &js
	if nullOut {
		out = nil
	}
	code := kvr_validate_config((*C.char)(p), C.int64_t(n), out, &e)
	return abiResult{Code: int32(code), Err: takeC(e), Out: takeC(js)}
}

// abiAcquireServer routes request id and returns the out_server string
// (known generation -1, so it is always written) with its byte length as
// C sees it (strlen).
func abiAcquireServer(h uint64, id string) (string, int, abiResult) {
	pid := cBuf([]byte(id))
	defer freeC(pid)
	var (
		idx    C.int32_t
		gen    C.int64_t
		srv, e *C.char
	)
	code := kvr_acquire(C.uint64_t(h), (*C.char)(pid), C.int64_t(len(id)), nil, 0, -1, nil, 0, -1, &idx, &gen, &srv, nil, &e)
	n := 0
	if srv != nil {
		n = int(C.strlen(srv))
	}
	return takeC(srv), n, abiResult{Code: int32(code), Err: takeC(e)}
}

// abiAcquireFull routes request id knowing generation known; it returns
// the index, generation and out_server ("" when not written).
func abiAcquireFull(h uint64, id string, known int64) (int32, int64, string, abiResult) {
	pid := cBuf([]byte(id))
	defer freeC(pid)
	var (
		idx    C.int32_t
		gen    C.int64_t
		srv, e *C.char
	)
	code := kvr_acquire(C.uint64_t(h), (*C.char)(pid), C.int64_t(len(id)), nil, 0, -1, nil, 0, C.int64_t(known), &idx, &gen, &srv, nil, &e)
	return int32(idx), int64(gen), takeC(srv), abiResult{Code: int32(code), Err: takeC(e)}
}
