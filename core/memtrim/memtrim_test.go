package memtrim

import (
	"testing"
	"time"
)

func waitTrims(t *testing.T, want uint64, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for Snapshot().Trims < want && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := Snapshot().Trims; got != want {
		t.Fatalf("trims %d, want %d", got, want)
	}
}

// Small inputs never trim; a burst of large ones trims once; a second
// burst within MinInterval waits for it.
func TestNoteArmsOneTrimPerInterval(t *testing.T) {
	Configure(1000, 20*time.Millisecond, 300*time.Millisecond)
	defer Configure(DefaultThreshold, DefaultDelay, DefaultMinInterval)
	s0 := Snapshot()
	for i := 0; i < 100; i++ {
		Note(999)
	}
	time.Sleep(60 * time.Millisecond)
	if s := Snapshot(); s != s0 {
		t.Fatalf("small inputs counted: %+v -> %+v", s0, s)
	}
	for i := 0; i < 50; i++ {
		Note(1000)
	}
	waitTrims(t, s0.Trims+1, 2*time.Second)
	t1 := time.Now()
	time.Sleep(60 * time.Millisecond)
	if got := Snapshot(); got.Trims != s0.Trims+1 || got.LargeInputs != s0.LargeInputs+50 {
		t.Fatalf("burst: %+v (from %+v)", got, s0)
	}
	Note(5000) // within the interval: deferred, not dropped
	waitTrims(t, s0.Trims+2, 2*time.Second)
	if d := time.Since(t1); d < 200*time.Millisecond {
		t.Fatalf("second trim after %v, before MinInterval", d)
	}
}
