package kvevents

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
)

// This file holds a minimal, allocation-free msgpack reader over a byte slice.
// It exists instead of msgpack.Decoder because the decoder must (a) check
// every declared length against the bytes that remain before allocating,
// (b) skip unknown values of any nesting depth without recursion, and
// (c) report byte offsets in errors; it is also several times faster than an
// io.Reader-based decoder on the token-id hot loop.

// dec is the decoding state for one payload.
type dec struct {
	b   []byte
	off int
	lim Limits

	// Error context, formatted only when an error is built.
	ev    int    // event index, -1 at batch level
	field string // field name, "" when none
	idx   int    // element index inside field, -1 when none
}

func (d *dec) path() string {
	p := ""
	if d.ev >= 0 {
		p = "events[" + strconv.Itoa(d.ev) + "]"
	}
	if d.field != "" {
		if p != "" {
			p += "."
		}
		p += d.field
	}
	if d.idx >= 0 {
		p += "[" + strconv.Itoa(d.idx) + "]"
	}
	return p
}

func (d *dec) errf(format string, args ...any) error {
	return &DecodeError{Offset: d.off, Path: d.path(), Reason: fmt.Sprintf(format, args...)}
}

func (d *dec) limitf(format string, args ...any) error {
	return &DecodeError{Offset: d.off, Path: d.path(), Reason: fmt.Sprintf(format, args...), Limit: true}
}

func (d *dec) truncated(need int) error {
	return d.errf("truncated input: need %d more bytes, %d left", need, len(d.b)-d.off)
}

// remaining is the number of unread bytes.
func (d *dec) remaining() int { return len(d.b) - d.off }

// peek returns the next type code without consuming it.
func (d *dec) peek() (byte, error) {
	if d.off >= len(d.b) {
		return 0, d.errf("truncated input: expected a value, got end of payload")
	}
	return d.b[d.off], nil
}

// isNil consumes a nil if one is next.
func (d *dec) isNil() bool {
	if d.off < len(d.b) && d.b[d.off] == 0xc0 {
		d.off++
		return true
	}
	return false
}

// kindName names the msgpack type of a code for error messages.
func kindName(c byte) string {
	switch {
	case c <= 0x7f || c >= 0xe0:
		return "int"
	case c <= 0x8f:
		return "map"
	case c <= 0x9f:
		return "array"
	case c <= 0xbf:
		return "str"
	}
	switch c {
	case 0xc0:
		return "nil"
	case 0xc1:
		return "invalid code 0xc1"
	case 0xc2, 0xc3:
		return "bool"
	case 0xc4, 0xc5, 0xc6:
		return "bin"
	case 0xc7, 0xc8, 0xc9, 0xd4, 0xd5, 0xd6, 0xd7, 0xd8:
		return "ext"
	case 0xca, 0xcb:
		return "float"
	case 0xcc, 0xcd, 0xce, 0xcf, 0xd0, 0xd1, 0xd2, 0xd3:
		return "int"
	case 0xd9, 0xda, 0xdb:
		return "str"
	case 0xdc, 0xdd:
		return "array"
	case 0xde, 0xdf:
		return "map"
	}
	return "invalid"
}

// need checks that n more bytes are available.
func (d *dec) need(n int) error {
	if n > len(d.b)-d.off || n < 0 {
		return d.truncated(n)
	}
	return nil
}

// lenField reads a big-endian length of size 1, 2 or 4 bytes.
func (d *dec) lenField(size int) (int, error) {
	if err := d.need(size); err != nil {
		return 0, err
	}
	var n int
	switch size {
	case 1:
		n = int(d.b[d.off])
	case 2:
		n = int(binary.BigEndian.Uint16(d.b[d.off:]))
	default:
		n = int(binary.BigEndian.Uint32(d.b[d.off:]))
	}
	d.off += size
	return n, nil
}

// arrayLen reads an array header. The declared length is checked against the
// remaining bytes (every element takes at least one byte) before anything is
// allocated from it. what names the expected value in error messages.
func (d *dec) arrayLen(what string) (int, error) {
	return d.containerLen(what, "array", "elements", 0x90, 0xdc, 0xdd, 1)
}

// mapLen reads a map header, checking the declared length like arrayLen
// (every entry takes at least two bytes).
func (d *dec) mapLen(what string) (int, error) {
	return d.containerLen(what, "map", "entries", 0x80, 0xde, 0xdf, 2)
}

