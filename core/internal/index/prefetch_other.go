//go:build !amd64 && !arm64

package index

import "unsafe"

// prefetch is a no-op where no assembly version exists.
func prefetch(unsafe.Pointer) {}
