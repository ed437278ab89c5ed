package router

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxServerIDBytes bounds a server id (a host:port is ~20 bytes).
const MaxServerIDBytes = 64 << 10

// ErrBadServerID is wrapped by every CheckServerID error.
var ErrBadServerID = errors.New("invalid server id")

// CheckServerID reports why id cannot name a server, or nil. The rules hold
// at every boundary (the C ABI, the Python package, AddServers):
//   - not empty, at most MaxServerIDBytes bytes;
//   - valid UTF-8: an invalid id would be rewritten to U+FFFD on the way
//     through JSON, so two ids would merge and a release would miss;
//   - no NUL byte: the C ABI returns ids as NUL-terminated strings, which
//     would truncate one.
func CheckServerID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: empty", ErrBadServerID)
	case len(id) > MaxServerIDBytes:
		return fmt.Errorf("%w: %d bytes, more than the limit of %d", ErrBadServerID, len(id), MaxServerIDBytes)
	case !utf8.ValidString(id):
		return fmt.Errorf("%w: not valid UTF-8 (first bad byte at offset %d)", ErrBadServerID, firstInvalid(id))
	}
	if i := strings.IndexByte(id, 0); i >= 0 {
		return fmt.Errorf("%w: contains a NUL byte at offset %d", ErrBadServerID, i)
	}
	return nil
}

func firstInvalid(s string) int {
	for i, r := range s {
		if r == utf8.RuneError {
			if _, n := utf8.DecodeRuneInString(s[i:]); n <= 1 {
				return i
			}
		}
	}
	return -1
}