// containerLen reads a fix/16/32-bit container header whose fix form is
// fix..fix+15 and whose wider forms are code16 and code32.
func (d *dec) containerLen(what, kind, unit string, fix, code16, code32 byte, minBytes int) (int, error) {
	c, err := d.peek()
	if err != nil {
		return 0, err
	}
	var n int
	switch {
	case c >= fix && c <= fix|0x0f:
		d.off++
		n = int(c & 0x0f)
	case c == code16 || c == code32:
		d.off++
		size := 2
		if c == code32 {
			size = 4
		}
		if n, err = d.lenField(size); err != nil {
			return 0, err
		}
	default:
		return 0, d.errf("%s: want %s, got %s", what, kind, kindName(c))
	}
	if n > d.remaining()/minBytes {
		return 0, d.errf("truncated input: %s declares %d %s but only %d bytes remain", kind, n, unit, d.remaining())
	}
	return n, nil
}

// strBytes reads a str and returns its bytes (aliasing the payload).
func (d *dec) strBytes(what string) ([]byte, error) {
	c, err := d.peek()
	if err != nil {
		return nil, err
	}
	var n int
	switch {
	case c >= 0xa0 && c <= 0xbf:
		d.off++
		n = int(c & 0x1f)
	case c == 0xd9:
		d.off++
		n, err = d.lenField(1)
	case c == 0xda:
		d.off++
		n, err = d.lenField(2)
	case c == 0xdb:
		d.off++
		n, err = d.lenField(4)
	default:
		return nil, d.errf("%s: want str, got %s", what, kindName(c))
	}
	if err != nil {
		return nil, err
	}
	return d.take(n)
}

// take returns the next n bytes (aliasing the payload) and advances.
func (d *dec) take(n int) ([]byte, error) {
	if err := d.need(n); err != nil {
		return nil, err
	}
	s := d.b[d.off : d.off+n : d.off+n]
	d.off += n
	return s, nil
}

// binOrStr reads a bin or str and returns its bytes (aliasing the payload).
func (d *dec) binOrStr(what string) ([]byte, error) {
	c, err := d.peek()
	if err != nil {
		return nil, err
	}
	var n int
	switch c {
	case 0xc4:
		d.off++
		n, err = d.lenField(1)
	case 0xc5:
		d.off++
		n, err = d.lenField(2)
	case 0xc6:
		d.off++
		n, err = d.lenField(4)
	default:
		return d.strBytes(what)
	}
	if err != nil {
		return nil, err
	}
	return d.take(n)
}

// integer reads any msgpack integer. It returns the 64 raw bits and whether
// the value was encoded as a signed (possibly negative) integer; for a signed
// encoding the bits are the two's complement of the int64 value.
func (d *dec) integer(what string) (bits uint64, signed bool, err error) {
	if d.off >= len(d.b) {
		return 0, false, d.errf("truncated input: expected %s, got end of payload", what)
	}
	c := d.b[d.off]
	if c <= 0x7f {
		d.off++
		return uint64(c), false, nil
	}
	if c >= 0xe0 {
		d.off++
		return uint64(int64(int8(c))), true, nil
	}
	var size int
	switch c {
	case 0xcc, 0xd0:
		size = 1
	case 0xcd, 0xd1:
		size = 2
	case 0xce, 0xd2:
		size = 4
	case 0xcf, 0xd3:
		size = 8
	default:
		return 0, false, d.errf("%s: want int, got %s", what, kindName(c))
	}
	if size+1 > len(d.b)-d.off {
		return 0, false, d.truncated(size + 1)
	}
	p := d.b[d.off+1:]
	d.off += size + 1
	switch c {
	case 0xcc:
		return uint64(p[0]), false, nil
	case 0xcd:
		return uint64(binary.BigEndian.Uint16(p)), false, nil
	case 0xce:
		return uint64(binary.BigEndian.Uint32(p)), false, nil
	case 0xcf:
		return binary.BigEndian.Uint64(p), false, nil
	case 0xd0:
		return uint64(int64(int8(p[0]))), true, nil
	case 0xd1:
		return uint64(int64(int16(binary.BigEndian.Uint16(p)))), true, nil
	case 0xd2:
		return uint64(int64(int32(binary.BigEndian.Uint32(p)))), true, nil
	default: // 0xd3
		return binary.BigEndian.Uint64(p), true, nil
	}
}

// int64v reads an integer that must fit int64.
func (d *dec) int64v(what string) (int64, error) {
	start := d.off
	bits, signed, err := d.integer(what)
	if err != nil {
		return 0, err
	}
	if !signed && bits > math.MaxInt64 {
		d.off = start
		return 0, d.errf("%s: integer %d overflows int64", what, bits)
	}
	return int64(bits), nil
}

