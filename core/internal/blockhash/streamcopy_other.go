//go:build !amd64

package blockhash

import "unsafe"

func streamCopy(dst, src unsafe.Pointer, n int) {
	copy(unsafe.Slice((*byte)(dst), n), unsafe.Slice((*byte)(src), n))
}

const haveStreamCopy = false
