package main

/*
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// kvr_acquire_opts as kvcrouter.h defines it (cgo cannot include the header
// itself: its prototypes would clash with cgo's own for the exports).
// tests/test_cabi_c.py compiles a C caller against the header and
// TestAcquireOptsLayout checks this copy field by field.
typedef struct kvr_acquire_opts {
	uint64_t size;
	const char *request_id;
	int64_t request_id_len;
	const int32_t *tokens;
	int64_t n_tokens;
	int64_t pin;
	const char *lora;
	int64_t lora_len;
	int64_t known_generation;
	uint64_t ticket;
	int64_t submit;
} kvr_acquire_opts;
*/
import "C"

import (
	"runtime"
	"unsafe"

	"github.com/kvc-router/kvc-router/core/kvcrouter"
)

// The ABI is versioned major.minor (kvcrouter.h): a caller built for major M
// minor m works with a library of major M and minor >= m. A minor adds
// exports, fields at the end of kvr_acquire_opts, or keys in JSON outputs;
// anything else is a new major.
const (
	abiVersion = 1 // the major version (KVR_ABI_VERSION)
	abiMinor   = 5 // KVR_ABI_MINOR
)

// buildVersion is the library's build version, set by cabi/build.sh with
// -ldflags -X (the package version and the git commit it was built from).
var buildVersion = "dev"

// versionDoc is the JSON written by kvr_version.
type versionDoc struct {
	Version    string `json:"version"`
	ABIVersion int    `json:"abi_version"`
	ABIMinor   int    `json:"abi_minor"`
	GoVersion  string `json:"go_version"`
}

//export kvr_abi_minor
func kvr_abi_minor() C.int32_t { return abiMinor }

//export kvr_version
func kvr_version(outJSON **C.char, errOut **C.char) (code C.int32_t) {
	defer recoverExport("kvr_version", 0, &code, errOut)
	clearOut(errOut)
	clearOut(outJSON)
	if outJSON == nil {
		return fail(errOut, errf(codeInvalidArgument, "out_json is NULL"))
	}
	return result(errOut, cJSON(outJSON, versionDoc{
		Version: buildVersion, ABIVersion: abiVersion, ABIMinor: abiMinor, GoVersion: runtime.Version(),
	}))
}

//export kvr_config_schema
func kvr_config_schema(outJSON **C.char, errOut **C.char) (code C.int32_t) {
	defer recoverExport("kvr_config_schema", 0, &code, errOut)
	clearOut(errOut)
	clearOut(outJSON)
	if outJSON == nil {
		return fail(errOut, errf(codeInvalidArgument, "out_json is NULL"))
	}
	s, err := kvcrouter.ConfigSchema()
	if err != nil {
		return fail(errOut, err)
	}
	return result(errOut, cJSON(outJSON, s))
}

// acquireOptsMin is the smallest size a caller may declare: every field up
// to n_tokens (the first version's required fields).
const acquireOptsMin = C.size_t(unsafe.Offsetof(C.kvr_acquire_opts{}.pin))

// acquireOptsSizes are the sizes of every published kvr_acquire_opts
// layout: ABI 1.0 (up to n_tokens), 1.1 (up to known_generation), 1.2+
// (up to submit).
var acquireOptsSizes = []uint64{40, 72, 88}

// maxNewerOptsBytes bounds the fields a newer caller may add beyond the
// layout this library knows (16 eight-byte fields), all of which must be 0.
const maxNewerOptsBytes = 128

// acquireOptsSizeOK: one of the known layouts, or a newer caller's larger
// struct (whole 8-byte fields, bounded).
func acquireOptsSizeOK(size, known uint64) bool {
	for _, k := range acquireOptsSizes {
		if size == k {
			return true
		}
	}
	return size > known && size <= known+maxNewerOptsBytes && size%8 == 0
}

