// Package idemtest opens idem databases for tests, in memory and on the
// fake clock of the public idemtest package, and sends HTTP requests to
// the servers under test.
package idemtest

import (
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"

	"github.com/idemkv/idem"
	"github.com/idemkv/idem/idemtest"
)

// Open opens a DB on a fresh in-memory filesystem with a fake clock and no
// background loop, and closes it when the test ends. opts may be nil; its
// FS, Now and SweepInterval are filled in when unset.
func Open(t testing.TB, opts *idem.Options) (*idem.DB, *idemtest.Clock) {
	t.Helper()
	var o idem.Options
	if opts != nil {
		o = *opts
	}
	if o.FS == nil {
		o.FS = vfs.NewMem()
	}
	clock := idemtest.NewClock()
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
