// Package blockhash cuts token sequences into fixed-size blocks and derives
// chained 64-bit block keys.
//
// Key i of a prompt is xxhash64 over (key i-1 as 8 little-endian bytes, the
// block's token ids as 4-byte little-endian integers). Key -1, the root, is
// derived from a namespace (model, LoRA adapter, weight-version salt) and the
// block size, so keys of different namespaces or block sizes never meet in one
// index. Only full blocks are keyed: a partial tail block is never reusable in
// vLLM's prefix cache either.
//
// These keys are the router's own key space. They do not try to reproduce
// vLLM's block hashes (which depend on PYTHONHASHSEED, the hash algorithm and
// the vLLM version); the index bridges engine hashes to these keys instead.
package blockhash

import (
	"encoding/binary"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// DefaultBlockSize is vLLM's default block size on CUDA.
const DefaultBlockSize = 16

// stackBlockBytes bounds the block size hashed from a stack buffer in one
// xxhash call; larger blocks are streamed through a Digest.
const stackBlockBytes = 8 + 4*128

// Namespace derives a namespace seed from its parts (for example the model
// name, a LoRA adapter name and a weight-version salt). Empty parts still
// count, so ("a", "") and ("a") differ from ("", "a").
func Namespace(parts ...string) uint64 {
	d := xxhash.New()
	var sep = []byte{0xff}
	for _, p := range parts {
		_, _ = d.WriteString(p)
		_, _ = d.Write(sep)
	}
	return d.Sum64()
}

// Root returns key -1 for a namespace and block size: the parent of block 0.
func Root(namespace uint64, blockSize int) uint64 {
	var b [24]byte
	binary.LittleEndian.PutUint64(b[0:], namespace)
	binary.LittleEndian.PutUint64(b[8:], uint64(blockSize))
	copy(b[16:], "kvcroot!")
	return xxhash.Sum64(b[:])
}

// chainPortable is Chain for big-endian hosts: the tokens are serialised
// little-endian before hashing.
func chainPortable(parent uint64, block []int32) uint64 {
	n := 8 + 4*len(block)
	if n <= stackBlockBytes {
		var buf [stackBlockBytes]byte
		binary.LittleEndian.PutUint64(buf[0:], parent)
		putTokens(buf[8:], block)
		return xxhash.Sum64(buf[:n])
	}
	var d xxhash.Digest
	d.Reset()
	var buf [stackBlockBytes]byte
	binary.LittleEndian.PutUint64(buf[0:], parent)
	off := 8
	for _, t := range block {
		if off+4 > len(buf) {
			_, _ = d.Write(buf[:off])
			off = 0
		}
		binary.LittleEndian.PutUint32(buf[off:], uint32(t))
		off += 4
	}
	_, _ = d.Write(buf[:off])
	return d.Sum64()
}

// FullBlocks returns how many full blocks of blockSize tokens n tokens hold.
func FullBlocks(n, blockSize int) int {
	if blockSize <= 0 || n <= 0 {
		return 0
	}
	return n / blockSize
}

// HittableBlocks returns how many leading blocks of an n-token prompt an
// engine can serve from cache: vLLM always recomputes at least one token, so
// a prompt of exactly k blocks can hit at most k-1 of them.
func HittableBlocks(n, blockSize int) int {
	if blockSize <= 0 || n <= 1 {
		return 0
	}
	return (n - 1) / blockSize
}

// AppendKeys appends the keys of every full block of tokens to dst and
// returns the extended slice. It allocates only when dst lacks capacity.
func AppendKeys(dst []uint64, tokens []int32, blockSize int, namespace uint64) []uint64 {
	nb := FullBlocks(len(tokens), blockSize)
	if nb == 0 {
		return dst
	}
	parent := Root(namespace, blockSize)
	if littleEndian {
		dst = slices.Grow(dst, nb)
		ChainInto(parent, tokens, blockSize, dst[len(dst):len(dst)+nb])
		return dst[:len(dst)+nb]
	}
	n := 8 + 4*blockSize
	if n > stackBlockBytes {
		for i := 0; i < nb; i++ {
			parent = Chain(parent, tokens[i*blockSize:(i+1)*blockSize])
			dst = append(dst, parent)
		}
		return dst
	}
	// One buffer for the whole prompt: zeroing a fresh one per block
	// would cost as much as hashing it.
	var buf [stackBlockBytes]byte
	b := buf[:n]
	for i := 0; i < nb; i++ {
		binary.LittleEndian.PutUint64(b, parent)
		putTokens(b[8:], tokens[i*blockSize:(i+1)*blockSize])
		parent = xxhash.Sum64(b)
		dst = append(dst, parent)
	}
	return dst
}

// Keys returns the keys of every full block of tokens.
func Keys(tokens []int32, blockSize int, namespace uint64) []uint64 {
	return AppendKeys(make([]uint64, 0, FullBlocks(len(tokens), blockSize)), tokens, blockSize, namespace)
}