//export kvr_acquire_with
func kvr_acquire_with(h C.uint64_t, opts *C.kvr_acquire_opts,
	outIndex *C.int32_t, outGen *C.int64_t, outServer **C.char, outDecision **C.char, errOut **C.char,
) (code C.int32_t) {
	defer recoverExport("kvr_acquire_with", h, &code, errOut)
	clearOut(errOut)
	clearOut(outServer)
	clearOut(outDecision)
	if outIndex != nil {
		*outIndex = -1
	}
	if opts == nil {
		return fail(errOut, errf(codeInvalidArgument, "opts is NULL"))
	}
	// Fields beyond the caller's size keep these defaults.
	o := C.kvr_acquire_opts{pin: -1, known_generation: -1}
	size := opts.size
	known := C.uint64_t(unsafe.Sizeof(o))
	switch {
	case size < C.uint64_t(acquireOptsMin):
		return fail(errOut, errf(codeInvalidArgument, "opts.size is %d, smaller than the first kvr_acquire_opts (%d bytes)", uint64(size), uint64(acquireOptsMin)))
	case !acquireOptsSizeOK(uint64(size), uint64(known)):
		// Read no byte the caller did not declare, and half-copy no
		// field: a size between the known layouts is a caller's bug,
		// and a huge one would read past its struct (up to a guard page).
		return fail(errOut, errf(codeInvalidArgument, "opts.size is %d, not a kvr_acquire_opts size (this library knows %v bytes; a newer caller's "+
			"size is a multiple of 8 up to %d)", uint64(size), acquireOptsSizes, uint64(known)+maxNewerOptsBytes))
	case size > known:
		// A newer caller's fields: safe to ignore only while they hold
		// their zero value (a field's zero must mean "not used").
		extra := unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(opts), known)), int(size-known))
		for i, b := range extra {
			if b != 0 {
				return fail(errOut, errf(codeInvalidArgument,
					"kvr_acquire_opts byte %d is set but this library (ABI %d.%d) knows only the first %d bytes; use a newer library",
					int(known)+i, abiVersion, abiMinor, uint64(known)))
			}
		}
		size = known
	}
	C.memcpy(unsafe.Pointer(&o), unsafe.Pointer(opts), C.size_t(size))
	var sub *submission
	switch o.submit {
	case 0:
	case 1:
		sub = &submission{ticket: uint64(o.ticket)}
	default:
		return fail(errOut, errf(codeInvalidArgument, "opts.submit must be 0 or 1, got %d", int64(o.submit)))
	}
	return acquire(h, o.request_id, o.request_id_len, o.tokens, o.n_tokens, o.pin, o.lora, o.lora_len,
		o.known_generation, sub, outIndex, outGen, outServer, outDecision, errOut)
}

// abiAcquireWith calls kvr_acquire_with as a C caller would (for tests; see
// abicall.go): the struct in C memory with the given declared size, tail
// bytes after the fields this library knows. nilOpts passes NULL.
func abiAcquireWith(h uint64, id string, toks []int32, pin, known int64, size uint64, tail []byte, nilOpts bool) (int32, string, abiResult) {
	return abiSubmit(h, id, toks, pin, known, size, tail, nilOpts, 0, 0)
}

// abiSubmit is abiAcquireWith with the ABI 1.2 fields ticket and submit.
func abiSubmit(h uint64, id string, toks []int32, pin, known int64, size uint64, tail []byte, nilOpts bool, ticket uint64, submit int64) (int32, string, abiResult) {
	n := int(unsafe.Sizeof(C.kvr_acquire_opts{})) + len(tail)
	mem := C.calloc(C.size_t(n), 1)
	defer C.free(mem)
	opts := (*C.kvr_acquire_opts)(mem)
	pid, ptok := cBuf([]byte(id)), C.malloc(C.size_t(4*len(toks)+4))
	defer freeC(pid)
	defer C.free(ptok)
	copy(unsafe.Slice((*int32)(ptok), len(toks)), toks)
	opts.size = C.uint64_t(size)
	opts.request_id, opts.request_id_len = (*C.char)(pid), C.int64_t(len(id))
	opts.tokens, opts.n_tokens = (*C.int32_t)(ptok), C.int64_t(len(toks))
	opts.pin, opts.known_generation = C.int64_t(pin), C.int64_t(known)
	opts.ticket, opts.submit = C.uint64_t(ticket), C.int64_t(submit)
	copy(unsafe.Slice((*byte)(unsafe.Add(mem, unsafe.Sizeof(C.kvr_acquire_opts{}))), len(tail)), tail)
	if nilOpts {
		opts = nil
	}
	var (
		idx       C.int32_t
		gen       C.int64_t
		srv, d, e *C.char
	)
	code := kvr_acquire_with(C.uint64_t(h), opts, &idx, &gen, &srv, &d, &e)
	return int32(idx), takeC(srv), abiResult{Code: int32(code), Err: takeC(e), Out: takeC(d)}
}

// abiVersionJSON calls kvr_version, or kvr_config_schema with schema.
func abiVersionJSON(schema bool) abiResult {
	var out, e *C.char
	var code C.int32_t
	if schema {
		code = kvr_config_schema(&out, &e)
	} else {
		code = kvr_version(&out, &e)
	}
	return abiResult{Code: int32(code), Err: takeC(e), Out: takeC(out)}
}

// acquireOptsLayout is the struct's size and field offsets, for the layout
// test against the header.
func acquireOptsLayout() (size uintptr, offsets []uintptr) {
	var o C.kvr_acquire_opts
	return unsafe.Sizeof(o), []uintptr{
		unsafe.Offsetof(o.size), unsafe.Offsetof(o.request_id), unsafe.Offsetof(o.request_id_len),
		unsafe.Offsetof(o.tokens), unsafe.Offsetof(o.n_tokens), unsafe.Offsetof(o.pin), unsafe.Offsetof(o.lora),
		unsafe.Offsetof(o.lora_len), unsafe.Offsetof(o.known_generation), unsafe.Offsetof(o.ticket),
		unsafe.Offsetof(o.submit),
	}
}
