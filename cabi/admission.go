package main

/*
#include <stdint.h>
#include <stdlib.h>
*/
import "C"

import (
	"github.com/kvc-router/kvc-router/core/kvcrouter"
)

// Router-side admission (ABI 1.2). kvr_acquire_with with submit set may
// answer KVR_HELD: the request waits in the router under the caller's
// ticket until a release (kvr_release_admit) or a pump (kvr_pump) gives it
// a slot, and those calls return it as admitted. kvr_cancel drops a held
// request whose caller gave up.

// admittedDoc is one admitted request as kvr_release_admit and kvr_pump
// report it: the server as kvr_acquire names it (index into the pool of
// generation Generation) plus the id, which is always present because the
// caller did not route this request itself.
type admittedDoc struct {
	Ticket     uint64 `json:"ticket"`
	Index      int32  `json:"index"`
	Generation int64  `json:"generation"`
	Server     string `json:"server"`
	// Error and Code are set (index -1, no server) for a held request that
	// failed instead of being admitted (the pool stayed empty).
	Error string `json:"error,omitempty"`
	Code  int32  `json:"code,omitempty"`
}

// writeAdmitted stores the admitted list as JSON in *out; nothing (NULL)
// when the list is empty, so the common release allocates no string.
// Callers hold inst.mu (read).
func writeAdmitted(inst *instance, out **C.char, admitted []kvcrouter.Admitted) error {
	if len(admitted) == 0 {
		return nil
	}
	docs := make([]admittedDoc, len(admitted))
	for i, a := range admitted {
		if a.Err != nil {
			docs[i] = admittedDoc{Ticket: a.Ticket, Index: -1, Generation: inst.gen, Error: a.Err.Error(), Code: codeOf(a.Err)}
			continue
		}
		docs[i] = admittedDoc{Ticket: a.Ticket, Index: inst.index(a.Decision.Server), Generation: inst.gen,
			Server: a.Decision.Server}
	}
	return cJSON(out, docs)
}

//export kvr_release_admit
func kvr_release_admit(h C.uint64_t, server *C.char, serverLen C.int64_t, outReleased *C.int32_t,
	outAdmitted **C.char, errOut **C.char,
) (code C.int32_t) {
	defer recoverExport("kvr_release_admit", h, &code, errOut)
	if err := releaseOuts(outReleased, outAdmitted, errOut); err != nil {
		return fail(errOut, err)
	}
	return releaseInto(h, server, serverLen, outReleased, outAdmitted, errOut,
		func(inst *instance, id string) ([]kvcrouter.Admitted, bool) { return inst.lib.ReleaseAdmit(id, nil) })
}

// maxOutputTokens bounds kvr_release_done's count: more than any context
// a served model has, so a larger value is a caller's bug, not a length.
const maxOutputTokens = 1 << 24

//export kvr_release_done
func kvr_release_done(h C.uint64_t, server *C.char, serverLen C.int64_t, reqID *C.char, reqIDLen C.int64_t,
	outputTokens C.int64_t, outReleased *C.int32_t, outAdmitted **C.char, errOut **C.char,
) (code C.int32_t) {
	defer recoverExport("kvr_release_done", h, &code, errOut)
	if err := releaseOuts(outReleased, outAdmitted, errOut); err != nil {
		return fail(errOut, err)
	}
	if outputTokens < 0 || outputTokens > maxOutputTokens {
		return fail(errOut, errf(codeInvalidArgument, "output_tokens must be in [0, %d], got %d", maxOutputTokens, int64(outputTokens)))
	}
	rid, err := goString(reqID, reqIDLen, "request_id", maxIDBytes)
	if err != nil {
		return fail(errOut, err)
	}
	return releaseInto(h, server, serverLen, outReleased, outAdmitted, errOut,
		func(inst *instance, id string) ([]kvcrouter.Admitted, bool) {
			return inst.lib.ReleaseDone(id, rid, int(outputTokens), nil)
		})
}

// releaseOuts resets the outputs of the admitting releases; out_admitted
// is required: what a release admits is counted in flight, and
// unreported nobody could release it.
func releaseOuts(outReleased *C.int32_t, outAdmitted **C.char, errOut **C.char) error {
	clearOut(errOut)
	clearOut(outAdmitted)
	if outReleased != nil {
		*outReleased = 0
	}
	if outAdmitted == nil {
		return errf(codeInvalidArgument, "out_admitted is NULL")
	}
	return nil
}

