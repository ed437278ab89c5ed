package main

/*
#include <stdint.h>
*/
import "C"

import (
	"github.com/kvc-router/kvc-router/core/kvcrouter"
	"strconv"
	"unicode/utf8"
	"unsafe"

	json "github.com/goccy/go-json"
)

// Server ids are checked once, here at the boundary, with
// kvcrouter.CheckServerID: valid UTF-8, no NUL, at most maxIDBytes. Ids
// accepted into the pool therefore come back out of kvr_acquire's
// NUL-terminated out_server unchanged.

// serverID copies and checks a borrowed server id naming a server to act on.
func serverID(p *C.char, n C.int64_t) (string, error) {
	s, err := goString(p, n, "server_id", maxIDBytes)
	if err != nil {
		return "", err
	}
	if err := kvcrouter.CheckServerID(s); err != nil {
		return "", errf(codeInvalidArgument, "server_id: %v", err)
	}
	return s, nil
}

// lookupID copies a borrowed id that only looks a pool member up (release,
// in-flight count). An id no pool member can have (over the length limit,
// invalid UTF-8, NUL, empty) is an unknown id, which those calls document
// as a no-op: valid is false and nothing is read past the limit. Only a
// malformed argument (negative length, NULL with a length) is an error.
func lookupID(p *C.char, n C.int64_t) (id string, valid bool, err error) {
	switch {
	case n < 0:
		return "", false, errf(codeInvalidArgument, "server_id length is negative (%d)", int64(n))
	case n > 0 && p == nil:
		return "", false, errf(codeInvalidArgument, "server_id is NULL with length %d", int64(n))
	case int64(n) > maxIDBytes || n == 0:
		return "", false, nil
	}
	s := C.GoStringN(p, C.int(n))
	if kvcrouter.CheckServerID(s) != nil {
		return "", false, nil
	}
	return s, true, nil
}

// parseIDs decodes a JSON array of server ids (kvr_add_servers,
// kvr_remove_servers) and checks each.
func parseIDs(p *C.char, n C.int64_t) ([]string, error) {
	data, err := goBytes(unsafe.Pointer(p), n, "server id list JSON", maxJSONBytes)
	if err != nil {
		return nil, err
	}
	// The decoder would turn invalid UTF-8 and escaped lone surrogates
	// into U+FFFD, silently renaming the server: refuse them first.
	if err := checkJSONText(data); err != nil {
		return nil, errf(codeInvalidArgument, "server id list JSON: %v", err)
	}
	var ids []string
	if err := json.Unmarshal(data, &ids); err != nil {
		return nil, errf(codeInvalidArgument, "server id list must be a JSON array of strings: %v", err)
	}
	for i, id := range ids {
		if err := kvcrouter.CheckServerID(id); err != nil {
			return nil, errf(codeInvalidArgument, "server id %d: %v", i, err)
		}
	}
	return ids, nil
}

// jsonError is a checkJSONText finding.
type jsonError struct {
	off int
	msg string
}

func (e *jsonError) Error() string { return e.msg + " at byte " + strconv.Itoa(e.off) }

// checkJSONText reports invalid UTF-8 and \u escapes of unpaired UTF-16
// surrogates in JSON text (what a decoder would replace with U+FFFD).
func checkJSONText(data []byte) error {
	if !utf8.Valid(data) {
		for i := 0; i < len(data); {
			r, size := utf8.DecodeRune(data[i:])
			if r == utf8.RuneError && size <= 1 {
				return &jsonError{i, "invalid UTF-8"}
			}
			i += size
		}
	}
	inString := false
	for i := 0; i < len(data); i++ {
		c := data[i]
		switch {
		case c == '"':
			inString = !inString
		case c == '\\' && inString && i+1 < len(data):
			if data[i+1] != 'u' {
				i++ // \" \\ \n ...
				continue
			}
			u, ok := hex4(data, i+2)
			switch {
			case !ok:
				i++ // malformed: the decoder reports it
			case u >= 0xD800 && u <= 0xDBFF:
				if lo, ok := hex4(data, i+8); !ok || data[i+6] != '\\' || data[i+7] != 'u' || lo < 0xDC00 || lo > 0xDFFF {
					return &jsonError{i, "unpaired UTF-16 surrogate escape \\u" + string(data[i+2:i+6])}
				}
				i += 11
			case u >= 0xDC00 && u <= 0xDFFF:
				return &jsonError{i, "unpaired UTF-16 surrogate escape \\u" + string(data[i+2:i+6])}
			default:
				i += 5
			}
		}
	}
	return nil
}

// hex4 reads 4 hex digits at data[i:].
func hex4(data []byte, i int) (rune, bool) {
	if i < 0 || i+4 > len(data) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(data[i:i+4]), 16, 32)
	return rune(v), err == nil
}
