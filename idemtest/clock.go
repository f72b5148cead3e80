package idemtest

import (
	"sync"
	"time"
)

// Clock is a fake clock whose Now method plugs into a store's Now option
// (pebblestore.Options.Now, MemOptions.Now): time moves only when the test calls
// Advance, so leases and expiry can be crossed without sleeping. The zero
// value is not usable; use NewClock. A Clock is safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time // guarded by mu
}

// NewClock returns a clock stopped at a fixed, arbitrary instant.
func NewClock() *Clock {
	return &Clock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d; a negative d steps it back, as a
// wrong clock being put right does.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