// releaseInto looks the server up and releases on it with release,
// reporting what was admitted (the admitting releases after their own
// argument checks).
func releaseInto(h C.uint64_t, server *C.char, serverLen C.int64_t, outReleased *C.int32_t, outAdmitted **C.char,
	errOut **C.char, release func(inst *instance, id string) ([]kvcrouter.Admitted, bool),
) C.int32_t {
	id, valid, err := lookupID(server, serverLen)
	if err != nil {
		return fail(errOut, err)
	}
	return result(errOut, reader(h, func(inst *instance) error {
		if !valid {
			inst.ignoredIDs.Add(1) // as kvr_release: no pool member has it
			return nil
		}
		admitted, ok := release(inst, id)
		if outReleased != nil && ok {
			*outReleased = 1
		}
		return writeAdmitted(inst, outAdmitted, admitted)
	}))
}

//export kvr_pump
func kvr_pump(h C.uint64_t, outAdmitted **C.char, errOut **C.char) (code C.int32_t) {
	defer recoverExport("kvr_pump", h, &code, errOut)
	clearOut(errOut)
	clearOut(outAdmitted)
	if outAdmitted == nil {
		return fail(errOut, errf(codeInvalidArgument, "out_admitted is NULL"))
	}
	return result(errOut, reader(h, func(inst *instance) error {
		return writeAdmitted(inst, outAdmitted, inst.lib.Pump(nil))
	}))
}

//export kvr_cancel
func kvr_cancel(h C.uint64_t, ticket C.uint64_t, outCancelled *C.int32_t, errOut **C.char) (code C.int32_t) {
	defer recoverExport("kvr_cancel", h, &code, errOut)
	clearOut(errOut)
	if outCancelled != nil {
		*outCancelled = 0
	}
	return result(errOut, reader(h, func(inst *instance) error {
		if inst.lib.Cancel(uint64(ticket)) && outCancelled != nil {
			*outCancelled = 1
		}
		return nil
	}))
}

// Go-typed callers for cabi's tests (see abicall.go).

// abiReleaseAdmit calls kvr_release_admit; nullOut passes NULL out_admitted.
func abiReleaseAdmit(h uint64, server string, nullOut bool) (released int32, res abiResult) {
	p := cBuf([]byte(server))
	defer freeC(p)
	var (
		rel    C.int32_t
		js, e  *C.char
		outArg = &js
	)
	if nullOut {
		outArg = nil
	}
	code := kvr_release_admit(C.uint64_t(h), (*C.char)(p), C.int64_t(len(server)), &rel, outArg, &e)
	return int32(rel), abiResult{Code: int32(code), Err: takeC(e), Out: takeC(js)}
}

// abiReleaseDone calls kvr_release_done (out_admitted always given).
func abiReleaseDone(h uint64, server, reqID []byte, ridLen, outputTokens int64) (released int32, res abiResult) {
	p, pr := cBuf(server), cBuf(reqID)
	defer freeC(p)
	defer freeC(pr)
	var (
		rel   C.int32_t
		js, e *C.char
	)
	code := kvr_release_done(C.uint64_t(h), (*C.char)(p), C.int64_t(len(server)), (*C.char)(pr), C.int64_t(ridLen),
		C.int64_t(outputTokens), &rel, &js, &e)
	return int32(rel), abiResult{Code: int32(code), Err: takeC(e), Out: takeC(js)}
}

// abiPump calls kvr_pump; nullOut passes NULL out_admitted.
func abiPump(h uint64, nullOut bool) abiResult {
	var js, e *C.char
	outArg := &js
	if nullOut {
		outArg = nil
	}
	code := kvr_pump(C.uint64_t(h), outArg, &e)
	return abiResult{Code: int32(code), Err: takeC(e), Out: takeC(js)}
}

// abiCancel calls kvr_cancel.
func abiCancel(h uint64, ticket uint64) (cancelled int32, res abiResult) {
	var (
		c C.int32_t
		e *C.char
	)
	code := kvr_cancel(C.uint64_t(h), C.uint64_t(ticket), &c, &e)
	return int32(c), abiResult{Code: int32(code), Err: takeC(e)}
}
