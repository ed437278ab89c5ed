package clock

import (
	"testing"
	"time"
)

func TestFakeRunsDueFunctionsInOrder(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	cases := []struct {
		name    string
		advance []time.Duration
		want    string
	}{
		{"nothing due", []time.Duration{9 * time.Millisecond}, ""},
		{"exactly due", []time.Duration{10 * time.Millisecond}, "a"},
		{"in steps", []time.Duration{10 * time.Millisecond, 10 * time.Millisecond}, "ab"},
		{"all at once, in time order, chained", []time.Duration{time.Second}, "abc"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := NewFake(start)
			got := ""
			c.AfterFunc(20*time.Millisecond, func() {
				got += "b"
				if d := c.Now().Sub(start); d != 20*time.Millisecond {
					t.Errorf("b ran reading %v", d)
				}
				c.AfterFunc(5*time.Millisecond, func() { got += "c" })
			})
			c.AfterFunc(10*time.Millisecond, func() { got += "a" })
			stopped := c.AfterFunc(15*time.Millisecond, func() { got += "x" })
			if !stopped.Stop() || stopped.Stop() {
				t.Fatal("Stop: want true once, then false")
			}
			var total time.Duration
			for _, d := range tc.advance {
				c.Advance(d)
				total += d
			}
			if got != tc.want {
				t.Fatalf("ran %q, want %q", got, tc.want)
			}
			if c.Now() != start.Add(total) {
				t.Fatalf("now %v, want %v", c.Now(), start.Add(total))
			}
		})
	}
}

func TestRealClock(t *testing.T) {
	var c Clock = Real{}
	done := make(chan struct{})
	c.AfterFunc(0, func() { close(done) })
	<-done
	if c.Now().IsZero() {
		t.Fatal("zero time")
	}
}
