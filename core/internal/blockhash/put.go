package blockhash

import (
	"encoding/binary"
	"unsafe"
)

// littleEndian is true on hosts whose int32 memory layout is already the
// key's little-endian byte order, so tokens can be copied as bytes.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// putTokens writes tokens into b as 4-byte little-endian integers.
func putTokens(b []byte, tokens []int32) {
	if littleEndian && len(tokens) > 0 {
		copy(b, unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), 4*len(tokens)))
		return
	}
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(t))
	}
}
