// Package idemtest opens idem databases for tests: in memory, on a
// crashable filesystem, and with a fake clock.
package idemtest

import (
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
)

// Clock is a fake clock for Options.Now. The zero value is not usable; use
// NewClock. It is safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
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

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// Open opens a DB on a fresh in-memory filesystem with a fake clock and no
// background loop, and closes it when the test ends. opts may be nil; its
// FS, Now and SweepInterval are filled in when unset.
func Open(t testing.TB, opts *idem.Options) (*idem.DB, *Clock) {
	t.Helper()
	var o idem.Options
	if opts != nil {
		o = *opts
	}
	if o.FS == nil {
		o.FS = vfs.NewMem()
	}
	clock := NewClock()
	if o.Now == nil {
		o.Now = clock.Now
	}
	if o.SweepInterval == 0 {
		o.SweepInterval = -1
	}
	db, err := idem.Open("db", &o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db, clock
}
