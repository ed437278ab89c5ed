package blockhash

import (
	"encoding/binary"
	"math/bits"
	"unsafe"
)

// xxhash64 (seed 0) constants.
const (
	prime1 uint64 = 11400714785074694791
	prime2 uint64 = 14029467366897019727
	prime3 uint64 = 1609587929392839161
	prime4 uint64 = 9650029242287828579
	prime5 uint64 = 2870177450012600261
)

func round(acc, input uint64) uint64 {
	acc += input * prime2
	acc = bits.RotateLeft64(acc, 31)
	return acc * prime1
}

// avalanche is xxhash64's final mix (small enough to inline).
func avalanche(h uint64) uint64 {
	h ^= h >> 33
	h *= prime2
	h ^= h >> 29
	h *= prime3
	return h ^ h>>32
}

func mergeRound(acc, val uint64) uint64 {
	acc ^= round(0, val)
	return acc*prime1 + prime4
}

// Chain returns the key of a block whose parent key is parent: xxhash64
// of (parent as 8 little-endian bytes ++ the block's tokens as 4-byte
// little-endian integers).
//
// On little-endian hosts it hashes the parent and the tokens in place,
// without first copying the two into one buffer: the copy and the call into
// the generic hasher cost as much as the hashing of a 72-byte block. It is
// the same function as xxhash.Sum64 over the concatenation (tested), so keys
// do not change. The hash is one function, not a wrapper around one, so a
// caller's per-block loop pays a single call.
func Chain(parent uint64, block []int32) uint64 {
	if !littleEndian {
		return chainPortable(parent, block)
	}
	if len(block) == DefaultBlockSize {
		var out [1]uint64
		return chain16(parent, tokenBytes(block), out[:])
	}
	tb := tokenBytes(block)
	n := uint64(8 + len(tb))
	var h uint64
	if n >= 32 {
		p1, p2 := prime1, prime2 // variables: the constant sums wrap
		v1 := p1 + p2
		v2 := p2
		v3 := uint64(0)
		v4 := -p1
		v1 = round(v1, parent)
		v2 = round(v2, binary.LittleEndian.Uint64(tb[0:8]))
		v3 = round(v3, binary.LittleEndian.Uint64(tb[8:16]))
		v4 = round(v4, binary.LittleEndian.Uint64(tb[16:24]))
		tb = tb[24:]
		for len(tb) >= 32 {
			v1 = round(v1, binary.LittleEndian.Uint64(tb[0:8]))
			v2 = round(v2, binary.LittleEndian.Uint64(tb[8:16]))
			v3 = round(v3, binary.LittleEndian.Uint64(tb[16:24]))
			v4 = round(v4, binary.LittleEndian.Uint64(tb[24:32]))
			tb = tb[32:]
		}
		h = bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) + bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
		h = mergeRound(h, v1)
		h = mergeRound(h, v2)
		h = mergeRound(h, v3)
		h = mergeRound(h, v4)
		h += n
	} else {
		h = prime5 + n
		h ^= round(0, parent)
		h = bits.RotateLeft64(h, 27)*prime1 + prime4
	}
	for ; len(tb) >= 8; tb = tb[8:] {
		h ^= round(0, binary.LittleEndian.Uint64(tb[:8]))
		h = bits.RotateLeft64(h, 27)*prime1 + prime4
	}
	if len(tb) >= 4 {
		h ^= uint64(binary.LittleEndian.Uint32(tb[:4])) * prime1
		h = bits.RotateLeft64(h, 23)*prime2 + prime3
	}
	return avalanche(h)
}

// chain16 chains len(out) 16-token blocks from parent: out[i] is the key
// of the block at tb[64*i:], and the last key is returned. Each block is
// 72 bytes hashed (two 32-byte stripes, then one 8-byte tail), unrolled
// over a fixed-size array: no length checks, loop counters or slice
// arithmetic inside a block (the general code spends about a third of its
// instructions on those), and no call per block, which in Go would spill
// and reload the caller's loop state. Same function as Chain (tested).
func chain16(parent uint64, tb []byte, out []uint64) uint64 {
	le := binary.LittleEndian
	p1, p2 := prime1, prime2
	for i := range out {
		b := (*[4 * DefaultBlockSize]byte)(tb[i*4*DefaultBlockSize:])
		v1 := round(p1+p2, parent)
		v2 := round(p2, le.Uint64(b[0:8]))
		v3 := round(0, le.Uint64(b[8:16]))
		v4 := round(-p1, le.Uint64(b[16:24]))
		v1 = round(v1, le.Uint64(b[24:32]))
		v2 = round(v2, le.Uint64(b[32:40]))
		v3 = round(v3, le.Uint64(b[40:48]))
		v4 = round(v4, le.Uint64(b[48:56]))
		h := bits.RotateLeft64(v1, 1) + bits.RotateLeft64(v2, 7) + bits.RotateLeft64(v3, 12) + bits.RotateLeft64(v4, 18)
		h = mergeRound(h, v1)
		h = mergeRound(h, v2)
		h = mergeRound(h, v3)
		h = mergeRound(h, v4)
		h += 8 + 4*DefaultBlockSize
		h ^= round(0, le.Uint64(b[56:64]))
		h = bits.RotateLeft64(h, 27)*prime1 + prime4
		h = avalanche(h)
		out[i] = h
		parent = h
	}
	return parent
}

// ChainInto writes the keys of the first len(out) blocks of tokens,
// chained from parent, to out, and returns the last key (parent when out
// is empty). It is AppendKeys' loop for callers that start mid-prompt or
// interleave hashing with other work; tokens must hold len(out) full
// blocks.
func ChainInto(parent uint64, tokens []int32, blockSize int, out []uint64) uint64 {
	if len(out) == 0 {
		return parent
	}
	tokens = tokens[:len(out)*blockSize]
	if littleEndian && blockSize == DefaultBlockSize {
		return chain16(parent, tokenBytes(tokens), out)
	}
	for i := range out {
		parent = Chain(parent, tokens[i*blockSize:(i+1)*blockSize])
		out[i] = parent
	}
	return parent
}

// tokenBytes views tokens as their in-memory bytes (little-endian hosts
// only; callers check littleEndian).
func tokenBytes(tokens []int32) []byte {
	if len(tokens) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), 4*len(tokens))
}