// float reads a float or integer as float64.
func (d *dec) float(what string) (float64, error) {
	c, err := d.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case 0xcb:
		if err := d.need(9); err != nil {
			return 0, err
		}
		v := math.Float64frombits(binary.BigEndian.Uint64(d.b[d.off+1:]))
		d.off += 9
		return v, nil
	case 0xca:
		if err := d.need(5); err != nil {
			return 0, err
		}
		v := math.Float32frombits(binary.BigEndian.Uint32(d.b[d.off+1:]))
		d.off += 5
		return float64(v), nil
	}
	if kindName(c) != "int" {
		return 0, d.errf("%s: want float or int, got %s", what, kindName(c))
	}
	bits, signed, err := d.integer(what)
	if err != nil {
		return 0, err
	}
	if signed {
		return float64(int64(bits)), nil
	}
	return float64(bits), nil
}

// hash reads a block hash: any integer (negative ones as two's complement)
// or a bin/str whose last 8 bytes are read big-endian (shorter values are
// left-padded with zeros).
func (d *dec) hash(what string) (uint64, error) {
	if d.off >= len(d.b) {
		return 0, d.errf("truncated input: expected %s, got end of payload", what)
	}
	c := d.b[d.off]
	if c == 0xcf && len(d.b)-d.off >= 9 { // the common uint64 case
		v := binary.BigEndian.Uint64(d.b[d.off+1:])
		d.off += 9
		return v, nil
	}
	switch kindName(c) {
	case "int":
		bits, _, err := d.integer(what)
		return bits, err
	case "bin", "str":
		p, err := d.binOrStr(what)
		if err != nil {
			return 0, err
		}
		return hashFromBytes(p), nil
	}
	return 0, d.errf("%s: want int, bytes or str hash, got %s", what, kindName(c))
}

// hashFromBytes takes the last 8 bytes of p big-endian, left-padding with zeros.
func hashFromBytes(p []byte) uint64 {
	if len(p) >= 8 {
		return binary.BigEndian.Uint64(p[len(p)-8:])
	}
	var v uint64
	for _, c := range p {
		v = v<<8 | uint64(c)
	}
	return v
}

// skip consumes one complete value of any type and nesting depth without
// recursion. Every container's declared size is checked against the bytes
// that remain, so the work is bounded by the payload length.
func (d *dec) skip() error {
	pending := 1
	for pending > 0 {
		pending--
		if d.off >= len(d.b) {
			return d.errf("truncated input: expected a value, got end of payload")
		}
		c := d.b[d.off]
		d.off++
		var data, add int // bytes to skip, values to add
		var err error
		switch {
		case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		case c <= 0x8f:
			add = 2 * int(c&0x0f)
		case c <= 0x9f:
			add = int(c & 0x0f)
		case c <= 0xbf:
			data = int(c & 0x1f)
		default:
			switch c {
			case 0xc1:
				d.off--
				return d.errf("invalid msgpack code 0xc1")
			case 0xc4, 0xd9:
				data, err = d.lenField(1)
			case 0xc5, 0xda:
				data, err = d.lenField(2)
			case 0xc6, 0xdb:
				data, err = d.lenField(4)
			case 0xc7:
				data, err = d.lenField(1)
				data++
			case 0xc8:
				data, err = d.lenField(2)
				data++
			case 0xc9:
				data, err = d.lenField(4)
				data++
			case 0xca:
				data = 4
			case 0xcb:
				data = 8
			case 0xcc, 0xd0:
				data = 1
			case 0xcd, 0xd1:
				data = 2
			case 0xce, 0xd2:
				data = 4
			case 0xcf, 0xd3:
				data = 8
			case 0xd4:
				data = 2
			case 0xd5:
				data = 3
			case 0xd6:
				data = 5
			case 0xd7:
				data = 9
			case 0xd8:
				data = 17
			case 0xdc:
				add, err = d.lenField(2)
			case 0xdd:
				add, err = d.lenField(4)
			case 0xde:
				add, err = d.lenField(2)
				add *= 2
			case 0xdf:
				add, err = d.lenField(4)
				add *= 2
			}
		}
		if err != nil {
			return err
		}
		if data > 0 {
			if err := d.need(data); err != nil {
				return err
			}
			d.off += data
		}
		pending += add
		if pending > d.remaining() {
			return d.errf("truncated input: %d values pending but only %d bytes remain", pending, d.remaining())
		}
	}
	return nil
}
