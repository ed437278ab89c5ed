//go:build !kvrdebug

package collector

// debugPanic is a no-op outside the kvrdebug test build.
func debugPanic(int) {}
