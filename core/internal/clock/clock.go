// Package clock is the time source of product types that schedule work:
// Real in production, Fake in tests, which advance it themselves instead of
// sleeping and hoping a timer has fired.
package clock

import (
	"sort"
	"sync"
	"time"
)

// Clock reads the time and schedules a function.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine (Real) or inside Advance
	// (Fake) once d has passed.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a scheduled call; Stop cancels it if it has not run.
type Timer interface {
	Stop() bool
}

// Real is the system clock.
type Real struct{}

// Now implements Clock.
func (Real) Now() time.Time { return time.Now() }

// AfterFunc implements Clock.
func (Real) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// Fake is a clock that moves only when Advance is called. Safe for
// concurrent use; scheduled functions run in Advance's goroutine, without
// the clock's lock held (they may use the clock).
type Fake struct {
	mu    sync.Mutex
	now   time.Time
	seq   int
	timer []*fakeTimer
}

type fakeTimer struct {
	c   *Fake
	at  time.Time
	seq int
	f   func()
}

// NewFake returns a Fake reading start.
func NewFake(start time.Time) *Fake { return &Fake{now: start} }

// Now implements Clock.
func (c *Fake) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc implements Clock: f runs in the Advance that reaches now+d.
func (c *Fake) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &fakeTimer{c: c, at: c.now.Add(d), seq: c.seq, f: f}
	c.timer = append(c.timer, t)
	return t
}

// Pending counts scheduled functions that have not run.
func (c *Fake) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timer)
}

// Advance moves the clock by d, running every function that falls due, in
// the order of their times (then of scheduling), each with the clock
// reading its due time; a function scheduled by one of them that falls
// due within d runs too.
func (c *Fake) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	for {
		sort.SliceStable(c.timer, func(i, j int) bool {
			if !c.timer[i].at.Equal(c.timer[j].at) {
				return c.timer[i].at.Before(c.timer[j].at)
			}
			return c.timer[i].seq < c.timer[j].seq
		})
		if len(c.timer) == 0 || c.timer[0].at.After(end) {
			break
		}
		t := c.timer[0]
		c.timer = c.timer[1:]
		if t.at.After(c.now) {
			c.now = t.at
		}
		c.mu.Unlock()
		t.f()
		c.mu.Lock()
	}
	c.now = end
	c.mu.Unlock()
}

// Stop implements Timer.
func (t *fakeTimer) Stop() bool {
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, o := range c.timer {
		if o == t {
			c.timer = append(c.timer[:i], c.timer[i+1:]...)
			return true
		}
	}
	return false
}
