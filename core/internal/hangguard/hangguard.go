// Package hangguard bounds test calls that must return however loaded the
// machine is: a hang fails the test, a slow return does not. It is for
// tests only (nothing the library links imports it).
package hangguard

import (
	"testing"
	"time"
)

// Limit is how long a guarded call may take before the test fails. It is
// never the property under test.
const Limit = 30 * time.Second

// MustReturn runs f and fails the test if it has not returned within Limit.
func MustReturn(t testing.TB, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(Limit):
		t.Fatalf("%s did not return within %v", what, Limit)
	}
}
