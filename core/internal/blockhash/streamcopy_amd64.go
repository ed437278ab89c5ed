package blockhash

import "unsafe"

// streamCopy copies n bytes, a multiple of 64, to a 16-byte aligned dst
// with non-temporal stores: the data goes to memory without first reading
// the destination's lines into the cache or evicting anything for them.
//
//go:noescape
func streamCopy(dst, src unsafe.Pointer, n int)

const haveStreamCopy = true
