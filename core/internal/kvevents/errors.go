package kvevents

import (
	"errors"
	"fmt"
)

// ErrMalformed is wrapped by every error Decode returns for a payload it
// cannot accept: wrong msgpack types, truncated input, trailing bytes,
// violated invariants, and payloads beyond the configured Limits.
var ErrMalformed = errors.New("kvevents: malformed batch")

// ErrLimit is additionally wrapped (next to ErrMalformed) when a payload is
// rejected only because it exceeds a Limits bound, so callers can tell a
// hostile or oversized batch from a garbled one.
var ErrLimit = errors.New("kvevents: batch exceeds decode limits")

// DecodeError describes why and where a payload was rejected.
// errors.Is(err, ErrMalformed) holds for every DecodeError.
type DecodeError struct {
	// Offset is the byte offset in the payload at which the problem was found.
	Offset int
	// Path locates the value, e.g. "events[3].token_ids[5]"; "" for the batch.
	Path string
	// Reason says what was wrong.
	Reason string
	// Limit is true when a Limits bound was exceeded (errors.Is(err, ErrLimit)).
	Limit bool

	tokenCount bool // BlockStored's token_ids / block_hashes invariant
}

func (e *DecodeError) Error() string {
	where := e.Path
	if where == "" {
		where = "batch"
	}
	return fmt.Sprintf("kvevents: malformed batch: %s at byte %d: %s", where, e.Offset, e.Reason)
}

// Unwrap reports ErrMalformed, plus ErrLimit for limit violations.
func (e *DecodeError) Unwrap() []error {
	if e.Limit {
		return []error{ErrMalformed, ErrLimit}
	}
	return []error{ErrMalformed}
}
